"""Hunyuan V4 (``HYV4ForCausalLM``, the embedded tiny_hyv4: 3 layers, the last a shared-index layer,
learnable attention sinks, the output gate, iHC streams) served ESS on == ESS off: greedy tokens and
log-probs, 6 concurrent clients on 4 request rows (rows reused within a batch and by the second batch),
contexts several times the hot buffer, live host rows and hot buffers back to zero without a flush.
Both servers run the ``ess`` backend (SGLang serves no other CPU backend for it), which reads each
layer's sink from the model; the sink math itself is checked against the model's definition in
tests/unit/attention/test_sinks.py. The random sinks are nonzero (launcher/dummy_init.py). One pair of
servers for the module, started together."""

import numpy as np
import pytest

from sgl_ess.models import TINY_HYV4_DIR

from ._family_servers import POOL_TOKENS, serve_on_and_off
from .conftest import HOT_SLOTS
from .test_exactness import NEW_TOKENS

pytestmark = pytest.mark.integration

LAYERS, ROW_BYTES = 3, (64 + 16) * 2      # tiny_hyv4: num_hidden_layers, (kv_lora_rank + rope) x bf16


@pytest.fixture(scope="module")
def hyv4():
    return serve_on_and_off(TINY_HYV4_DIR, LAYERS, ROW_BYTES, prefix="hyv4_")


def test_hyv4_sizing_follows_its_layer_count(hyv4):
    st = hyv4["on"]["status"]
    sizing, s = st["pool_sizing"], st["schedulers"][0]
    assert sizing["model"]["layers"] == LAYERS and sizing["model"]["latent_row_bytes"] == ROW_BYTES, sizing
    assert sizing["tokens"] == POOL_TOKENS == s["host_tokens_capacity"], (sizing, s)
    assert s["host_bytes"] == sizing["host_bytes_expected"], (s, sizing)


def test_hyv4_ess_on_equals_off(hyv4):
    on, off = hyv4["on"], hyv4["off"]
    assert on["fetched"] > 0, "ESS on served HYV4 without a host->device fetch: the store was not used"
    assert on["prompt_tokens"] >= 5 * HOT_SLOTS
    for when in ("first", "again"):
        for i, (a, b) in enumerate(zip(on[when], off[when])):
            assert len(a) == NEW_TOKENS
            assert [t for t, _ in a] == [t for t, _ in b], f"{when} batch, request {i}: tokens differ ESS on vs off"
            # HYV4 computes its logits in fp32 (enable_lm_head_fp32): the last bits of an fp32 matmul
            # row depend on how many rows its batch had, and with 6 clients on 4 rows the two servers batch
            # differently. Attention's outputs are bf16: a difference there would not stay within 2 fp32 ulps.
            for k, ((_, x), (_, y)) in enumerate(zip(a, b)):
                assert abs(x - y) <= 2 * float(np.spacing(np.float32(max(abs(x), abs(y))))), \
                    f"{when} batch, request {i}, token {k}: log-probs differ: {x} vs {y}"
    assert len({t for t, _ in on["first"][0]}) > 4            # not a degenerate repetition
    assert "Traceback" not in on["log"] and "Traceback" not in off["log"]


def test_hyv4_live_rows_back_to_zero_without_a_flush(hyv4):
    u = hyv4["on"]["after"]
    assert u["host_tokens_used"] == 0 and u["hot_slots_used"] == 0 and u["hot_requests_open"] == 0, u


def test_hyv4_shared_layer_planned_at_its_anchor(hyv4):
    """Layer 2 reuses layer 1's top-k (indexer_types full / full / shared): layers 1 and 2 are one group,
    resolved once per step at the anchor, layer 2's fetch planned there (never inside its attention),
    with the same hits and misses as its anchor's; layer 0 is a group of its own."""
    u = hyv4["on"]["usage"]
    early, late = u["plans_early_by_layer"], u["plans_late_by_layer"]
    assert len(early) == LAYERS and len(late) == LAYERS, u
    assert late[2] == 0 and early[2] > 0, (early, late)
    assert early[2] == early[1] + late[1], (early, late)
    assert u["resolver_calls"] == sum(early[a] + late[a] for a in (0, 1)), u
    hits, misses = u["hits_per_layer"], u["misses_per_layer"]
    assert hits[1] == hits[2] and misses[1] == misses[2], (hits, misses)
