"""Issue 18 items 5 and 7: `python -m sgl_ess.launch_pd`, real processes on 127.0.0.1.

One command starts a prefill server (ESS on), one ESS decode server and one plain decode server (a gray
release: the router's round robin sends each a share) and SGLang's router, all in one port range. Checked:
it prints the endpoint; requests through it complete, and both decode nodes served some (the ESS one warm
from the prefill's state); SIGTERM stops every process it started and exits 0.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from ._server import REPO, TEST_ADMIN_KEY, group_alive
from .test_pd import _need_pd

pytestmark = pytest.mark.integration
PROMPTS = [" ".join(f"q{i}w{j % 29}" for j in range(n)) for i, n in enumerate([40, 120, 300, 80, 200, 60])]


def _get(url, key=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _generate(base, text):
    body = {"text": text, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
    req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:          # 503 until the router's first health check passed
            if e.code != 503 or time.time() > deadline:
                raise
            time.sleep(1.0)


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
    out = {"lo": lo, "logs": logs, "proc": proc}
    try:
        deadline = time.time() + 1200
        while "ready:" not in (logs / "launch_pd.out").read_text():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"launch_pd rc={proc.poll()}: {(logs / 'launch_pd.out').read_text()[-3000:]}")
            time.sleep(1.0)
        base = f"http://127.0.0.1:{lo}"
        sent0 = _get(f"http://127.0.0.1:{lo + 2}/ess/status", TEST_ADMIN_KEY)["schedulers"][0]["pd_warm_sent"]
        warm0 = _get(f"http://127.0.0.1:{lo + 4}/ess/status", TEST_ADMIN_KEY)["schedulers"][0]["pd_warm_starts"]
        out["replies"] = [_generate(base, p) for p in PROMPTS]
        out["ess"] = _get(f"http://127.0.0.1:{lo + 4}/ess/status", TEST_ADMIN_KEY)["schedulers"][0]
        out["prefill"] = _get(f"http://127.0.0.1:{lo + 2}/ess/status", TEST_ADMIN_KEY)["schedulers"][0]
        out["sent"] = out["prefill"]["pd_warm_sent"] - sent0
        out["warm"] = out["ess"]["pd_warm_starts"] - warm0
        out["pgids"] = [int(x) for x in _children_pgids(proc.pid)]
        proc.send_signal(signal.SIGTERM)
        out["rc"] = proc.wait(timeout=120)
        out["stdout"] = (logs / "launch_pd.out").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out_log.close()
    return out


def _children_pgids(pid):
    """Process groups of the direct children of `pid` (launch_pd starts each in its own session)."""
    kids = subprocess.run(["ps", "-o", "pgid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return sorted({k.strip() for k in kids.split() if k.strip()})


def test_it_prints_the_endpoint_and_serves_through_the_router(cluster):
    assert f"ready: http://127.0.0.1:{cluster['lo']}" in cluster["stdout"]
    assert all(len(r["output_ids"]) == 8 for r in cluster["replies"])


def test_gray_release_both_decode_nodes_serve_and_the_ess_one_starts_warm(cluster):
    assert 0 < cluster["warm"] < len(PROMPTS), cluster["ess"]     # the plain node took the rest
    assert cluster["ess"]["pd_warm_rejected"] == 0, cluster["ess"]
    assert cluster["sent"] == len(PROMPTS), cluster["prefill"]


def test_sigterm_stops_every_process_it_started(cluster):
    assert cluster["rc"] == 0, cluster["stdout"][-2000:]
    assert len(cluster["pgids"]) == 4                       # prefill, two decode nodes, router
    deadline = time.time() + 30
    while any(group_alive(g) for g in cluster["pgids"]) and time.time() < deadline:
        time.sleep(0.5)
    assert not any(group_alive(g) for g in cluster["pgids"])
