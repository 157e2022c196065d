"""GLM-5 / 5.1 (the embedded tiny_glm5: 3 layers, GLM's head shapes) through prefill/decode
disaggregation (tests/integration/test_pd.py has the mechanism and the DeepSeek-V3.2 checks): one
prefill node (ESS on) and two decode nodes, ESS on and ESS off, each behind its own SGLang router in PD
mode, KV over the real Mooncake transfer engine (TCP) on 127.0.0.1, both decode nodes without SGLang's
overlap schedule (as test_pd's). Checked: the ESS decode node gives the ESS-off decode node's greedy
tokens and log-probs on prompts shorter and longer than top-k (32), the hot buffer (40) and a page (64),
one at a time; it warms every request from the prefill's state (no cold start), fetches misses from the
host pool, and both ESS nodes' live rows and hot buffers return to zero without a flush. Three servers
and two routers, the servers started together.

Not checked here: equality with a colocated server. Against a colocated ESS-off server the tokens were
equal but the 450-token prompt's log-probs differed, with the ESS-off decode node exactly as with the ESS
one (run at 03:05 UTC, 2026-12-07), so the difference lies in SGLang's PD path for this model, not in
ESS."""

import random

import pytest

from sgl_ess.models import TINY_GLM5_DIR

from ._server import ess_live_zero, free_port, start_together
from .test_pd import HOT, NO_OVERLAP, PROMPTS, Router, _delta, _need_pd, _out, _settled

pytestmark = pytest.mark.integration

MODEL = ["--model-path", TINY_GLM5_DIR, "--load-format", "dummy"]
SCALED_WEIGHTS = {"SGLESS_DUMMY_INIT": "scaled"}     # as test_glm5_exactness: logits not flat
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def pd():
    _need_pd()
    lo = random.randrange(40000, 60000, 1000)
    env = {"MC_MIN_RPC_PORT": str(lo), "MC_MAX_RPC_PORT": str(lo + 999), **SCALED_WEIGHTS}
    bootstrap = free_port()
    mc = ["--disaggregation-transfer-backend", "mooncake"]
    servers, routers, out = {}, [], {}
    try:
        servers = start_together({
            "prefill": ([*MODEL, "--disaggregation-mode", "prefill", *mc, "--disaggregation-bootstrap-port",
                         str(bootstrap), *HOT], env),
            "decode_on": ([*MODEL, "--disaggregation-mode", "decode", *mc, *NO_OVERLAP, *HOT], env),
            "decode_off": ([*MODEL, "--disaggregation-mode", "decode", *mc, *NO_OVERLAP, "--ess-enabled", "false"],
                           env)}, prefix="glm5_pd_")
        prefill, dec_on, dec_off = servers["prefill"], servers["decode_on"], servers["decode_off"]
        for dec in (dec_on, dec_off):
            routers.append(Router(prefill, bootstrap, dec))
            routers[-1].wait_ready()
        before, p_before = _settled(dec_on), _settled(prefill)     # SGLang's own PD warmup request ran already
        out["on"] = [_out(routers[0].generate(p, NEW_TOKENS)) for p in PROMPTS]
        out["decode_usage"] = _settled(dec_on)
        out["decode_delta"] = _delta(out["decode_usage"], before)
        out["prefill_usage"] = _settled(prefill)
        out["prefill_delta"] = _delta(out["prefill_usage"], p_before)
        out["off"] = [_out(routers[1].generate(p, NEW_TOKENS)) for p in PROMPTS]
        out["logs"] = [prefill.log_tail(400), dec_on.log_tail(400)]
    finally:
        for r in routers:
            r.stop()
        for s in servers.values():
            s.stop()
    return out


def test_glm_ess_decode_node_equals_the_ess_off_decode_node(pd):
    assert [t for t, _ in pd["on"]] == [t for t, _ in pd["off"]]
    assert [lp for _, lp in pd["on"]] == [lp for _, lp in pd["off"]]
    assert len({t for t in pd["off"][-1][0]}) > 4                  # not a degenerate repetition


def test_glm_decode_node_warmed_fetched_and_released_without_a_flush(pd):
    d = pd["decode_delta"]
    assert d["pd_warm_starts"] == len(PROMPTS) and d["cold_starts"] == 0 and d["pd_warm_rejected"] == 0, d
    assert d["warmup_rows"] > 0 and d["rows_h2d"] > 0 and len(d["misses_per_layer"]) == 3, d   # tiny_glm5: 3
    assert pd["prefill_delta"]["pd_warm_sent"] == len(PROMPTS), pd["prefill_delta"]
    assert ess_live_zero(pd["decode_usage"]), pd["decode_usage"]
    assert ess_live_zero(pd["prefill_usage"]), pd["prefill_usage"]
    for log in pd["logs"]:
        assert "Traceback" not in log
