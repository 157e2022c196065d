"""GLM-5.2 / 5.3 shared-index layers with their MTP layer (GLM's NextN, ``GlmMoeDsaForCausalLMNextN``) for
EAGLE speculative decoding (issue 34): the embedded tiny_glm52 (5 layers, indexer_types full / shared / shared /
full / shared, one NextN layer) served ESS on == ESS off on the CPU ``ess`` backend: greedy tokens, log-probs
and the speculation itself (verify steps, accepted drafts), 6 concurrent clients on 4 request rows (rows
reused), contexts several times the hot buffer; both stores (target: 5 layers, draft: its one NextN layer)
back to zero without a flush.

With --speculative-algorithm a shared-index model's store keeps one LRU per layer (pools/pool_adapter.
store_anchors: MTP verify admits rows layer by layer), so its shared-index layers plan their fetch inside
attention, and the start-up log says so at WARNING. The grouped design without speculation:
test_glm52_shared_index.py. One pair of servers for the module, started together."""

import pytest

from sgl_ess.models import TINY_GLM52_DIR

from ._family_servers import assert_equal_outputs, assert_mtp_stores, serve_mtp
from ._server import ess_usage_zero
from .test_exactness import NEW_TOKENS

pytestmark = pytest.mark.integration

LAYERS, ROW_BYTES = 5, (64 + 16) * 2      # tiny_glm52: num_hidden_layers, (kv_lora_rank + rope) x bf16
# logged once per process at WARNING (its level is checked in-process: test_glm52_gpu_fake; the server's log
# lines carry no level)
WARNING = ("ESS: GlmMoeDsaForCausalLM with --speculative-algorithm: shared-index layers keep their own LRU and plan "
           "their fetch inside attention")


@pytest.fixture(scope="module")
def glm52_mtp():
    return serve_mtp(TINY_GLM52_DIR, LAYERS, ROW_BYTES, prefix="glm52_mtp_")


def test_glm52_mtp_ess_on_equals_off(glm52_mtp):
    on, off = glm52_mtp["on"], glm52_mtp["off"]
    assert_equal_outputs(on, off, "first", NEW_TOKENS, lambda x, y: x == y)
    assert any(r["spec_num_correct_drafts"] > 0 for r in off["spec"]["first"]), "no draft token was ever accepted"


def test_glm52_mtp_keeps_a_lru_per_layer_and_says_so(glm52_mtp):
    assert_mtp_stores(glm52_mtp["on"], glm52_mtp["off"], LAYERS, WARNING)


def test_glm52_mtp_stores_back_to_zero_without_a_flush(glm52_mtp):
    u = glm52_mtp["on"]["after"]
    assert ess_usage_zero(u) and ess_usage_zero(u["draft"][0]), u
