"""Issue 38 items 4-7 against one real server (the embedded model, 127.0.0.1), with raw sockets:

  * HTTP/1.1 pipelining: three requests written at once on one connection, three answers;
  * keys from a file (admin) and the environment (user): auth works, and no process of the server
    shows either key in /proc/PID/cmdline, nor the environment variable in /proc/PID/environ
    (children);
  * /stop_profile with no profile running: 409 naming /start_profile, no traceback (item 3);
  * a partial request head is closed by the server (--guard-header-timeout-s); one connection over
    --guard-max-connections-per-client gets 503, and after closing them a request is served;
  * /init_weights_update_group to a peer that accepts and stays silent: the client's 504, and the
    scheduler serves the next request (its rendezvous is bounded by --guard-blocking-timeout-s);
  * SIGTERM: no /dev/shm file the server's processes held remains (last test: it stops the server).
"""

import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest

from tests.raw_http import read_responses

from ._server import Server, group_alive

pytestmark = pytest.mark.integration

USER_KEY = "sgl-ess-hardening-user-key-5f3a"
ADMIN_KEY = "sgl-ess-hardening-admin-key-9c1e"
HEADER_TIMEOUT_S = 3
PER_CLIENT = 12
BLOCKING_TIMEOUT_S = 4
WAIT_S = 120          # how long a test waits for the server to act (a hang bound, not a speed claim)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "admin.key"
    key_file.write_text(ADMIN_KEY + "\n")
    os.chmod(key_file, 0o600)
    s = Server("hardening", ["--admin-api-key-file", str(key_file), "--guard-header-timeout-s", str(HEADER_TIMEOUT_S),
                             "--guard-max-connections-per-client", str(PER_CLIENT),
                             "--guard-enable-blocking-routes", "true",
                             "--guard-blocking-timeout-s", str(BLOCKING_TIMEOUT_S)],
               env={"SGLESS_API_KEY": USER_KEY, "SGLANG_TIMEOUT_KEEP_ALIVE": "300"}, admin_key=None)
    s.admin_key = ADMIN_KEY
    try:
        s.wait_healthy()
    except Exception:
        s.stop()
        raise
    yield s
    s.stop()
    assert not group_alive(s.pgid), f"processes of {s.name} left behind (pgid {s.pgid})"


def _tree(pid: int) -> list[psutil.Process]:
    p = psutil.Process(pid)
    return [p, *p.children(recursive=True)]


def _request(method: str, path: str, key: str | None, body: dict | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\n"
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    return (head + "\r\n").encode() + data


def _responses(s: socket.socket, n: int) -> list[tuple[int, bytes]]:
    return read_responses(s, n, WAIT_S)


def _read_until_closed(s: socket.socket) -> bytes:
    s.settimeout(WAIT_S)
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            return buf
        buf += d


def _status(srv, method: str, path: str, key: str | None, body: dict | None = None) -> int:
    req = urllib.request.Request(srv.base + path, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


GEN = {"text": "pipelined", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}


def test_pipelined_requests_all_answered(srv):
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(_request("GET", "/health", USER_KEY) + _request("GET", "/v1/models", USER_KEY)
                  + _request("POST", "/generate", USER_KEY, GEN))
        answers = _responses(s, 3)
    assert [st for st, _ in answers] == [200, 200, 200], answers
    assert json.loads(answers[1][1])["data"][0]["id"]
    assert len(json.loads(answers[2][1])["output_ids"]) == 2


def test_keys_from_file_and_environment_never_on_a_command_line(srv):
    assert _status(srv, "POST", "/generate", None, GEN) == 401
    assert _status(srv, "POST", "/generate", USER_KEY, GEN) == 200
    assert _status(srv, "POST", "/generate", ADMIN_KEY, GEN) == 200
    assert _status(srv, "POST", "/flush_cache", USER_KEY) == 401           # operator route: the admin key only
    procs = _tree(srv.proc.pid)
    assert len(procs) >= 3                                                # launcher, scheduler, detokenizer, ...
    for p in procs:
        cmdline = " ".join(p.cmdline())
        assert USER_KEY not in cmdline and ADMIN_KEY not in cmdline, (p.pid, cmdline)
    for p in procs[1:]:                                                   # the launcher's own block is its exec's
        env = p.environ()
        assert "SGLESS_API_KEY" not in env and USER_KEY not in env.values(), p.pid


def test_stop_profile_without_a_profile_is_a_409_not_a_500(srv):
    """Issue 38 item 3: SGLang answered /stop_profile with no profile running with a 500 and a
    traceback (its tokenizer manager raises RuntimeError with the scheduler's message)."""
    start = os.path.getsize(srv.log.name)
    for method in ("POST", "GET"):
        req = urllib.request.Request(srv.base + "/stop_profile", method=method,
                                     headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        try:
            with urllib.request.urlopen(req, timeout=WAIT_S) as r:
                status, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        assert status == 409, (method, status, body[:300])
        assert b"not in progress" in body and b"/start_profile" in body, body[:300]
    assert _status(srv, "POST", "/stop_profile", USER_KEY) == 401           # still an operator route
    assert _status(srv, "POST", "/generate", USER_KEY, GEN) == 200
    with open(srv.log.name, errors="replace") as fh:
        fh.seek(start)
        log = fh.read()
    assert "Traceback" not in log, log[log.index("Traceback") - 300:][:3000]


def test_partial_request_head_is_closed(srv):
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        assert _read_until_closed(s) == b""
    with socket.create_connection(("127.0.0.1", srv.port)) as s:           # connects, sends nothing
        assert _read_until_closed(s) == b""
    assert _status(srv, "GET", "/health", USER_KEY) == 200


def test_connections_per_client_bounded(srv):
    held = []
    try:
        # the server's other connections from 127.0.0.1 are closed ones; each held one has been answered
        for _ in range(PER_CLIENT):
            s = socket.create_connection(("127.0.0.1", srv.port))
            held.append(s)
            s.sendall(_request("GET", "/health", USER_KEY))
            assert _responses(s, 1)[0][0] == 200
        with socket.create_connection(("127.0.0.1", srv.port)) as extra:
            answer = _read_until_closed(extra)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:300]
        assert b"--guard-max-connections-per-client" in answer
    finally:
        for s in held:
            s.close()
    deadline = time.time() + WAIT_S                   # the server notices the closes on its own loop
    while True:
        try:
            if _status(srv, "GET", "/health", USER_KEY) == 200:
                break
        except (urllib.error.URLError, ConnectionError):
            pass
        assert time.time() < deadline, "no request served after the held connections closed"
        time.sleep(0.5)


def test_silent_rendezvous_peer_does_not_hold_the_scheduler(srv):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.5)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])          # accept, then say nothing
            except OSError:
                continue
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        status = _status(srv, "POST", "/init_weights_update_group", ADMIN_KEY,
                         {"master_address": "127.0.0.1", "master_port": listener.getsockname()[1],
                          "rank_offset": 1, "world_size": 2, "group_name": "silent_peer", "backend": "gloo"})
        assert status in (400, 504), status                     # 504: the guard's bound reached first
        assert len(accepted) >= 2                                # the guard's probe, then the scheduler's store
        out = srv.post("/generate", GEN, timeout=WAIT_S)         # the scheduler serves again
        assert len(out["output_ids"]) == 2
    finally:
        stop.set()
        t.join()
        for c in accepted:
            c.close()
        listener.close()
    assert "no rendezvous with 127.0.0.1" in srv.log_tail(400)


def _shm_held(pids) -> set[str]:
    out = set()
    for pid in pids:
        try:
            p = psutil.Process(pid)
            paths = [f.path for f in p.open_files()] + [m.path for m in p.memory_maps(grouped=True)]
        except psutil.Error:
            continue
        out.update(x for x in paths if x.startswith("/dev/shm/"))
    return out


def test_sigterm_leaves_no_shared_memory_files(srv):
    """Runs last in this module: it stops the server."""
    held = {p for p in _shm_held(q.pid for q in _tree(srv.proc.pid)) if os.path.exists(p)}
    assert any(os.path.basename(p).startswith("sglang_loads_") for p in held), held
    srv.proc.send_signal(signal.SIGTERM)                         # the launcher only: SGLang's own exit path
    srv.proc.wait(timeout=WAIT_S)
    assert srv.proc.returncode == 0, srv.log_tail()
    assert not [p for p in held if os.path.exists(p)], held
