"""Issue 19: SLO-aware decode batch control (--ess-slo-tpot-ms) on a real server.

Server A has no target: SGLang's own batching, and no SLO state anywhere. Its inter-token latency
(ITL) at full batch is measured by streaming many concurrent requests, on its second load: like for
like with B, which is measured on its second load too. Server B gets a target below
that (TARGET_FRACTION of it): its controller must lower the running-request cap, and in steady state
(the middle of the run, once the cap has settled) the ITL median must be within 15% of the target.
With one request at a time both servers give the same greedy tokens (a cap never changes outputs).
This test reads time on a shared 2-core machine; the 15% band is the issue's acceptance bound, not a
tolerance fitted to what was seen.
"""

import concurrent.futures as cf
import json
import statistics
import time
import urllib.request

import pytest

from .conftest import _start

pytestmark = pytest.mark.integration

RUNNING = 24
NEW_TOKENS = 96
TARGET_FRACTION = 0.6
PROMPTS = [" ".join(f"s{i}q{j % 23}" for j in range(40 + 7 * i)) for i in range(RUNNING)]


def _stream(srv, text: str) -> list[float]:
    """Arrival times (monotonic s) of each streamed chunk of one greedy request."""
    body = {"text": text, "stream": True,
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}}
    req = urllib.request.Request(srv.base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **srv.auth})
    times = []
    with urllib.request.urlopen(req, timeout=900) as r:
        for line in r:
            if line.startswith(b"data:") and b"[DONE]" not in line:
                times.append(time.monotonic())
    return times


def _load(srv) -> tuple[list[list[float]], float, float]:
    """RUNNING concurrent streams -> (arrival times per request, run start, run end)."""
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(RUNNING) as ex:
        arrivals = list(ex.map(lambda p: _stream(srv, p), PROMPTS))
    return arrivals, t0, time.monotonic()


def _steady_itl_ms(arrivals, t0, t1) -> float:
    """Median gap between consecutive chunks of a request, over the middle half of the run."""
    lo, hi = t0 + (t1 - t0) * 0.25, t0 + (t1 - t0) * 0.75
    gaps = [(b - a) * 1000 for ts in arrivals for a, b in zip(ts, ts[1:]) if lo <= a and b <= hi]
    assert len(gaps) > 50, f"too few steady-state gaps ({len(gaps)})"
    return statistics.median(gaps)


@pytest.fixture(scope="module")
def slo_runs():
    out = {}
    args = ["--max-running-requests", str(RUNNING), "--ess-hot-slots-per-request", "40"]
    a = _start("slo_none", args)
    try:
        out["none_tokens"] = [a.generate(p, 16)["output_ids"] for p in PROMPTS[:4]]
        _load(a)                                    # warm, as server B is when it is measured
        arr, t0, t1 = _load(a)
        out["none_itl"] = _steady_itl_ms(arr, t0, t1)
        out["none_status"] = a.get("/ess/status")["schedulers"][0]
    finally:
        a.stop()
    out["target"] = round(out["none_itl"] * TARGET_FRACTION, 1)
    b = _start("slo_target", args + ["--ess-slo-tpot-ms", str(out["target"])])
    try:
        out["slo_tokens"] = [b.generate(p, 16)["output_ids"] for p in PROMPTS[:4]]
        _load(b)                                    # let the cap settle
        arr, t0, t1 = _load(b)
        out["slo_itl"] = _steady_itl_ms(arr, t0, t1)
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
    assert abs(slo_runs["slo_itl"] - slo_runs["target"]) <= 0.15 * slo_runs["target"], slo_runs
