"""Hunyuan V4 with its MTP layer (``HYV4ForCausalLMNextN``) for EAGLE speculative decoding (issue 34): the
embedded tiny_hyv4 (3 layers, the last shared-index, learnable attention sinks, one NextN layer) served ESS on
== ESS off on the CPU ``ess`` backend: greedy tokens, log-probs (within 2 fp32 ulps: its fp32 lm_head, as in
test_hyv4_exactness) and the speculation counters, 6 concurrent clients on 4 request rows (rows reused),
contexts several times the hot buffer; both stores (target: 3 layers, draft: its one NextN layer) back to zero
without a flush. Every token after the first comes out of a verify step, so the sinks are in the verify path
(each layer's union of draft top-k sets, its misses read from the host; the kernel's sink math against the
model's definition: tests/unit/attention/test_sinks.py), and the draft's own layer has one too.

The launcher shapes the embedded MTP layer (sgl_ess/models/mtp_init.py) through a hook on
HYV4ForCausalLMNextN.post_load_weights too (targets.HYV4_NEXTN_POST_LOAD: that class has its own, which does
not reach DeepseekV3ForCausalLMNextN's), but on tiny_hyv4 the shaped draft is still never accepted (accept
rate 0.00 in the log, run here at 07:09), so the equal speculation counters are all-rejected ones; accepted
drafts are compared on GLM (test_glm52_mtp, test_glm5_mtp). With --speculative-algorithm the store keeps one LRU per layer and the log says so at
start. One pair of servers, started together."""

import numpy as np
import pytest

from sgl_ess.models import TINY_HYV4_DIR

from ._family_servers import assert_equal_outputs, assert_mtp_stores, serve_mtp
from ._server import ess_usage_zero
from .test_exactness import NEW_TOKENS

pytestmark = pytest.mark.integration

LAYERS, ROW_BYTES = 3, (64 + 16) * 2      # tiny_hyv4: num_hidden_layers, (kv_lora_rank + rope) x bf16
WARNING = ("ESS: HYV4ForCausalLM with --speculative-algorithm: shared-index layers keep their own LRU and plan "
           "their fetch inside attention")


def _within_2_ulps(x: float, y: float) -> bool:
    """HYV4's fp32 lm_head: the last bits of an fp32 matmul row depend on its batch's row count, which differs
    between the two servers with 6 clients on 4 rows (test_hyv4_exactness)."""
    return abs(x - y) <= 2 * float(np.spacing(np.float32(max(abs(x), abs(y)))))


@pytest.fixture(scope="module")
def hyv4_mtp():
    return serve_mtp(TINY_HYV4_DIR, LAYERS, ROW_BYTES, prefix="hyv4_mtp_")


def test_hyv4_mtp_ess_on_equals_off(hyv4_mtp):
    on, off = hyv4_mtp["on"], hyv4_mtp["off"]
    assert_equal_outputs(on, off, "first", NEW_TOKENS, _within_2_ulps)
    # every output token after the first came out of a verify step (EAGLE: one per step at least)
    assert all(0 < r["spec_verify_ct"] <= NEW_TOKENS for r in on["spec"]["first"]), on["spec"]


def test_hyv4_mtp_keeps_a_lru_per_layer_and_says_so(hyv4_mtp):
    assert_mtp_stores(hyv4_mtp["on"], hyv4_mtp["off"], LAYERS, WARNING)


def test_hyv4_mtp_stores_back_to_zero_without_a_flush(hyv4_mtp):
    u = hyv4_mtp["on"]["after"]
    assert ess_usage_zero(u) and ess_usage_zero(u["draft"][0]), u
