"""connection_limits.LimitedH11Protocol under a real uvicorn server (a trivial ASGI app, 127.0.0.1):
pipelined requests all answered, a partial request head closed after the header timeout, one
connection over the per-client bound refused with 503 and the bound freed when connections close."""

import socket
import threading
import time

import pytest

uvicorn = pytest.importorskip("uvicorn")

from sgl_ess.integration.sglang.routes import connection_limits  # noqa: E402
from tests.raw_http import read_responses  # noqa: E402

HEADER_TIMEOUT_S = 1.0
PER_CLIENT = 3
WAIT_S = 60.0        # how long a test waits for the server to act (a hang bound, not a speed claim)


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    out = f"{scope['method']} {scope['path']} {len(body)}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


@pytest.fixture(scope="module")
def server():
    connection_limits.configure(HEADER_TIMEOUT_S, PER_CLIENT)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, http=connection_limits.LimitedH11Protocol, log_level="warning",
                            timeout_keep_alive=120, lifespan="off")
    srv = uvicorn.Server(config)
    t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.time() + WAIT_S
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started
    yield port
    srv.should_exit = True
    t.join(WAIT_S)
    connection_limits.configure(0, 0)


def _read_all(s: socket.socket) -> bytes:
    s.settimeout(WAIT_S)
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            return buf
        buf += d


def _responses(s: socket.socket, n: int) -> list[bytes]:
    """The bodies of `n` complete responses read from `s`."""
    return [body for _, body in read_responses(s, n, WAIT_S)]


def _get(port: int, path: str = "/x") -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        return _read_all(s)


def test_pipelined_requests_all_answered(server):
    with socket.create_connection(("127.0.0.1", server)) as s:
        s.sendall(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n"
                  b"POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"
                  b"GET /c HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _responses(s, 3) == [b"GET /a 0", b"POST /b 5", b"GET /c 0"]


def test_partial_head_is_closed(server):
    with socket.create_connection(("127.0.0.1", server)) as s:
        s.sendall(b"GET /slow HTTP/1.1\r\nHost: t\r\nX-A: ")
        assert _read_all(s) == b""                  # closed by the server, nothing answered


def test_partial_second_head_on_keep_alive_is_closed(server):
    with socket.create_connection(("127.0.0.1", server)) as s:
        s.sendall(b"GET /first HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _responses(s, 1) == [b"GET /first 0"]
        s.sendall(b"GET /second HTTP/1.1\r\nHo")
        assert _read_all(s) == b""


def test_head_in_pieces_within_the_deadline_is_served(server):
    with socket.create_connection(("127.0.0.1", server)) as s:
        for piece in (b"GET /pieces HT", b"TP/1.1\r\nHost: t\r\n", b"\r\n"):
            s.sendall(piece)
        assert _responses(s, 1) == [b"GET /pieces 0"]


def test_connections_per_client_bounded(server):
    held = []
    try:
        for i in range(PER_CLIENT):
            s = socket.create_connection(("127.0.0.1", server))
            s.sendall(f"GET /held{i} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            assert _responses(s, 1) == [f"GET /held{i} 0".encode()]   # answered: now open, idle, counted
            held.append(s)
        with socket.create_connection(("127.0.0.1", server)) as extra:
            answer = _read_all(extra)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
        assert b"--guard-max-connections-per-client" in answer
    finally:
        for s in held:
            s.close()
    deadline = time.time() + WAIT_S               # the server sees the closes on its loop
    while connection_limits.open_connections("127.0.0.1") and time.time() < deadline:
        time.sleep(0.05)
    assert _get(server, "/after").endswith(b"GET /after 0")
