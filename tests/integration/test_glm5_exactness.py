"""GLM-5 / 5.1 (``GlmMoeDsaForCausalLM``, the embedded tiny_glm5: 3 layers, GLM's head shapes, an
indexer on every layer) served ESS on == ESS off: greedy tokens and log-probs, 6 concurrent clients on
4 request rows (rows reused within a batch and by the second batch), contexts several times the hot
buffer, live host rows and hot buffers back to zero without a flush. The host pool is sized from a
GB budget, so its token count follows the model's own layer count (3, not the default model's 2):
the bytes the server allocated equal the launcher's plan. One pair of servers for the module."""

import pytest

from sgl_ess.models import TINY_GLM5_DIR

from ._family_servers import POOL_TOKENS, serve_on_and_off
from .conftest import HOT_SLOTS
from .test_exactness import NEW_TOKENS

pytestmark = pytest.mark.integration

LAYERS, ROW_BYTES = 3, (64 + 16) * 2      # tiny_glm5: num_hidden_layers, (kv_lora_rank + rope) x bf16


@pytest.fixture(scope="module")
def glm():
    return serve_on_and_off(TINY_GLM5_DIR, LAYERS, ROW_BYTES, prefix="glm5_")


def test_glm5_sizing_follows_its_layer_count(glm):
    st = glm["on"]["status"]
    sizing, s = st["pool_sizing"], st["schedulers"][0]
    assert sizing["model"]["layers"] == LAYERS and sizing["model"]["latent_row_bytes"] == ROW_BYTES, sizing
    assert sizing["tokens"] == POOL_TOKENS == s["host_tokens_capacity"], (sizing, s)
    assert s["host_bytes"] == sizing["host_bytes_expected"], (s, sizing)


def test_glm5_ess_on_equals_off(glm):
    on, off = glm["on"], glm["off"]
    assert on["fetched"] > 0, "ESS on served GLM without a host->device fetch: the store was not used"
    assert on["prompt_tokens"] >= 5 * HOT_SLOTS
    for when in ("first", "again"):
        for i, (a, b) in enumerate(zip(on[when], off[when])):
            assert len(a) == NEW_TOKENS
            assert [t for t, _ in a] == [t for t, _ in b], f"{when} batch, request {i}: tokens differ ESS on vs off"
            assert [lp for _, lp in a] == [lp for _, lp in b], f"{when} batch, request {i}: log-probs differ"
    assert len({t for t, _ in on["first"][0]}) > 4            # not a degenerate repetition
    assert "Traceback" not in on["log"] and "Traceback" not in off["log"]


def test_glm5_live_rows_back_to_zero_without_a_flush(glm):
    u = glm["on"]["after"]
    assert u["host_tokens_used"] == 0 and u["hot_slots_used"] == 0 and u["hot_requests_open"] == 0, u
