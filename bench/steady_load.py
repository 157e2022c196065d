"""A steady decode load for inter-token latency (ITL) measurements against a real server.

`clients` threads each stream `rounds` greedy requests back to back (client i always sends prompt
i). Request lengths differ per client and round (2/3 to 4/3 of `output_len` in five steps), so
requests keep leaving and joining the running batch, as in serving, instead of moving in one wave:
with no preemption, a batch cap only takes effect as running requests finish, and a single wave
of equal requests never reaches a steady state. ITL is read over the middle half of the run, one
gap per pair of consecutive streamed chunks of a request. Used by ``python -m bench slo`` and by
tests/integration/test_slo_batch.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
import urllib.request


def new_tokens(output_len: int, client: int, round_: int) -> int:
    """Greedy tokens of request `round_` of `client`: 2/3 .. 4/3 of output_len, in five steps."""
    lo, hi = (2 * output_len) // 3, (4 * output_len) // 3
    return lo + (hi - lo) // 4 * ((client + 2 * round_) % 5)


def stream(base: str, headers: dict, text: str, n: int, timeout_s: float = 1800) -> list[float]:
    """Arrival times (monotonic s) of each streamed chunk of one greedy request of n tokens."""
    body = {"text": text, "stream": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **headers})
    times = []
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        for line in r:
            if line.startswith(b"data:") and b"[DONE]" not in line:
                times.append(time.monotonic())
    return times


def run(base: str, headers: dict, prompts: list[str], output_len: int, rounds: int):
    """One client per prompt, `rounds` requests each -> (arrival times per request, start, end)."""
    def client(i: int) -> list[list[float]]:
        return [stream(base, headers, prompts[i], new_tokens(output_len, i, k)) for k in range(rounds)]

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        arrivals = [ts for per_client in ex.map(client, range(len(prompts))) for ts in per_client]
    return arrivals, t0, time.monotonic()


def steady_gaps_ms(arrivals, t0: float, t1: float) -> list[float]:
    """Sorted gaps (ms) between consecutive chunks of a request, both inside the middle half."""
    lo, hi = t0 + (t1 - t0) * 0.25, t0 + (t1 - t0) * 0.75
    return sorted((b - a) * 1000 for ts in arrivals for a, b in zip(ts, ts[1:]) if lo <= a and b <= hi)
