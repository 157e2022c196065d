"""Start the real server (``python -m sgl_ess.launch_server``) as a subprocess on a free
127.0.0.1 port, in its own process group, and stop it with nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARTUP_TIMEOUT_S = 480  # a loaded 2-core machine can take minutes (tokenizer + scheduler start)
TEST_ADMIN_KEY = "sgl-ess-test-admin-key"   # operator routes (flush, abort, overlap level) need one
HEALTH_POLL_S = 0.25  # /health poll while a server starts: a test waits at most this long past its readiness


# SGLang derives TCP ports from --port (DP attention: port + 233 .. + 233 + 6 + DP ranks) and from
# --dist-init-addr (its port + 1 ..); another test server's gloo port, bound anywhere, must not sit
# there, or the new server stops with "scheduler_input_port ... is used by a process already"
# (seen once in a full run). So a port is handed out only when those neighbours are free too.
_DERIVED = [1, 2, 3, 4, 5, 6, 7, 8] + [233 + i for i in range(16)]


# Every process a test server starts (and its children: the prefetch worker) carries this variable, so
# a leak check can tell its own processes from those of another run on the same machine.
RUN_MARK = f"SGLESS_TEST_RUN_{os.getpid()}"


def run_pids() -> set[int]:
    """This pytest process and every live process started by its test servers (RUN_MARK in its environment)."""
    out = {os.getpid()}
    mark = RUN_MARK.encode() + b"="
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if mark in fh.read():
                    out.add(int(pid))
        except OSError:
            continue
    return out


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# Ports are handed out below the kernel's ephemeral range, so no socket bound to port 0 (a transfer
# engine's data listener, a client's connection) can take one in the minute before its server binds
# it - a PD prefill server once failed with "address already in use" that way in a full run - and
# above SGLang's own below-ephemeral picks (its NCCL port: 22000-29999). Within this process a port
# and its neighbours are handed out to one holder at a time: a Server gives its block back when it has
# stopped, a test's own free_port() block is free again after DIRECT_HOLD_S. (The band holds about 60
# blocks and a full run takes more: handing each out once used it up, and the fallback to an ephemeral
# port then lost a race with another socket: "address already in use", seen in a full run.)
PORT_BAND = (30000, 32768)
_given: set[int] = set()                       # ports of the blocks servers hold (given back by Server.stop)
_direct: dict[frozenset, float] = {}           # blocks free_port() handed to a test itself -> when
DIRECT_HOLD_S = 900.0                          # such a block is free again after this (no test holds one longer)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _take_port(direct: bool = False) -> tuple[int, set[int]]:
    """(port, the block it and its SGLang-derived neighbours form), the block now handed out: to a Server
    (held until it stops) or, `direct`, to a test (held for DIRECT_HOLD_S)."""
    import random

    now = time.time()
    for block in [b for b, t in _direct.items() if now - t > DIRECT_HOLD_S]:
        del _direct[block]
    taken = _given.union(*_direct) if _direct else _given
    hi = min(PORT_BAND[1], _ephemeral_low()) - max(_DERIVED)
    candidates = list(range(PORT_BAND[0], hi)) if hi > PORT_BAND[0] else []
    random.shuffle(candidates)
    for port in candidates:
        block = {port, *(port + d for d in _DERIVED)}
        if not block & taken and all(_bindable(p) for p in block):
            if direct:
                _direct[frozenset(block)] = now
            else:
                _given.update(block)
            return port, block
    if candidates:
        # the band is used up by blocks handed out and not given back: an ephemeral port could be taken by
        # any socket before its server binds it (a full run once failed "address already in use" so)
        raise RuntimeError(f"no free port block left in {PORT_BAND[0]}..{hi} ({len(_given)} ports held by servers, "
                           f"{len(_direct)} blocks by tests): stop servers (Server.stop gives their block back) "
                           "before starting more")
    for _ in range(200):                     # no room below the ephemeral range here: any free port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + max(_DERIVED) <= 65535 and all(_bindable(port + d) for d in _DERIVED):
            return port, set()
    raise RuntimeError("no free port with free SGLang-derived neighbours in 200 tries")


def free_port() -> int:
    """A free 127.0.0.1 port whose SGLang-derived neighbours (see _DERIVED) are free as well, kept out of
    later picks for DIRECT_HOLD_S (a Server's own block is held until it stops)."""
    return _take_port(direct=True)[0]


class Server:
    """`admin_key`: started with --admin-api-key (default TEST_ADMIN_KEY; None: without one, so its
    operator routes are off). The HTTP helpers below send the admin key, which every route accepts."""

    def __init__(self, name: str, args: list[str], env: dict | None = None, admin_key: str | None = TEST_ADMIN_KEY):
        self.name = name
        self.admin_key = admin_key if "--admin-api-key" not in args else args[args.index("--admin-api-key") + 1]
        extra = ["--admin-api-key", admin_key] if admin_key and "--admin-api-key" not in args else []
        self._argv, self._env = [*args, *extra], {**os.environ, RUN_MARK: "1", **(env or {})}
        self._launch()

    def _launch(self) -> None:
        self.port, self._ports = _take_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix=f"sgl_ess_{self.name}_", suffix=".log", delete=False)
        self.proc = subprocess.Popen(self._command(), cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=self._env)
        self.pgid = self.proc.pid

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "sgl_ess.launch_server", "--port", str(self.port), *self._argv]

    def log_tail(self, n: int = 60) -> str:
        with open(self.log.name, errors="replace") as fh:
            return "".join(fh.readlines()[-n:])

    def _lost_its_port(self) -> bool:
        """Another socket took the port after free_port checked it: the launcher's preflight exits saying so,
        or (taken later) SGLang's HTTP server cannot bind it, and then it does not exit but hangs in shutdown
        (its warmup thread holds the lifespan)."""
        with open(self.log.name, errors="replace") as fh:
            log = fh.read()
        return "error while attempting to bind on address" in log or f":{self.port} is already in use" in log

    def wait_healthy(self, retries: int = 1) -> None:
        """Wait for /health; a server that lost its port to another socket is restarted on a new one
        (`retries` times), anything else that keeps it from starting raises."""
        deadline, polls = time.time() + STARTUP_TIMEOUT_S, 0
        while time.time() < deadline:
            polls += 1
            if (polls % 8 == 0 or self.proc.poll() is not None) and self._lost_its_port():
                lost = self.port
                self.stop()
                if retries <= 0:
                    raise RuntimeError(f"server {self.name}: port {lost} taken by another socket:\n{self.log_tail()}")
                self._launch()
                return self.wait_healthy(retries - 1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited rc={self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(HEALTH_POLL_S)
        raise TimeoutError(f"server {self.name} not healthy after {STARTUP_TIMEOUT_S}s:\n{self.dump_stacks()}")

    def dump_stacks(self) -> str:
        """A server that hangs: every process of its group writes all its threads' Python stacks to
        the log (SIGUSR2: the sgl-ess plugin's faulthandler) and runs on; returns the log's tail with
        them. One process at a time, so their stacks do not interleave."""
        for pid in sorted(group_processes(self.pgid)):
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                continue
            time.sleep(1.0)
        return self.log_tail(400)

    def stop(self) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left; wait until it is empty."""
        for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.time() + grace
            while time.time() < deadline and group_alive(self.pgid):
                try:
                    self.proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
            if not group_alive(self.pgid):
                break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if not group_alive(self.pgid):        # its ports are free again: later servers may take them
            _given.difference_update(self._ports)
            self._ports = set()

    # --- HTTP helpers -----------------------------------------------------------------
    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}

    def post(self, path: str, body: dict, timeout: float = 300) -> dict:
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **self.auth})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def get(self, path: str, timeout: float = 60) -> dict:
        with urllib.request.urlopen(urllib.request.Request(self.base + path, headers=self.auth), timeout=timeout) as r:
            return json.loads(r.read())

    def flush_cache(self, wait_s: float = 60.0) -> None:
        """POST /flush_cache. SGLang answers 400 while requests are still pending (an abort or a
        finished request not yet cleaned up): retry until `wait_s`, then raise."""
        deadline = time.time() + wait_s
        while True:
            req = urllib.request.Request(self.base + "/flush_cache", method="POST", headers=self.auth)
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    r.read()
                return
            except urllib.error.HTTPError as e:
                if e.code != 400 or time.time() > deadline:
                    raise
            time.sleep(0.5)

    def ess_usage(self) -> dict:
        return self.get("/ess/status")["schedulers"][0]

    def generate_then_abort(self, body: dict, after_s: float, join_s: float = 300):
        """POST /generate `body` under a fresh rid in a thread, abort it by rid after `after_s`;
        returns the response, or the exception an aborted request may answer with."""
        rid = f"abort-{time.time_ns()}"
        out = {}

        def run():
            try:
                out["r"] = self.post("/generate", {**body, "rid": rid})
            except Exception as e:  # noqa: BLE001 - the abort's own answer
                out["r"] = e
        t = threading.Thread(target=run)
        t.start()
        time.sleep(after_s)
        req = urllib.request.Request(self.base + "/abort_request", data=json.dumps({"rid": rid}).encode(),
                                     headers={"Content-Type": "application/json", **self.auth})
        urllib.request.urlopen(req, timeout=60).read()     # the answer need not be JSON
        t.join(timeout=join_s)
        return out.get("r")

    def wait_ess_zero(self, timeout_s: float = 60) -> dict:
        """Poll until the scheduler (and its draft stores, with speculation) hold no live host row, no
        hot slot and no open hot buffer -- WITHOUT a flush: a flush clears SGLang's allocator, so
        reading usage after one says nothing about a leak. Cached prefix rows may stay (evictable).
        Then flush and require every pool empty. The usage, or AssertionError at the deadline."""
        deadline, u = time.time() + timeout_s, None
        while True:
            u = self.ess_usage()
            if ess_live_zero(u) and all(ess_live_zero(d) for d in u.get("draft", [])):
                break
            if time.time() > deadline:
                raise AssertionError(f"live ESS rows did not return to zero without a flush: {u}")
            time.sleep(0.5)
        while True:
            self.flush_cache(wait_s=max(0.0, deadline - time.time()))
            u = self.ess_usage()
            if ess_usage_zero(u) and all(ess_usage_zero(d) for d in u.get("draft", [])):
                return u
            if time.time() > deadline:
                raise AssertionError(f"ESS usage did not return to zero after a flush: {u}")
            time.sleep(1.0)

    def generate(self, text: str, max_new_tokens: int, **extra) -> dict:
        body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                                   "ignore_eos": True}, "return_logprob": True}
        body.update(extra)
        return self.post("/generate", body)


def start_together(specs: dict[str, tuple], prefix: str = "") -> dict[str, Server]:
    """Start several independent servers at once and wait until every one is healthy: {key: (args, env)}
    -> {key: Server named prefix + key}. Their starts (imports, model load, warmup) overlap, which on a
    2-core machine takes well under the sum of one-by-one starts; a test then uses them one at a time
    (an idle CPU server sleeps: the launcher adds --sleep-on-idle) and stops each when done. If any
    fails to start, all are stopped and the error is raised."""
    servers: dict[str, Server] = {}
    try:
        for key, (args, env) in specs.items():
            servers[key] = Server(prefix + key, args, env)
        for srv in servers.values():
            srv.wait_healthy()
    except BaseException:
        for srv in servers.values():
            srv.stop()
        raise
    return servers


def stop_all(servers: dict) -> None:
    """Stop every server of `servers` ({key: Server}) and check that none left a process behind."""
    for srv in servers.values():
        srv.stop()
    for srv in servers.values():
        assert not group_alive(srv.pgid), f"processes of {srv.name} left behind"


def ess_live_zero(u: dict) -> bool:
    """Nothing held for a request: no live host row (used minus the prefix cache's evictable rows), no hot
    slot, no open hot buffer. Draft stores report no split; their hot state is what counts."""
    live = u.get("host_tokens_live", 0)
    return live == 0 and u["hot_slots_used"] == 0 and u["hot_requests_open"] == 0


def ess_usage_zero(u: dict) -> bool:
    """One store's usage (a scheduler's, or a draft store's) holds nothing."""
    return u["host_tokens_used"] == 0 and u["hot_slots_used"] == 0 and u["hot_requests_open"] == 0


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (zombies included until reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg succeeds for zombies too; ignore the group once only zombies remain.
    return bool(group_processes(pgid))


def group_processes(pgid: int) -> dict[int, str]:
    """pid -> command line of every live (not zombie) process in process group `pgid`."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out[int(pid)] = cmd
    return out
