"""After many requests, including aborted ones, host-pool and hot-buffer usage return to zero."""

import concurrent.futures as cf
import json
import urllib.request

import pytest

pytestmark = pytest.mark.integration


def _prompt(i):
    return ("for i in range(%d):\n    total += i * %d\n" % (i, i)) * 12


def _complete(server, i):
    return server.generate(_prompt(i), 16)


def _stream_then_disconnect(server, i):
    body = {"model": "default", "prompt": _prompt(i), "max_tokens": 200, "temperature": 0,
            "stream": True, "ignore_eos": True}
    req = urllib.request.Request(server.base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=300)
    seen = 0
    for raw in r:
        if raw.strip().startswith(b"data:"):
            seen += 1
        if seen >= 3:
            break
    r.close()  # client goes away mid-decode: SGLang aborts the request
    return seen


def _generate_then_abort(server, i):
    return server.generate_then_abort({"text": _prompt(i), "sampling_params": {"max_new_tokens": 300,
                                                                              "ignore_eos": True}},
                                      after_s=0.5, join_s=120)


def test_usage_returns_to_zero_after_many_requests_and_aborts(server_on):
    jobs = []
    with cf.ThreadPoolExecutor(12) as ex:
        for i in range(16):
            jobs.append(ex.submit(_complete, server_on, i))
        for i in range(4):
            jobs.append(ex.submit(_stream_then_disconnect, server_on, 100 + i))
        for i in range(3):
            jobs.append(ex.submit(_generate_then_abort, server_on, 200 + i))
        busy = server_on.ess_usage()
        results = [j.result(timeout=600) for j in jobs]
    assert all(r["meta_info"]["completion_tokens"] == 16 for r in results[:16])
    assert busy["host_tokens_capacity"] > 0
    u = server_on.wait_ess_zero()
    assert u["host_tokens_used"] == 0 and u["hot_slots_used"] == 0
