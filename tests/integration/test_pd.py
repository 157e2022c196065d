"""Issue 18: ESS on a prefill/decode (PD) decode node, real processes on 127.0.0.1.

A prefill server (ESS off), two decode servers (ESS on, ESS off) and SGLang's router (`smg`, one per
decode server, PD mode) transfer KV over the real Mooncake transfer engine (TCP). On the ESS decode
node the prefill's TCP writes land straight in ESS's host rows (on CPU SGLang's latent buffers ARE the
host pool), index keys in the device pool; no extend runs there, so each request's hot buffer is opened
cold when the decode pool hands it a row and closed when the row is freed (lifecycle.py). Checked:
greedy tokens and log-probs through the router equal a colocated single server (ESS off) on prompts
shorter and longer than top-k (32), the hot buffer (40) and a page (64); the ESS decode node counts its
cold starts (warmup indices do not travel with the KV yet, so it has no warmup rows); its live host rows
and hot buffers return to zero without a flush.
"""

import importlib.util
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from ._server import Server, ess_live_zero, free_port
from .conftest import _need_sglang

pytestmark = pytest.mark.integration
PROMPTS = [" ".join(f"p{i}t{j % 31}" for j in range(n)) for i, n in enumerate([5, 60, 200, 450])]
HOT = ["--ess-hot-slots-per-request", "40"]


def _router_bin():
    return shutil.which("smg") or os.path.join(os.path.dirname(sys.executable), "smg")


def _need_pd():
    _need_sglang()
    if importlib.util.find_spec("mooncake") is None or not os.path.exists(_router_bin()):
        pytest.skip("PD packages not installed: bash launch/setup.sh --with-pd (and apt-get install libibverbs1)")


class Router:
    def __init__(self, prefill: Server, bootstrap: int, decode: Server):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="sgl_ess_router_", suffix=".log", delete=False)
        cmd = [_router_bin(), "launch", "--pd-disaggregation", "--prefill", prefill.base, str(bootstrap),
               "--decode", decode.base, "--host", "127.0.0.1", "--port", str(self.port),
               "--prometheus-port", str(free_port())]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s=120):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited rc={self.proc.returncode}: {open(self.log.name).read()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError("router not listening")

    def generate(self, text: str, n: int) -> dict:
        body = {"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
                "return_logprob": True}
        req = urllib.request.Request(self.base + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        deadline = time.time() + 120
        while True:              # the router may answer 503 until its first health check of the workers passed
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                if e.code != 503 or time.time() > deadline:
                    raise
                time.sleep(1.0)

    def stop(self):
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


def _out(r):
    return r["output_ids"], [t[0] for t in r["meta_info"]["output_token_logprobs"]]


@pytest.fixture(scope="module")
def pd():
    _need_pd()
    lo = random.randrange(40000, 60000, 1000)
    env = {"MC_MIN_RPC_PORT": str(lo), "MC_MAX_RPC_PORT": str(lo + 999)}
    bootstrap = free_port()
    servers, routers, out = [], [], {}
    try:
        prefill = Server("pd_prefill", ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend",
                                        "mooncake", "--disaggregation-bootstrap-port", str(bootstrap),
                                        "--ess-enabled", "false"], env)
        dec_on = Server("pd_decode_on", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend",
                                         "mooncake", *HOT], env)
        dec_off = Server("pd_decode_off", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend",
                                           "mooncake", "--ess-enabled", "false"], env)
        servers += [prefill, dec_on, dec_off]
        for s in servers:
            s.wait_healthy()
        for d in (dec_on, dec_off):
            routers.append(Router(prefill, bootstrap, d))
            routers[-1].wait_ready()
        out["on"] = [_out(routers[0].generate(p, 24)) for p in PROMPTS]
        out["off"] = [_out(routers[1].generate(p, 24)) for p in PROMPTS]
        deadline = time.time() + 60
        while True:
            u = dec_on.ess_usage()
            if ess_live_zero(u) or time.time() > deadline:
                break
            time.sleep(0.5)
        out["decode_usage"] = u
        out["prefill_log"] = prefill.log_tail(400)
        out["decode_log"] = dec_on.log_tail(400)
    finally:
        for r in routers:
            r.stop()
        for s in servers:
            s.stop()
    colo = Server("pd_colocated", ["--ess-enabled", "false"])
    try:
        colo.wait_healthy()
        out["colocated"] = [_out(colo.generate(p, 24)) for p in PROMPTS]
    finally:
        colo.stop()
    return out


def test_ess_decode_node_gives_the_colocated_servers_tokens_and_logprobs(pd):
    assert [t for t, _ in pd["on"]] == [t for t, _ in pd["colocated"]]
    assert [lp for _, lp in pd["on"]] == [lp for _, lp in pd["colocated"]]


def test_plain_decode_node_gives_the_same(pd):
    assert pd["off"] == pd["colocated"]


def test_ess_decode_node_opens_cold_counts_it_and_releases_without_a_flush(pd):
    u = pd["decode_usage"]
    assert u["cold_starts"] >= len(PROMPTS), u        # SGLang's PD warm-up request, then ours
    assert u["warmup_rows"] == 0, u                   # warmup indices do not travel with the KV (yet)
    assert ess_live_zero(u), u
    assert u["rows_h2d"] > 0, u                       # decode fetched its misses from the host pool
    for log in (pd["prefill_log"], pd["decode_log"]):
        assert "Traceback" not in log
