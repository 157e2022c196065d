"""GLM-5.2 / 5.3 shared-index layers (issue 34 item 3): the embedded tiny_glm52 (GlmMoeDsaForCausalLM,
5 layers, indexer_types full / shared / shared / full / shared: anchors 0 and 3) served ESS on == ESS off
(greedy tokens and log-probs, 6 concurrent clients on 4 request rows, so rows are reused, contexts
several times the hot buffer), with the group design: each group's LRU is resolved once per step at its
anchor and every shared-index layer's fetch is planned there, before the layer starts. One pair of
servers for the module, started together.

On this CPU the prefetch engine is inline (synchronous: overlap level runs as 'none'), so the anchors
plan inside their own attention (late) and their shared-index layers are planned then (early for them);
with an indexer hand-off (CUDA's stream engine) the anchors plan early too."""

import pytest

from sgl_ess.models import TINY_GLM52_DIR

from ._family_servers import serve_on_and_off
from .conftest import HOT_SLOTS
from .test_exactness import NEW_TOKENS

pytestmark = pytest.mark.integration

LAYERS, ROW_BYTES = 5, (64 + 16) * 2      # tiny_glm52: num_hidden_layers, (kv_lora_rank + rope) x bf16
ANCHORS, SHARED = [0, 3], [1, 2, 4]


@pytest.fixture(scope="module")
def glm52():
    # one batch: 6 clients on 4 rows, so rows are reused within the batch
    return serve_on_and_off(TINY_GLM52_DIR, LAYERS, ROW_BYTES, prefix="glm52_", batches=("first",))


def test_glm52_ess_on_equals_off(glm52):
    on, off = glm52["on"], glm52["off"]
    assert on["usage"]["rows_h2d"] > on["before"]["rows_h2d"], "ESS on fetched nothing: the store was not used"
    assert on["prompt_tokens"] >= 5 * HOT_SLOTS
    assert len(on["first"]) == len(off["first"]) == 6
    for i, (a, b) in enumerate(zip(on["first"], off["first"])):
        assert len(a) == NEW_TOKENS
        assert [t for t, _ in a] == [t for t, _ in b], f"request {i}: tokens differ ESS on vs off"
        assert [lp for _, lp in a] == [lp for _, lp in b], f"request {i}: log-probs differ"
    assert len({t for t, _ in on["first"][0]}) > 4
    assert "Traceback" not in on["log"] and "Traceback" not in off["log"]


def test_glm52_shared_layers_planned_at_their_anchor(glm52):
    u = glm52["on"]["usage"]
    early, late = u["plans_early_by_layer"], u["plans_late_by_layer"]
    assert len(early) == 5 and len(late) == 5, u
    for layer in SHARED:          # planned at the anchor, before the layer starts: never inside its attention
        assert late[layer] == 0 and early[layer] > 0, (layer, early, late)
    for layer in ANCHORS:
        assert early[layer] + late[layer] > 0, (layer, early, late)
    # one resolver call per anchor plan: the shared-index layers resolve nothing of their own
    assert u["resolver_calls"] == sum(early[a] + late[a] for a in ANCHORS), u
    # every layer of a group ran the same number of plans (the group's, at its anchor)
    assert early[1] == early[2] == early[0] + late[0] and early[4] == early[3] + late[3], (early, late)
    # per layer the same hits and misses within a group (one table, the same top-k)
    hits, misses = u["hits_per_layer"], u["misses_per_layer"]
    assert hits[0] == hits[1] == hits[2] and hits[3] == hits[4], hits
    assert misses[0] == misses[1] == misses[2] and misses[3] == misses[4] and sum(misses) > 0, misses


def test_glm52_live_rows_back_to_zero_without_a_flush(glm52):
    u = glm52["on"]["after"]
    assert u["host_tokens_used"] == 0 and u["hot_slots_used"] == 0 and u["hot_requests_open"] == 0, u
