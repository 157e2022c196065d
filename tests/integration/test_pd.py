"""Issue 18: ESS on a prefill/decode (PD) decode node, real processes on 127.0.0.1.

A prefill server (ESS on), two decode servers (ESS on, ESS off) and SGLang's router (`smg`, one per
decode server, PD mode) transfer KV over the real Mooncake transfer engine (TCP). On the ESS decode
node the prefill's TCP writes land straight in ESS's host rows (on CPU SGLang's latent buffers ARE the
host pool), index keys in the device pool; no extend runs there, so a request's hot buffer is opened
by the first batch it runs in, warm from the prefill's state kept when the transfer committed
(pd_warmup.py: the prefill's LRU state rides in one more metadata buffer of SGLang's transfer), and
closed when the row is freed (lifecycle.py); the rows SGLang pre-allocates for transfers hold none (16
hot buffers for 49 request rows). Checked: greedy tokens and log-probs through the router equal a
colocated single server (ESS off) on prompts shorter and longer than top-k (32), the hot buffer (40) and a
page (64); the ESS decode node warms every request and then makes exactly the warmup fetches and the
per-layer misses a colocated ESS server makes on the same prompts (both without SGLang's overlap
schedule, see NO_OVERLAP); its live host rows and hot buffers
return to zero without a flush. The plain decode node (no warm-state buffer: SGLang drops the extra one)
gives the same tokens. Negative control: a third decode node that zeroes the landed latent rows (a debug
stand-in for a transfer that skipped the KV write) answers differently.
Also (item 4 and the lifecycle): a decode node refuses, before bootstrap, what its host pool can never
hold, by SGLang's own decode rule (--num-reserved-decode-tokens beyond the prompt) -- before that rule
a 3600-token prompt for 8 tokens on a 4096-token decode pool waited past the client's 90 s timeout
(run by hand) -- and the prefill lets go of the refused requests; a request aborted while its KV is in
flight (seen in the decode's transfer queue) leaves no live row or hot buffer on either node, without a
flush; after /flush_cache on both nodes the next request answers as before. A decode node that SGLang's
test switch makes retract every few steps backs up and restores retracted requests' KV and gives the
colocated server's tokens, and releases everything.
"""

import concurrent.futures as cf
import importlib.util
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from ._server import Server, ess_live_zero, free_port
from .conftest import _need_sglang

pytestmark = pytest.mark.integration
PROMPTS = [" ".join(f"p{i}t{j % 31}" for j in range(n)) for i, n in enumerate([5, 60, 200, 450])]
HOT = ["--ess-hot-slots-per-request", "40"]
# SGLang's PD decode loop with the overlap schedule runs one decode forward per request more than the
# colocated overlap loop (its result is dropped; seen here as exactly one more step of misses), so the
# miss-for-miss comparison runs both ESS servers without it; tokens are compared with it on elsewhere.
NO_OVERLAP = ["--disable-overlap-schedule"]
# 16 running requests: SGLang then pre-allocates 2 x 16 more request rows for transfers in flight
# (--disaggregation-decode-extra-slots' default for <= 32 per worker); they get no hot buffer
DECODE_ROWS = ["--max-running-requests", "16"]


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

    def post(self, body: dict, timeout: float = 300) -> tuple[int, str]:
        return _post(self.base, "/generate", body, timeout)

    def stop(self):
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


def _post(base: str, path: str, body: dict, timeout: float = 300, headers=None) -> tuple[int, str]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


_IDS = random.Random(18)
SMALL_DECODE_POOL = 4096
# prompt 1000 + 3500 new + a page > 4096; prompt 3600 + SGLang's 512 reserved decode tokens + a page > 4096
REFUSED = [{"input_ids": [_IDS.randrange(5, 2048) for _ in range(n)],
            "sampling_params": {"max_new_tokens": m, "temperature": 0}} for n, m in ((1000, 3500), (3600, 8))]
LONG = [_IDS.randrange(5, 2048) for _ in range(3000)]      # its prefill takes seconds here: a wide transfer window
# SGLang's own test switch: retract_decode every 3rd decode step, so the decode node backs up a retracted
# request's KV and index keys and restores them when it resumes (its PD retraction path)
RETRACT_ENV = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "3"}


def _metrics(server) -> dict[str, float]:
    """sgless_pd_* samples of `server`'s /metrics: name{labels} -> value."""
    req = urllib.request.Request(server.base + "/metrics", headers=server.auth)
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("sgless_pd_"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _metric(samples: dict, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in samples.items() if k.split("{")[0] == name and all(w in k for w in want))


def _pd_queue(server) -> dict:
    return server.ess_usage()["queue"].get("pd", {})


def _refusals(router, prefill) -> dict:
    got = [router.post(b, timeout=120) for b in REFUSED]
    deadline = time.time() + 120
    while time.time() < deadline and (_pd_queue(prefill).get("bootstrap_requests") or
                                      not ess_live_zero(prefill.ess_usage())):
        time.sleep(0.5)
    return {"answers": got, "prefill_queue": _pd_queue(prefill), "prefill_usage": prefill.ess_usage()}


def _abort_during_transfer(router, prefill, dec) -> dict:
    res = {}
    body = {"input_ids": LONG, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
    th = threading.Thread(target=lambda: res.update(answer=router.post(body, timeout=300)))
    th.start()
    seen, deadline = None, time.time() + 120
    while seen is None and th.is_alive() and time.time() < deadline:
        q = _pd_queue(dec)
        seen = q if q.get("transfer_requests") else None
        time.sleep(0.05)
    aborted = _post(dec.base, "/abort_request", {"abort_all": True}, 60, dec.auth)
    th.join(300)
    return {"seen": seen, "aborted": aborted, "answered": not th.is_alive(), "answer": res.get("answer"),
            "decode_usage": _settled(dec), "prefill_usage": _settled(prefill)}


def _out(r):
    return r["output_ids"], [t[0] for t in r["meta_info"]["output_token_logprobs"]]


def _delta(after, before):
    keys = ("warmup_rows", "rows_h2d", "pd_warm_starts", "cold_starts", "pd_warm_rejected", "pd_warm_sent")
    d = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
    d["misses_per_layer"] = [a - b for a, b in zip(after["misses_per_layer"], before["misses_per_layer"])]
    return d


def _settled(server):
    deadline = time.time() + 60
    while True:
        u = server.ess_usage()
        if ess_live_zero(u) or time.time() > deadline:
            return u
        time.sleep(0.5)


@pytest.fixture(scope="module")
def pd():
    _need_pd()
    lo = random.randrange(40000, 60000, 1000)
    env = {"MC_MIN_RPC_PORT": str(lo), "MC_MAX_RPC_PORT": str(lo + 999)}
    bootstrap = free_port()
    servers, routers, out = [], [], {}
    try:
        prefill = Server("pd_prefill", ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend",
                                        "mooncake", "--disaggregation-bootstrap-port", str(bootstrap), *HOT,
                                        "--enable-metrics"], env)
        dec_on = Server("pd_decode_on", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend",
                                         "mooncake", *NO_OVERLAP, *HOT, "--enable-metrics", *DECODE_ROWS], env)
        dec_off = Server("pd_decode_off", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend",
                                           "mooncake", "--ess-enabled", "false"], env)
        dec_drop = Server("pd_decode_drop", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend",
                                             "mooncake", *HOT, "--max-total-tokens", str(SMALL_DECODE_POOL)],
                          {**env, "SGLESS_PD_DEBUG_DROP_LANDED_KV": "1"})
        dec_retract = Server("pd_decode_retract", ["--disaggregation-mode", "decode",
                                                   "--disaggregation-transfer-backend", "mooncake", *HOT],
                             {**env, **RETRACT_ENV})
        servers += [prefill, dec_on, dec_off, dec_drop, dec_retract]
        for s in servers:
            s.wait_healthy()
        for d in (dec_on, dec_off, dec_drop, dec_retract):
            routers.append(Router(prefill, bootstrap, d))
            routers[-1].wait_ready()
        before, p_before = _settled(dec_on), _settled(prefill)
        out["on"] = [_out(routers[0].generate(p, 24)) for p in PROMPTS]
        out["decode_usage"] = _settled(dec_on)
        out["decode_delta"] = _delta(out["decode_usage"], before)
        out["prefill_delta"] = _delta(_settled(prefill), p_before)
        out["off"] = [_out(routers[1].generate(p, 24)) for p in PROMPTS]
        out["drop"] = [_out(routers[2].generate(p, 24)) for p in PROMPTS]
        with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:           # concurrent: retraction picks among them
            out["retract"] = list(ex.map(lambda p: _out(routers[3].generate(p, 24)), PROMPTS))
        out["retract_usage"] = _settled(dec_retract)
        out["retract_log"] = dec_retract.log_tail(100000)
        out["prefill_usage"] = _settled(prefill)
        time.sleep(2.5)                                           # the exporter samples once a second
        out["metrics"] = {"prefill": _metrics(prefill), "decode": _metrics(dec_on)}
        out["refusals"] = _refusals(routers[2], prefill)          # the small-pool decode node judges
        out["abort"] = _abort_during_transfer(routers[0], prefill, dec_on)
        out["after_abort"] = _out(routers[0].generate(PROMPTS[1], 24))
        dec_on.flush_cache()
        prefill.flush_cache()
        out["after_flush"] = _out(routers[0].generate(PROMPTS[2], 24))
        out["after_flush_usage"] = _settled(dec_on)
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
    colo_on = Server("pd_colocated_ess", [*NO_OVERLAP, *HOT])
    try:
        colo_on.wait_healthy()
        before = _settled(colo_on)
        out["colocated_ess"] = [_out(colo_on.generate(p, 24)) for p in PROMPTS]
        out["colocated_delta"] = _delta(_settled(colo_on), before)
    finally:
        colo_on.stop()
    return out


def test_ess_decode_node_gives_the_colocated_servers_tokens_and_logprobs(pd):
    assert [t for t, _ in pd["on"]] == [t for t, _ in pd["colocated"]]
    assert [lp for _, lp in pd["on"]] == [lp for _, lp in pd["colocated"]]


def test_plain_decode_node_gives_the_same(pd):
    assert pd["off"] == pd["colocated"]


def test_negative_control_a_decode_node_whose_landed_latents_are_zeroed_answers_differently(pd):
    """The stand-in zeroes the transferred latent rows at commit (SGLESS_PD_DEBUG_DROP_LANDED_KV): the
    tokens decoded from them must change, or the equality above would not show that the KV landed."""
    for (_, lp_drop), (_, lp_ref) in zip(pd["drop"], pd["colocated"]):
        assert lp_drop[0] == lp_ref[0]          # the first token is the prefill's
        assert lp_drop[1:] != lp_ref[1:]


def test_the_prefills_warm_state_warms_the_decode_node_as_a_colocated_server_warms(pd):
    d, c, p = pd["decode_delta"], pd["colocated_delta"], pd["prefill_delta"]
    assert p["pd_warm_sent"] == len(PROMPTS), p
    assert d["pd_warm_starts"] == len(PROMPTS) and d["cold_starts"] == 0 and d["pd_warm_rejected"] == 0, d
    assert d["warmup_rows"] > 0, d
    assert d["warmup_rows"] == c["warmup_rows"], (d, c)               # the same rows fetched before decoding
    assert d["misses_per_layer"] == c["misses_per_layer"], (d, c)     # then the same misses, layer by layer
    assert pd["colocated_ess"] == pd["colocated"]


def test_ess_decode_node_releases_without_a_flush(pd):
    u = pd["decode_usage"]
    assert u["pd_opens"] >= len(PROMPTS), u
    assert u["pd_pending_rows"] == 0, u
    # hot buffers for running requests only: SGLang's pre-allocated rows (transfers in flight) hold none
    assert (u["hot_buffers"], u["request_rows"]) == (16, 16 + 32 + 1), u
    assert u["hot_slots_capacity"] == len(u["misses_per_layer"]) * u["hot_buffers"] * 40, u
    assert ess_live_zero(u), u
    assert u["rows_h2d"] > 0, u                       # decode fetched its misses from the host pool
    assert ess_live_zero(pd["prefill_usage"]), pd["prefill_usage"]
    for log in (pd["prefill_log"], pd["decode_log"]):
        assert "Traceback" not in log


def test_a_retracting_decode_node_resumes_with_the_same_tokens_and_releases_everything(pd):
    """Before the CPU stand-in (cpu_fixes.py item 6) the decode node stopped on its first retraction
    (SGLang's backup calls torch.cuda.synchronize()); run by hand, every request then got a 500/503."""
    retracted = [int(n) for n in re.findall(r"Testing retraction\. #retracted_reqs: (\d+)", pd["retract_log"])]
    assert sum(retracted) > 0, "SGLang did not retract any request; the test proves nothing"
    assert [t for t, _ in pd["retract"]] == [t for t, _ in pd["colocated"]]
    assert ess_live_zero(pd["retract_usage"]), pd["retract_usage"]
    assert "Traceback" not in pd["retract_log"]


def test_decode_node_refuses_what_its_host_pool_can_never_hold_before_bootstrap(pd):
    r = pd["refusals"]
    (st1, body1), (st2, body2) = r["answers"]
    assert st1 == 400 and "decode node's host pool" in body1 and "max_new_tokens 3500" in body1, body1
    assert st2 == 400 and "512 reserved decode tokens" in body2 and "Shorten the prompt below 3520" in body2, body2
    assert r["prefill_queue"].get("bootstrap_requests") == 0, r                # the prefill let them go
    assert ess_live_zero(r["prefill_usage"]), r["prefill_usage"]


def test_abort_during_transfer_releases_both_nodes_without_a_flush(pd):
    a = pd["abort"]
    assert a["seen"] and a["seen"]["transfer_requests"] >= 1, a          # aborted while its KV was in flight
    assert a["aborted"][0] == 200, a["aborted"]
    assert a["answered"], "the client's request hung after the abort"
    assert ess_live_zero(a["decode_usage"]), a["decode_usage"]
    assert ess_live_zero(a["prefill_usage"]), a["prefill_usage"]
    assert pd["after_abort"] == pd["colocated"][1]                        # the node still answers right


def test_after_a_flush_on_both_nodes_the_next_request_answers_as_before(pd):
    assert pd["after_flush"] == pd["colocated"][2]
    assert ess_live_zero(pd["after_flush_usage"]), pd["after_flush_usage"]


def test_pd_metrics_show_the_queues_and_the_warm_starts(pd):
    m = pd["metrics"]
    u, p = pd["decode_usage"], pd["prefill_usage"]                 # the same counters as /ess/status
    assert _metric(m["decode"], "sgless_pd_warm_starts_total") == u["pd_warm_starts"] >= len(PROMPTS), (m, u)
    assert _metric(m["decode"], "sgless_pd_cold_starts_total") == u["cold_starts"], (m, u)
    assert _metric(m["prefill"], "sgless_pd_warm_sent_total") == p["pd_warm_sent"] >= len(PROMPTS), (m, p)
    for queue in ("prealloc", "transfer", "retracted"):            # idle: every queue is there, at zero
        assert any(f'queue="{queue}"' in k for k in m["decode"]), (queue, m["decode"])
        assert _metric(m["decode"], "sgless_pd_queue_requests", queue=queue) == 0, m["decode"]
    for queue in ("bootstrap", "inflight"):
        assert any(f'queue="{queue}"' in k for k in m["prefill"]), (queue, m["prefill"])
