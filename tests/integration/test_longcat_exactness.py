"""LongCat-Flash with sparse attention (``LongcatFlashForCausalLM``, the embedded tiny_longcat: 2 decoder
layers of two MLA attention sub-layers each = 4 latent layers, cli_factor 2 so every second attention
layer reuses the previous one's top-k, zero experts off) served ESS on == ESS off: greedy tokens and
log-probs, 6 concurrent clients on 4 request rows (rows reused within a batch and by the second batch),
contexts several times the hot buffer, live host rows and hot buffers back to zero without a flush.

The host pool is sized from a GB budget for 4 latent layers: a launcher that counted num_hidden_layers
(2) would plan twice the tokens, and the pool SGLang builds (4 layers) would not match the plan.
The shared top-k layers (cli_factor 2: attention layers 1 and 3, by the ids SGLang gives the indexer,
2 x decoder layer + sub-layer) are planned at their anchor (0 and 2) with one LRU per group, as GLM-5.2's
(pools/pool_adapter.layer_anchors). One pair of servers for the module, started together."""

import pytest

from sgl_ess.models import families

from ._family_servers import POOL_TOKENS, serve_on_and_off
from .conftest import HOT_SLOTS
from .test_exactness import NEW_TOKENS

pytestmark = pytest.mark.integration

TINY_LONGCAT_DIR = families.__file__.rsplit("/", 1)[0] + "/tiny_longcat"
DECODER_LAYERS = 2                        # tiny_longcat: num_hidden_layers
LAYERS, ROW_BYTES = 2 * DECODER_LAYERS, (64 + 16) * 2     # two attention sub-layers each; (kv_lora_rank + rope) x bf16
ANCHORS, SHARED = (0, 2), (1, 3)          # cli_factor 2 over the attention layer ids


@pytest.fixture(scope="module")
def longcat():
    return serve_on_and_off(TINY_LONGCAT_DIR, LAYERS, ROW_BYTES, prefix="longcat_")


def test_longcat_sizing_counts_both_attention_sublayers(longcat):
    st = longcat["on"]["status"]
    sizing, s = st["pool_sizing"], st["schedulers"][0]
    assert sizing["model"]["layers"] == LAYERS and sizing["model"]["latent_row_bytes"] == ROW_BYTES, sizing
    assert sizing["tokens"] == POOL_TOKENS == s["host_tokens_capacity"], (sizing, s)
    assert s["host_bytes"] == sizing["host_bytes_expected"], (s, sizing)


def test_longcat_ess_on_equals_off(longcat):
    on, off = longcat["on"], longcat["off"]
    assert on["fetched"] > 0, "ESS on served LongCat without a host->device fetch: the store was not used"
    assert on["prompt_tokens"] >= 5 * HOT_SLOTS
    for when in ("first", "again"):
        for i, (a, b) in enumerate(zip(on[when], off[when])):
            assert len(a) == NEW_TOKENS
            assert [t for t, _ in a] == [t for t, _ in b], f"{when} batch, request {i}: tokens differ ESS on vs off"
            assert [lp for _, lp in a] == [lp for _, lp in b], f"{when} batch, request {i}: log-probs differ"
    assert len({t for t, _ in on["first"][0]}) > 4            # not a degenerate repetition
    assert "Traceback" not in on["log"] and "Traceback" not in off["log"]


def test_longcat_shared_layers_planned_at_their_anchor(longcat):
    """cli_factor 2: attention layers 1 and 3 reuse the top-k of 0 and 2; each pair is one group, resolved
    once per step at its anchor, the shared layer's fetch planned there (never inside its attention)."""
    u = longcat["on"]["usage"]
    early, late = u["plans_early_by_layer"], u["plans_late_by_layer"]
    assert len(early) == LAYERS and len(late) == LAYERS, u
    for layer in SHARED:
        assert late[layer] == 0 and early[layer] > 0, (layer, early, late)
    assert u["resolver_calls"] == sum(early[a] + late[a] for a in ANCHORS), u
    assert all(early[a + 1] == early[a] + late[a] for a in ANCHORS), (early, late)
    hits, misses = u["hits_per_layer"], u["misses_per_layer"]
    assert all(hits[a] == hits[a + 1] and misses[a] == misses[a + 1] for a in ANCHORS), (hits, misses)
    assert sum(misses) > 0, misses


def test_longcat_live_rows_back_to_zero_without_a_flush(longcat):
    u = longcat["on"]["after"]
    assert u["host_tokens_used"] == 0 and u["hot_slots_used"] == 0 and u["hot_requests_open"] == 0, u
