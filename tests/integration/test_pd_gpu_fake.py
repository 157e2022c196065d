"""PD disaggregation through ESS's CUDA class (issue 32: the GPU-fake servers in an H200's default
configuration, PD among them). One prefill node and two decode nodes, each decode node behind its own
SGLang router (`smg`, PD mode), KV over the real Mooncake transfer engine (TCP) on 127.0.0.1, every
server under the GPU fake (tests/gpu_fake_site: SGLang's DSA backend replaced by ESS's CUDA subclass,
its store on the side-stream engine, FlashMLA / the FP8 quantizer / the streams stood in, the device
answered as an H200) in an H200's default configuration (test_gpu_fake_server.H200_ARGS: FP8 656-byte
rows, --dsa-decode-backend flashmla_kv, SGLang's own prefill pick, sgl_ess/models/tiny_dsv32_h200).

The prefill node runs ESS (it sends each request's warm hot-buffer state, pd_warmup.py); both decode
nodes are fed by it, so they receive the same FP8 rows and the same first token. The ESS decode node
(--ess-prefetch-overlap-level none: one FlashMLA call per decode layer; at the default da a step whose
misses are in flight merges two calls' BF16 outputs, one more rounding, see test_gpu_fake_server)
is compared with the reference decode node, the same fake and model with ESS off (SGLang's own DSA
backend over the transferred FP8 rows in its device pool): greedy tokens and log-probs equal on
prompts shorter and longer than top-k (32), the hot buffer (40) and a page (64), one at a time (so
later requests reuse request rows). The ESS decode node starts every request warm from the prefill's
state, moves FlashMLA's FP8 rows (bytes_h2d == rows_h2d * 656) through the stream engine, and both
ESS nodes' live host rows and hot buffers return to zero without a flush. Three servers (started
together) and two routers. Nothing here ran a GPU kernel."""

import random

import pytest

from ._server import ess_live_zero, free_port, start_together
from .test_gpu_fake_server import FP8_ROW_BYTES, GPU_FAKE_H200_ENV, H200_ARGS, REFERENCE_ENV, UNSPLIT
from .test_multi_rank import DSA_PICK
from .test_pd import HOT, PROMPTS, Router, _delta, _need_pd, _out, _settled

pytestmark = pytest.mark.integration

NEW_TOKENS = 24
MC = ["--disaggregation-transfer-backend", "mooncake"]


@pytest.fixture(scope="module")
def pd():
    _need_pd()
    lo = random.randrange(40000, 60000, 1000)
    mc_env = {"MC_MIN_RPC_PORT": str(lo), "MC_MAX_RPC_PORT": str(lo + 999)}
    bootstrap = free_port()
    servers, routers, out = {}, [], {}
    try:
        servers = start_together({
            "prefill": ([*H200_ARGS, "--disaggregation-mode", "prefill", *MC, "--disaggregation-bootstrap-port",
                         str(bootstrap), *HOT, *UNSPLIT], {**GPU_FAKE_H200_ENV, **mc_env}),
            "decode_on": ([*H200_ARGS, "--disaggregation-mode", "decode", *MC, *HOT, *UNSPLIT],
                          {**GPU_FAKE_H200_ENV, **mc_env}),
            "decode_off": ([*H200_ARGS, "--disaggregation-mode", "decode", *MC, "--ess-enabled", "false"],
                           {**REFERENCE_ENV, **mc_env})}, prefix="pd_gpu_fake_")
        prefill = servers["prefill"]
        p_before = _settled(prefill)        # SGLang's own PD warmup requests ran already
        for key in ("decode_on", "decode_off"):         # one at a time, each through its own router
            dec = servers[key]
            routers.append(Router(prefill, bootstrap, dec))
            routers[-1].wait_ready()
            before = _settled(dec) if key == "decode_on" else None     # ESS off reports no hot buffers
            out[key] = [_out(routers[-1].generate(p, NEW_TOKENS)) for p in PROMPTS]
            if before is not None:
                out["decode_usage"] = _settled(dec)
                out["decode_delta"] = _delta(out["decode_usage"], before)
        out["prefill_usage"] = _settled(prefill)
        out["prefill_delta"] = _delta(out["prefill_usage"], p_before)
        out["logs"] = {k: s.log_tail(100000) for k, s in servers.items()}
    finally:
        for r in routers:
            r.stop()
        for s in servers.values():
            s.stop()
    return out


def test_gpu_fake_pd_runs_an_h200s_default_configuration(pd):
    """SGLang's own pick for FP8 KV on sm_90 on every node (not a flag of ours), no traceback."""
    for name, log in pd["logs"].items():
        assert DSA_PICK in log, name
        assert "Traceback" not in log, name


def test_gpu_fake_ess_decode_node_equals_the_ess_off_decode_node(pd):
    """Both decode nodes read the same transferred FP8 rows through the same FlashMLA stand-in (ESS
    unsplit: one call per decode layer), so tokens and log-probs are compared for equality."""
    for i, (on, off) in enumerate(zip(pd["decode_on"], pd["decode_off"])):
        assert on[0] == off[0], f"request {i}: tokens differ ESS on vs off on the decode node"
        assert on[1] == off[1], f"request {i}: log-probs differ"
    assert len(set(pd["decode_off"][-1][0])) > 4                   # not a degenerate repetition


def test_gpu_fake_decode_node_warmed_fetched_fp8_rows_and_released_without_a_flush(pd):
    u, d = pd["decode_usage"], pd["decode_delta"]
    assert u["prefetch"]["engine"] == "stream" and u["overlap_level"] == "none", u
    assert d["pd_warm_starts"] == len(PROMPTS) and d["cold_starts"] == 0 and d["pd_warm_rejected"] == 0, d
    assert d["warmup_rows"] > 0 and d["rows_h2d"] > 0, d
    assert sum(d["misses_per_layer"]) > 0, d                         # decode steps missed the hot buffer too
    # the prefill sent warm state for each prompt once per decode node (the ESS-off node drops the buffer)
    assert pd["prefill_delta"]["pd_warm_sent"] == 2 * len(PROMPTS), pd["prefill_delta"]
    assert u["bytes_h2d"] == u["rows_h2d"] * FP8_ROW_BYTES, u        # FlashMLA's FP8 rows, not BF16 latents
    assert ess_live_zero(u), u
    assert ess_live_zero(pd["prefill_usage"]), pd["prefill_usage"]
