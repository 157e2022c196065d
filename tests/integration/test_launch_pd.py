"""Issue 18 items 5-7: `python -m sgl_ess.launch_pd`, gray release and failover; real processes on 127.0.0.1.

One command starts a prefill server (ESS on), one ESS decode server and one plain decode server (a gray
release: the router's round robin sends each a share) and SGLang's router, all in one port range.
Checked, in order on one cluster:
- it prints the endpoint; requests through it complete and both decode nodes served some, the ESS one
  warm from the prefill's state;
- failover: with requests in flight on both nodes, the ESS decode node's process group is SIGKILLed.
  Every non-streamed request still completes in full (the router retries it from the prefill on the
  live node) and with the same greedy tokens as before the kill; a streamed request ends either complete
  or with an error event before `[DONE]`, never silently short; nothing hangs;
- launch_pd restarts the dead node and the router takes it back (it serves warm requests again);
- SIGTERM stops every process launch_pd started and exits 0.
"""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from ._server import REPO, TEST_ADMIN_KEY, group_alive
from .test_pd import _need_pd

pytestmark = pytest.mark.integration
PROMPTS = [" ".join(f"q{i}w{j % 29}" for j in range(n)) for i, n in enumerate([40, 120, 300, 80, 200, 60])]
LOAD_TOKENS = 160


def _get(url, key=TEST_ADMIN_KEY):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _body(text, n, stream=False):
    return json.dumps({"text": text, "stream": stream,
                       "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}).encode()


def _generate(base, text, n=8):
    req = urllib.request.Request(base + "/generate", data=_body(text, n), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read())


def _stream(base, text, n):
    """The stream's data events, decoded (`[DONE]` kept as the string)."""
    req = urllib.request.Request(base + "/generate", data=_body(text, n, stream=True),
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=900) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if line.startswith("data:"):
                data = line[5:].strip()
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _status(port):
    return _get(f"http://127.0.0.1:{port}/ess/status")["schedulers"][0]


def _ess_decode_pgid(lo):
    """The ESS decode server's process group (launch_pd starts each server in its own session)."""
    pids = subprocess.run(["pgrep", "-f", "--", f"--port {lo + 4} "], capture_output=True, text=True).stdout.split()
    return os.getpgid(int(pids[0]))


def _children_pgids(pid):
    kids = subprocess.run(["ps", "-o", "pgid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return sorted({int(k) for k in kids.split() if k.strip()})


def _failover(out, base, lo, logs):
    load = [PROMPTS[i % len(PROMPTS)] + f" load{i}" for i in range(8)]
    out["load_ref"] = [_generate(base, t, LOAD_TOKENS)["output_ids"] for t in load[:6]]
    got, threads = {}, []

    def run(i):
        try:
            got[i] = _stream(base, load[i], LOAD_TOKENS) if i >= 6 else _generate(base, load[i], LOAD_TOKENS)
        except Exception as e:                       # noqa: BLE001 - recorded, asserted on below
            got[i] = e

    for i in range(8):                               # round robin: both nodes get non-streamed and streamed ones
        threads.append(threading.Thread(target=run, args=(i,), daemon=True))
        threads[-1].start()
        time.sleep(0.2)
    time.sleep(3.0)
    os.killpg(_ess_decode_pgid(lo), signal.SIGKILL)
    for t in threads:
        t.join(timeout=900)
    out["hung"] = sum(t.is_alive() for t in threads)
    out["load"] = got
    deadline = time.time() + 900                     # launch_pd restarts it; the router takes it back
    while "decode0 healthy again" not in (logs / "launch_pd.out").read_text():
        assert time.time() < deadline, (logs / "launch_pd.out").read_text()[-2000:]
        time.sleep(1.0)
    warm0 = _status(lo + 4)["pd_warm_starts"]
    served_again = False
    while time.time() < deadline and not served_again:
        _generate(base, PROMPTS[0])
        served_again = _status(lo + 4)["pd_warm_starts"] > warm0
    out["served_again"] = served_again


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    _need_pd()
    lo = random.randrange(40000, 60000, 1000)
    logs = tmp_path_factory.mktemp("pd_logs")
    out_log = open(logs / "launch_pd.out", "w")
    cmd = [sys.executable, "-m", "sgl_ess.launch_pd", "--ports", f"{lo}-{lo + 999}", "--decode-nodes", "1",
           "--plain-decode-nodes", "1", "--log-dir", str(logs), "--",
           "--ess-hot-slots-per-request", "40", "--admin-api-key", TEST_ADMIN_KEY]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=out_log, stderr=subprocess.STDOUT, start_new_session=True)
    out = {"lo": lo}
    try:
        deadline = time.time() + 1200
        while "ready:" not in (logs / "launch_pd.out").read_text():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"launch_pd rc={proc.poll()}: {(logs / 'launch_pd.out').read_text()[-3000:]}")
            time.sleep(1.0)
        base = f"http://127.0.0.1:{lo}"
        sent0, warm0 = _status(lo + 2)["pd_warm_sent"], _status(lo + 4)["pd_warm_starts"]
        out["replies"] = [_generate(base, p) for p in PROMPTS]
        out["ess"], out["prefill"] = _status(lo + 4), _status(lo + 2)
        out["sent"] = out["prefill"]["pd_warm_sent"] - sent0
        out["warm"] = out["ess"]["pd_warm_starts"] - warm0
        _failover(out, base, lo, logs)
        out["pgids"] = _children_pgids(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out["rc"] = proc.wait(timeout=120)
        out["stdout"] = (logs / "launch_pd.out").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out_log.close()
    return out


def test_it_prints_the_endpoint_and_serves_through_the_router(cluster):
    assert f"ready: http://127.0.0.1:{cluster['lo']}" in cluster["stdout"]
    assert all(len(r["output_ids"]) == 8 for r in cluster["replies"])


def test_gray_release_both_decode_nodes_serve_and_the_ess_one_starts_warm(cluster):
    assert 0 < cluster["warm"] < len(PROMPTS), cluster["ess"]     # the plain node took the rest
    assert cluster["ess"]["pd_warm_rejected"] == 0, cluster["ess"]
    assert cluster["sent"] == len(PROMPTS), cluster["prefill"]


def test_failover_every_non_streamed_request_completes_with_the_same_tokens(cluster):
    assert cluster["hung"] == 0
    for i in range(6):
        r = cluster["load"][i]
        assert not isinstance(r, Exception), (i, r)
        assert r["output_ids"] == cluster["load_ref"][i], i


def test_failover_a_stream_ends_complete_or_with_an_error_event(cluster):
    ends = []
    for i in (6, 7):
        events = cluster["load"][i]
        assert not isinstance(events, Exception), (i, events)
        assert events[-1] == "[DONE]", events[-3:]
        tokens = [e for e in events[:-1] if "error" not in e]
        errors = [e for e in events[:-1] if "error" in e]
        complete = not errors and tokens[-1]["meta_info"]["completion_tokens"] == LOAD_TOKENS
        assert complete or (errors and events[-2] is errors[-1]), events[-3:]
        ends.append("complete" if complete else "error")
    assert "error" in ends, ends                      # one stream was on the killed node (round robin)


def test_the_restarted_decode_node_is_taken_back(cluster):
    assert "decode0 exited rc=-9; restarting it" in cluster["stdout"]
    assert cluster["served_again"]


def test_sigterm_stops_every_process_it_started(cluster):
    assert cluster["rc"] == 0, cluster["stdout"][-2000:]
    assert len(cluster["pgids"]) == 4, cluster["pgids"]     # prefill, two decode nodes, router
    deadline = time.time() + 30
    while any(group_alive(g) for g in cluster["pgids"]) and time.time() < deadline:
        time.sleep(0.5)
    assert not any(group_alive(g) for g in cluster["pgids"])
