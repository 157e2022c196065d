"""Same device latent budget: ESS on admits >= 4x as many concurrent long requests as ESS off,
and every request completes.

Budget: server_off holds 1920 latent rows per layer in SGLang's device pool; server_on spends
the same on hot buffers (48 requests x 40 slots) and keeps the history in the host pool.
Concurrency is measured from the client: a request is running from its first streamed token
to its last; the figure is the largest number of such intervals that overlap.
"""

import concurrent.futures as cf
import json
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration

N_REQUESTS = 20
NEW_TOKENS = 32


def long_prompt(i: int) -> str:
    return ("def handler_%d(event, context):\n    value = event['k%d']\n    return value\n" % (i, i)) * 16


def _stream_one(server, i):
    body = {"model": "default", "prompt": long_prompt(i), "max_tokens": NEW_TOKENS, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(server.base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    first = last = None
    usage = None
    finish = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            now = time.monotonic()
            if chunk.get("choices"):
                if chunk["choices"][0].get("text"):
                    first = first or now
                    last = now
                finish = chunk["choices"][0].get("finish_reason") or finish
            if chunk.get("usage"):
                usage = chunk["usage"]
    return first, last, usage, finish


def run_concurrent(server, n=N_REQUESTS):
    """-> (max overlapping running requests, results, output tokens/s)."""
    server.flush_cache()
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(n) as ex:
        results = list(ex.map(lambda i: _stream_one(server, i), range(n)))
    wall = time.monotonic() - t0
    events = sorted([(f, 1) for f, _, _, _ in results if f] + [(l, -1) for _, l, _, _ in results if l],
                    key=lambda e: (e[0], e[1]))
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    out_tokens = sum((u or {}).get("completion_tokens", 0) for _, _, u, _ in results)
    return peak, results, out_tokens / wall


def test_ess_on_admits_4x_more_concurrent_long_requests(server_on, server_off):
    peak_off, res_off, _ = run_concurrent(server_off)
    peak_on, res_on, _ = run_concurrent(server_on)
    for name, res in (("ESS off", res_off), ("ESS on", res_on)):
        lost = [i for i, (_, _, u, f) in enumerate(res) if not u or u["completion_tokens"] != NEW_TOKENS]
        assert not lost, f"{name}: requests {lost} did not complete {NEW_TOKENS} tokens"
    assert peak_on >= 4 * peak_off, f"concurrency ESS on {peak_on} vs ESS off {peak_off}: expected >= 4x"
