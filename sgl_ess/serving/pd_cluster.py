"""``python -m sgl_ess.launch_pd``: a prefill/decode deployment on one machine, one command.

Starts one prefill server, N ESS decode servers (plus M plain decode servers for a gray release)
and SGLang's router (``smg``, or ``sglang-router``) in PD mode in front, all on ``--host``
(loopback by default) with every port taken from one range (``--ports LO-HI``):

  LO router (the OpenAI-compatible endpoint)   LO+1 router metrics   LO+2 prefill HTTP
  LO+3 prefill bootstrap (KV transfer)         LO+4.. decode HTTP    LO+100..HI Mooncake RPC

Each server is ``python -m sgl_ess.launch_server`` (which sets the CPU stand-ins: TCP transfer,
SGLANG_HOST_IP, no pinned-index path); the flags after ``--`` go to every server, so the prefill and
the decode nodes agree on the model and --ess-hot-slots-per-request (the warm state's layout). It
prints progress, waits for every server and the router, prints the endpoint, and stops everything on
SIGINT/SIGTERM or when any process exits (naming it and its log). Logs go to --log-dir.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from sgl_ess.serving import exit_codes

MOONCAKE_PORT_OFFSET = 100


@dataclass
class Proc:
    name: str
    cmd: list[str]
    log_path: str
    url: str = ""
    popen: subprocess.Popen | None = None
    env: dict = field(default_factory=dict)


def parse_ports(text: str, decode_nodes: int) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise SystemExit(f"launch_pd: --ports {text!r}: expected LO-HI, e.g. 30000-30999") from None
    need = MOONCAKE_PORT_OFFSET + 16
    if not (1024 <= lo < hi <= 65535) or hi - lo + 1 < need or 4 + decode_nodes > MOONCAKE_PORT_OFFSET:
        raise SystemExit(f"launch_pd: --ports {text!r}: expected 1024 <= LO < HI <= 65535 with at least {need} "
                         f"ports (LO+{MOONCAKE_PORT_OFFSET}.. go to Mooncake) and at most "
                         f"{MOONCAKE_PORT_OFFSET - 4} decode nodes")
    return lo, hi


def router_binary(explicit: str | None) -> str | None:
    if explicit:
        return explicit if os.path.exists(explicit) or shutil.which(explicit) else None
    here = os.path.dirname(sys.executable)
    for name in ("smg", "sglang-router"):
        for cand in (shutil.which(name), os.path.join(here, name)):
            if cand and os.path.exists(cand):
                return cand
    return None


def preflight(router: str | None) -> list[str]:
    """What is missing for a PD deployment on this machine, as lines a user can act on."""
    problems = []
    if importlib.util.find_spec("mooncake") is None:
        problems.append("the Mooncake transfer engine is not installed: bash launch/setup.sh --with-pd "
                        "(it needs Debian's libibverbs1: apt-get install libibverbs1)")
    else:
        r = subprocess.run([sys.executable, "-c", "import mooncake.engine"], capture_output=True, timeout=120)
        if r.returncode != 0:
            last = (r.stderr.decode(errors="replace").strip().splitlines() or ["no error text"])[-1]
            problems.append(f"the Mooncake transfer engine does not load ({last}): it needs Debian's libibverbs1 "
                            "(apt-get install libibverbs1)")
    if router is None:
        problems.append("SGLang's router (smg or sglang-router) is not installed: bash launch/setup.sh --with-pd, "
                        "or name it with --router-bin")
    return problems


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def build(args, server_args: list[str], router: str) -> list[Proc]:
    lo, hi = parse_ports(args.ports, args.decode_nodes + args.plain_decode_nodes)
    host = args.host
    base = [sys.executable, "-m", "sgl_ess.launch_server", "--host", host]
    env = {"MC_MIN_RPC_PORT": str(lo + MOONCAKE_PORT_OFFSET), "MC_MAX_RPC_PORT": str(hi)}
    mode = ["--disaggregation-transfer-backend", "mooncake"]
    os.makedirs(args.log_dir, exist_ok=True)
    log = lambda name: os.path.join(args.log_dir, f"{name}.log")  # noqa: E731
    prefill = Proc("prefill", [*base, "--port", str(lo + 2), "--disaggregation-mode", "prefill", *mode,
                               "--disaggregation-bootstrap-port", str(lo + 3),
                               *([] if args.prefill_ess else ["--ess-enabled", "false"]), *server_args],
                   log("prefill"), f"http://{host}:{lo + 2}", env=env)
    procs = [prefill]
    for i in range(args.decode_nodes + args.plain_decode_nodes):
        ess = i < args.decode_nodes
        name = f"decode{i}" if ess else f"decode{i}_plain"
        procs.append(Proc(name, [*base, "--port", str(lo + 4 + i), "--disaggregation-mode", "decode", *mode,
                                 *([] if ess else ["--ess-enabled", "false"]), *server_args],
                          log(name), f"http://{host}:{lo + 4 + i}", env=env))
    rcmd = [router, "launch", "--pd-disaggregation", "--prefill", prefill.url, str(lo + 3)]
    for p in procs[1:]:
        rcmd += ["--decode", p.url]
    rcmd += ["--host", host, "--port", str(lo), "--prometheus-host", host, "--prometheus-port", str(lo + 1),
             "--policy", args.policy, "--health-check-interval-secs", str(args.health_check_interval),
             *args.router_arg]
    procs.append(Proc("router", rcmd, log("router"), f"http://{host}:{lo}"))
    return procs


def _alive_or_die(procs: list[Proc]) -> None:
    for p in procs:
        if p.popen is not None and p.popen.poll() is not None:
            raise RuntimeError(f"{p.name} exited rc={p.popen.returncode}; its log: {p.log_path}\n" + tail(p.log_path))


def tail(path: str, n: int = 25) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(fh.readlines()[-n:])
    except OSError:
        return ""


def wait_http(p: Proc, path: str, procs: list[Proc], timeout_s: float, accept=(200,)) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        _alive_or_die(procs)
        try:
            with urllib.request.urlopen(p.url + path, timeout=5) as r:
                if r.status in accept:
                    return
        except urllib.error.HTTPError as e:
            if e.code in accept:
                return
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"{p.name} did not answer {path} within {timeout_s:.0f} s; its log: {p.log_path}")


def wait_serving(router: Proc, procs: list[Proc], timeout_s: float) -> None:
    """Until a one-token request through the router succeeds: the router answers 503 ("no available
    workers") until its first health check of the servers has passed. 401/403 count as serving (the
    servers require a key this probe does not have)."""
    body = json.dumps({"text": "ping", "sampling_params": {"max_new_tokens": 1}}).encode()
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        _alive_or_die(procs)
        req = urllib.request.Request(router.url + "/generate", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120):
                return
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                return
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"the router did not serve a request within {timeout_s:.0f} s; its log: {router.log_path}")


def start(p: Proc) -> None:
    fh = open(p.log_path, "ab")
    p.popen = subprocess.Popen(p.cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, **p.env})
    fh.close()


def stop_all(procs: list[Proc], grace_s: float = 20.0) -> None:
    live = [p for p in procs if p.popen is not None and p.popen.poll() is None]
    for p in reversed(live):                                   # the router first: no new requests
        try:
            os.killpg(p.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace_s
    for p in live:
        try:
            p.popen.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.popen is not None:
            try:
                os.killpg(p.popen.pid, signal.SIGKILL)             # whatever a server left in its group
            except ProcessLookupError:
                pass
            p.popen.wait()


def supervise(procs: list[Proc], args) -> None:
    """Serve until a signal: a decode node that exits is restarted (the router's health check drops it
    meanwhile and takes it back once it answers); the prefill or the router exiting stops everything."""
    restarts = {p.name: 0 for p in procs}
    while True:
        for p in procs:
            if p.popen is None or p.popen.poll() is None:
                continue
            if not p.name.startswith("decode") or not args.restart_decode:
                _alive_or_die([p])
            restarts[p.name] += 1
            print(f"[launch_pd] {p.name} exited rc={p.popen.returncode}; restarting it (restart "
                  f"{restarts[p.name]}; log {p.log_path})", flush=True)
            try:
                os.killpg(p.popen.pid, signal.SIGKILL)         # whatever it left in its group
            except ProcessLookupError:
                pass
            start(p)
            wait_http(p, "/health", [p], args.startup_timeout)
            print(f"[launch_pd] {p.name} healthy again", flush=True)
        time.sleep(1.0)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m sgl_ess.launch_pd",
        description="A prefill/decode (PD) deployment on this machine: one prefill server, N ESS decode "
                    "servers (+ M plain ones for a gray release) and SGLang's router in front. Flags after "
                    "'--' go to every server (python -m sgl_ess.launch_server flags, e.g. "
                    "--ess-hot-slots-per-request). Needs bash launch/setup.sh --with-pd.",
        epilog="example: python -m sgl_ess.launch_pd --decode-nodes 2 -- --ess-hot-slots-per-request 40")
    ap.add_argument("--host", default="127.0.0.1", help="address every server and the router listen on "
                    "(default 127.0.0.1: loopback only)")
    ap.add_argument("--ports", default="30000-30999", help="one port range LO-HI for everything: the router on "
                    "LO (the endpoint clients use), its metrics LO+1, the prefill LO+2 (bootstrap LO+3), decode "
                    "nodes LO+4.., Mooncake's RPC ports LO+100..HI (default 30000-30999)")
    ap.add_argument("--decode-nodes", type=int, default=1, help="ESS decode servers (default 1)")
    ap.add_argument("--plain-decode-nodes", type=int, default=0, help="decode servers with ESS off beside them: "
                    "a gray release sends them a share plain/(ESS+plain) of the requests under --policy "
                    "round_robin (default 0)")
    ap.add_argument("--prefill-ess", choices=("on", "off"), default="on", help="run ESS on the prefill server "
                    "too (default on: its warm hot-buffer state travels with the KV and warms the ESS decode "
                    "nodes; off: they start every request cold)")
    ap.add_argument("--policy", default="round_robin", help="the router's load-balancing policy (smg --policy; "
                    "default round_robin)")
    ap.add_argument("--router-bin", default=None, help="the router executable (default: smg, else sglang-router, "
                    "on PATH or next to this Python)")
    ap.add_argument("--router-arg", action="append", default=[], help="one more flag for the router, repeatable "
                    "(e.g. --router-arg=--health-check-interval-secs --router-arg=5)")
    ap.add_argument("--restart-decode", choices=("on", "off"), default="on", help="restart a decode node that "
                    "exits while serving (default on; the router stops sending it requests until its health check "
                    "passes again); off: any exit stops everything")
    ap.add_argument("--health-check-interval", type=int, default=5, help="seconds between the router's health "
                    "checks of each server: how fast a dead decode node is dropped and a restarted one taken "
                    "back (default 5; smg's own default is 60)")
    ap.add_argument("--log-dir", default=None, help="where each process's log goes (default: a new temp folder)")
    ap.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for each server "
                    "(default 900)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    server_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, server_args = argv[:i], argv[i + 1:]
    args = parser().parse_args(argv)
    if args.decode_nodes < 1 or args.plain_decode_nodes < 0:
        print("launch_pd: --decode-nodes must be >= 1 and --plain-decode-nodes >= 0", file=sys.stderr)
        return exit_codes.CONFIG
    args.prefill_ess = args.prefill_ess == "on"
    args.restart_decode = args.restart_decode == "on"
    for bad in ("--disaggregation-mode", "--port", "--host", "--disaggregation-bootstrap-port"):
        if bad in server_args or any(a.startswith(bad + "=") for a in server_args):
            print(f"launch_pd: {bad} after '--' is set by launch_pd itself (use --host / --ports)", file=sys.stderr)
            return exit_codes.CONFIG
    router = router_binary(args.router_bin)
    problems = preflight(router)
    if problems:
        for p in problems:
            print(f"launch_pd: {p}", file=sys.stderr)
        return exit_codes.CONFIG
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="sgl_ess_pd_")
    try:
        procs = build(args, server_args, router)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return exit_codes.CONFIG
    lo = parse_ports(args.ports, 0)[0]
    taken = [port for port in range(lo, lo + 4 + args.decode_nodes + args.plain_decode_nodes)
             if not port_free(args.host, port)]
    if taken:
        print(f"launch_pd: port(s) {taken} on {args.host} are in use; choose another range with --ports",
              file=sys.stderr)
        return exit_codes.PORT_IN_USE
    def on_signal(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    servers, router_proc = procs[:-1], procs[-1]
    print(f"[launch_pd] logs in {args.log_dir}", flush=True)
    ready = False
    try:
        for p in servers:
            print(f"[launch_pd] starting {p.name} on {p.url}", flush=True)
            start(p)
        for p in servers:
            wait_http(p, "/health", procs, args.startup_timeout)
            print(f"[launch_pd] {p.name} healthy", flush=True)
        start(router_proc)
        wait_http(router_proc, "/health", procs, 120, accept=(200, 503))
        wait_serving(router_proc, procs, 300)
        print(f"[launch_pd] ready: {router_proc.url} (OpenAI-compatible; /generate, /v1/completions, "
              "/v1/chat/completions). Ctrl-C stops everything.", flush=True)
        ready = True
        supervise(procs, args)
    except KeyboardInterrupt:
        print("[launch_pd] stopping", flush=True)
        return 0
    except (RuntimeError, TimeoutError) as e:
        print(f"[launch_pd] {e}", file=sys.stderr, flush=True)
        return exit_codes.PROCESS_DIED if ready else exit_codes.STARTUP_FAILED
    finally:
        stop_all(procs)
