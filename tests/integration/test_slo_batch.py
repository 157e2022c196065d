"""Issue 19: SLO-aware decode batch control (--ess-slo-tpot-ms) on a real server.

Server A has no target: SGLang's own batching, and no SLO state anywhere. Its inter-token latency
(ITL) at full batch is measured under a steady load (bench/steady_load.py: RUNNING clients, each
streaming ROUNDS requests of different lengths back to back, so requests keep leaving and joining
the batch) on its second load: like for like with B, which is measured on its second load too. (A
single wave of equal requests is no steady state: with no preemption a lowered cap only takes
effect as running requests finish.) Server B gets a target below that (TARGET_FRACTION of it): its
controller must lower the running-request cap, and in steady state (the middle of the run, once
the cap has settled) the ITL median must be within 15% of the target.
With one request at a time both servers give the same greedy tokens (a cap never changes outputs).
This test reads time on a shared 2-core machine; the 15% band is the issue's acceptance bound, not a
tolerance fitted to what was seen.
"""

import statistics

import pytest

from bench import steady_load

from .conftest import _start

pytestmark = pytest.mark.integration

RUNNING = 24
OUTPUT_LEN = 96              # mean greedy tokens per request (64 .. 128)
ROUNDS = 2                   # requests each client sends back to back: a steady load, not one wave
TARGET_FRACTION = 0.6
PROMPTS = [" ".join(f"s{i}q{j % 23}" for j in range(40 + 7 * i)) for i in range(RUNNING)]


def _steady_itl_ms(srv) -> float:
    """Median ITL over the middle half of one steady load (bench/steady_load.py)."""
    gaps = steady_load.steady_gaps_ms(*steady_load.run(srv.base, srv.auth, PROMPTS, OUTPUT_LEN, ROUNDS))
    assert len(gaps) > 50, f"too few steady-state gaps ({len(gaps)})"
    return statistics.median(gaps)


@pytest.fixture(scope="module")
def slo_runs():
    out = {}
    args = ["--max-running-requests", str(RUNNING), "--ess-hot-slots-per-request", "40"]
    a = _start("slo_none", args)
    try:
        out["none_tokens"] = [a.generate(p, 16)["output_ids"] for p in PROMPTS[:4]]
        _steady_itl_ms(a)                           # warm, as server B is when it is measured
        out["none_itl"] = _steady_itl_ms(a)
        out["none_status"] = a.get("/ess/status")["schedulers"][0]
    finally:
        a.stop()
    out["target"] = round(out["none_itl"] * TARGET_FRACTION, 1)
    b = _start("slo_target", args + ["--ess-slo-tpot-ms", str(out["target"])])
    try:
        out["slo_tokens"] = [b.generate(p, 16)["output_ids"] for p in PROMPTS[:4]]
        _steady_itl_ms(b)                           # let the cap settle
        out["slo_itl"] = _steady_itl_ms(b)
        out["slo_status"] = b.get("/ess/status")["schedulers"][0]
    finally:
        b.stop()
    print(f"\nSLO: unconstrained ITL p50 {out['none_itl']:.1f} ms at {RUNNING} running; target {out['target']} ms; "
          f"with target {out['slo_itl']:.1f} ms, controller {out['slo_status'].get('slo')}")
    return out


def test_without_a_target_nothing_changes(slo_runs):
    assert "slo" not in slo_runs["none_status"]
    assert slo_runs["none_tokens"] == slo_runs["slo_tokens"]          # one at a time: the cap is not reached


def test_the_cap_moves_and_steady_itl_is_within_15_percent_of_the_target(slo_runs):
    slo = slo_runs["slo_status"]["slo"]
    assert slo["target_ms"] == slo_runs["target"] and slo["changes"] > 0 and slo["cap"] < RUNNING, slo
    seen = {k: slo_runs[k] for k in ("none_itl", "target", "slo_itl")}
    assert abs(slo_runs["slo_itl"] - slo_runs["target"]) <= 0.15 * slo_runs["target"], (seen, slo)
