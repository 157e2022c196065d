"""The structured op model: hand-computed costs, the efficiency curve over M, and what scales with what."""
import math

import numpy as np
import pytest

from sgl_ess.sim.config import ModelSpec, load_data
from sgl_ess.sim.costs import blend_us
from sgl_ess.sim.hardware import get_hardware
from sgl_ess.sim.ops import OpCost, attention_ops, ffn_ops, gemm, moe_pairs
from sgl_ess.sim.profile import OpProfile
from sgl_ess.sim.profile_build import _indexer_rows, attention_rate, derive, fit_gemm, fit_indexer

M = ModelSpec.load()
H200 = get_hardware("h200")
COSTS = OpProfile.load().cost_model(H200)


def _op(ops, name):
    return next(o for o in ops if o.name == name)


def test_blend_hand_case():
    assert blend_us(3e-6, 4e-6, 2.0) == pytest.approx(5.0)       # 3-4-5
    assert blend_us(3e-6, 4e-6, 1.0) == pytest.approx(7.0)
    assert blend_us(0.0, 4e-6, 2.0) == pytest.approx(4.0)


def test_gemm_hand_case():
    op = gemm("x", "ffn", 64, 7168, 2048)
    flops = 2 * 64 * 7168 * 2048
    bytes_ = 7168 * 2048 + 64 * 2048 + 64 * 7168 * 2
    assert op.flops == flops and op.hbm_bytes == bytes_
    tc = flops / (H200.fp8_flops_per_s * COSTS.e_c)
    tm = bytes_ / (H200.hbm_bytes_per_s * COSTS.e_m)
    assert COSTS.time_us(op, 32) == pytest.approx(blend_us(tc, tm, COSTS.p))


def test_gemm_m_is_padded_to_the_tile_for_compute():
    from dataclasses import replace
    b = gemm("x", "ffn", 64, 4096, 7168)
    a = replace(gemm("x", "ffn", 1, 4096, 7168), hbm_bytes=b.hbm_bytes)   # same bytes, M = 1 pads to 64
    c = replace(gemm("x", "ffn", 65, 4096, 7168), hbm_bytes=b.hbm_bytes)  # M = 65 pads to 128
    assert COSTS.gemm_us(a) == COSTS.gemm_us(b) < COSTS.gemm_us(c)


def test_gemm_efficiency_curve_over_m():
    ms = [1, 16, 64, 128, 256, 512, 1024, 4096, 16384]
    times = [COSTS.gemm_us(gemm("x", "ffn", m, 7168, 16384)) for m in ms]
    achieved = [2 * m * 7168 * 16384 / (t * 1e-6) for m, t in zip(ms, times)]
    assert times == sorted(times)                                   # more rows never take less time
    assert achieved == sorted(achieved)                             # efficiency rises with M ...
    assert achieved[-1] <= H200.fp8_flops_per_s * COSTS.e_c         # ... and saturates below the peak share
    # small M is memory-bound: time within the blend's factor of reading the weights once
    small = times[0] * 1e-6 * H200.hbm_bytes_per_s * COSTS.e_m
    assert 7168 * 16384 <= small < 1.05 * 7168 * 16384 * 2 ** (1 / COSTS.p)


def test_indexer_grows_linearly_with_context_and_attention_is_fixed_by_k():
    a = attention_ops(M, 26, 2, 32768)
    b = attention_ops(M, 26, 2, 65536)
    ia, ib = _op(a, "indexer.score"), _op(b, "indexer.score")
    assert COSTS.time_us(ib, 32) == pytest.approx(2 * COSTS.time_us(ia, 32))
    # top-k of 52 rows is one call's latency, which grows with the row length only
    assert COSTS.time_us(_op(b, "indexer.topk"), 32) > COSTS.time_us(_op(a, "indexer.topk"), 32)
    assert COSTS.time_us(_op(a, "attention.sparse"), 32) == COSTS.time_us(_op(b, "attention.sparse"), 32)
    # below k the attention reads the whole (shorter) context
    short = _op(attention_ops(M, 26, 2, 1024), "attention.sparse")
    assert COSTS.time_us(short, 32) < COSTS.time_us(_op(a, "attention.sparse"), 32)


def test_moe_tokens_per_expert_under_ep():
    tokens = 52
    for ep in (8, 32, 64):
        up = _op(ffn_ops(M, tokens, False, ep), "moe.experts_up")
        local = math.ceil(256 / ep)
        assert up.groups == local and up.x == moe_pairs(M, tokens) == tokens * 8
        assert up.m == pytest.approx(tokens * 8 / local)
        assert up.flops == pytest.approx(2 * tokens * 8 * 2 * 2048 * 7168)
    # fewer local experts (more EP) read fewer weights: faster at the same tokens
    t8 = COSTS.time_us(_op(ffn_ops(M, tokens, False, 8), "moe.experts_up"), 8)
    t64 = COSTS.time_us(_op(ffn_ops(M, tokens, False, 64), "moe.experts_up"), 64)
    assert t64 < t8


def test_all_to_all_hand_case_and_floor():
    ops = ffn_ops(M, 128, False, 32)
    d, c = _op(ops, "moe.dispatch"), _op(ops, "moe.combine")
    assert d.net_bytes == 128 * 8 * (7168 + 56 * 4) and c.net_bytes == 128 * 8 * 7168 * 2
    assert COSTS.time_us(d, 32) == pytest.approx(d.net_bytes / 48e9 * 1e6)      # DeepEP EP 32: 48 GB/s
    assert COSTS.time_us(c, 32) == pytest.approx(c.net_bytes / 53e9 * 1e6)      # 53 GB/s
    tiny = _op(ffn_ops(M, 1, False, 32), "moe.dispatch")
    assert COSTS.time_us(tiny, 32) == COSTS.comm_floor_us
    assert not [o for o in ffn_ops(M, 128, False, 1) if o.phase == "comm"]     # EP 1: nothing to send


def test_nic_and_gpu_scaling():
    a100 = OpProfile.load().cost_model(get_hardware("a100"))                 # CX-6: half the NIC rate
    d = _op(ffn_ops(M, 128, False, 32), "moe.dispatch")
    assert a100.time_us(d, 32) == pytest.approx(2 * COSTS.time_us(d, 32))
    assert a100.attention_flops_per_s == pytest.approx(COSTS.attention_flops_per_s * 312 / 989)


def test_derived_attention_rate_reproduces_the_published_figure_on_h800():
    pub = load_data("published_kernels.json")
    g = fit_gemm(pub)
    rate, _ = attention_rate(pub, g["e_m"], g["p"])
    f = pub["flashmla_sparse_decode"]
    tokens = f["batch"] * f["s_q"]
    flops = 2 * tokens * 128 * 1088 * 2048
    t = blend_us(flops / (rate * 1e12), tokens * 2048 * 656 / (3350e9 * g["e_m"]), g["p"])
    assert flops / (t * 1e-6) / 1e12 == pytest.approx(410, rel=1e-9)


def test_gemm_fit_is_least_squares_on_the_grid():
    pub = load_data("published_kernels.json")
    g = fit_gemm(pub)
    rows = pub["deepgemm_fp8_gemm"]["rows"]
    assert g["rows"] == len(rows) == 28

    def sse(e_c, e_m):
        err = []
        for _, grp, m, n, k, tf, _gb in rows:
            flops = 2 * grp * m * n * k
            t = blend_us(flops / (1979e12 * e_c), grp * (m * k + n * k + 2 * m * n) / (3350e9 * e_m), g["p"])
            err.append(np.log(t / (flops / (tf * 1e12) * 1e6)))
        return float(np.dot(err, err))
    best = sse(g["e_c"], g["e_m"])
    for dc, dm in ((0.01, 0), (-0.01, 0), (0, 0.01), (0, -0.01)):
        assert sse(g["e_c"] + dc, g["e_m"] + dm) >= best


def test_indexer_fit_is_what_the_cost_model_uses():
    # the profile's indexer constants, priced by the cost model on each published H200 decode shape
    # (next_n = 1), plus the per-call latency fitted alongside, give the builder's recorded model times
    pub = load_data("published_kernels.json")
    ix = fit_indexer(pub)
    assert ix["rows"] == len(pub["sglang_h200_indexer_stages"]["decode_rows"]) == 12
    assert COSTS.indexer_p == ix["p"] and COSTS.indexer_hbm == pytest.approx(4.8e12 * ix["e_m"])
    for rows, ctx, published_us, model_us, resid in ix["residual_pct"]:
        op = _op(attention_ops(M, rows, 1, ctx), "indexer.score")
        assert COSTS.time_us(op, 32) + ix["latency_us"] == pytest.approx(model_us, abs=0.051)
        # model_us is rounded to 0.1 us and resid to 0.1 %: allow exactly that rounding
        assert resid == pytest.approx(100 * (model_us / published_us - 1), abs=100 * 0.05 / published_us + 0.05)
    # least squares on the grid: a neighbouring efficiency fits no better
    _, flops, bytes_, t_pub = _indexer_rows(pub)

    def sse(e_m):
        core = 1e6 * ((flops / 1144e12) ** ix["p"] + (bytes_ / (4.8e12 * e_m)) ** ix["p"]) ** (1 / ix["p"])
        err = np.log((ix["latency_us"] + core) / t_pub)
        return float(err @ err)
    assert sse(ix["e_m"]) <= min(sse(ix["e_m"] + 0.01), sse(ix["e_m"] - 0.01))


def test_shipped_profile_is_what_the_builder_makes():
    import json
    from sgl_ess.sim.profile_build import render, shipped_path
    assert shipped_path().read_text() == render(derive())
    assert json.loads(render(derive()))["name"] == "h200_published"


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="kind"):
        COSTS.time_us(OpCost("x", "ffn", "warp", 1, "tokens"), 32)


def test_topk_by_hand_from_the_published_h200_figures():
    # latency table (us): 4096 -> 13, 16384 -> 17, 65536 -> 39; rate (1e9 logits/s): 8192 -> 282.0, 16384 -> 250.9
    assert COSTS.topk_us(64, 16384) == pytest.approx(17.0)                       # a published decode point
    assert COSTS.topk_us(1, 10240) == pytest.approx(13.0 + 4.0 * (10240 - 4096) / (16384 - 4096))   # interpolated
    assert COSTS.topk_us(64, 131072) == pytest.approx(39.0 + 22.0 / 49152 * 65536)   # extended along the last segment
    # many rows: the element rate binds (8,192 rows at 8K is the published prefill call: 238 us)
    assert COSTS.topk_us(8192, 8192) == pytest.approx(8192 * 8192 / 282.0e9 * 1e6)
    assert COSTS.topk_us(8192, 8192) == pytest.approx(238.0, rel=0.001)
    # the switch from latency to rate: time never falls with more rows
    times = [COSTS.topk_us(r, 32768) for r in (1, 64, 128, 256, 512, 1024, 4096)]
    assert times == sorted(times) and times[0] == times[1] < times[-1]
    assert COSTS.topk_us(0, 32768) == 0.0
