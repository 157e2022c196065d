"""The route guard: the outermost ASGI middleware on SGLang's app. Every request passes it first.

In order, for every HTTP request and websocket (official seam: ``http_server.app.add_middleware``):
  1. who may call the route (``sgl_ess.serving.route_policy``: one table, deny what it does not
     name). The server's keys live here only: the launcher does not hand them to SGLang, so they
     cannot appear in /server_info, in SGLang's ``server_args`` log lines or in a launch command;
  2. while the server drains after SIGTERM (shutdown.py): 503 for inference and /health;
  3. the body: at most ``--guard-max-body-mb`` (413 before anything is parsed), JSON parsed once
     (nesting deeper than Python can parse is a 400, not a 500 with a traceback); the parsed body
     is left in ``scope["sgl_ess.json"]`` for the request guard;
  4. operator file output: /configure_logging dump folders and /start_profile traces only under
     ``--guard-operator-output-dir`` (a /start_profile without ``output_dir`` is sent there);
  5. blocking routes (when enabled): the peer they name must accept a TCP connection within
     5 s, and the whole call is bounded by ``--guard-blocking-timeout-s`` (504);
  6. JSON answers of status and operator routes are redacted of secret-shaped fields and of the
     server's own key values (``sgl_ess.serving.redact``);
  7. a handler that raises ValueError / TypeError before answering (bad input SGLang did not check)
     gives a 400 with the scrubbed message instead of a 500 and a traceback; a profiler call the
     scheduler refuses for its state (/stop_profile with no profile running) gives a 409.
Below it, at the connection (connection_limits.py): a deadline for each request head and a bound on
open connections per client address. HTTP/1.1 pipelining is kept: the guard reads a request's body
only through ``receive`` and hands the rest of the connection back untouched
(tests/integration/test_http_hardening.py sends pipelined requests on one connection).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
from typing import Optional

from sgl_ess.serving import route_policy as rp
from sgl_ess.serving.ops_config import OpsConfig
from sgl_ess.serving.redact import redact
from sgl_ess.serving.sanitize import error_body, scrub

from ..launcher import shutdown

logger = logging.getLogger("sgl_ess.guard")
JSON_KEY = "sgl_ess.json"            # scope key: the parsed body (absent: no JSON body)
_PEER_CONNECT_TIMEOUT_S = 5.0
_BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")
_DISCARD_FACTOR = 8                  # a body up to 8x the limit is read and dropped before the 413
_PROFILE_ROUTES = ("/start_profile", "/stop_profile")


async def send_error(send, status: int, message: str, extra_headers=(), path: str = "") -> None:
    body = error_body(path, status, message, code={401: "AuthenticationError", 403: "PermissionDeniedError",
                                                  409: "Conflict", 413: "RequestTooLarge", 503: "ServiceUnavailable",
                                                  504: "Timeout"}.get(status, "BadRequestError"))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    pass


async def read_body(receive, limit_bytes: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise BodyTooLarge(size)
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def replaying(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay


def _under(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip("/") + "/")


def output_dir_refusal(path: str, data, root: str) -> tuple[Optional[str], Optional[dict]]:
    """(refusal message, body to send instead) for the routes that write files on the server."""
    if path == "/configure_logging" and isinstance(data, dict):
        for field in ("dump_requests_folder", "crash_dump_folder"):
            v = data.get(field)
            if v in (None, ""):
                continue
            if not root:
                return (f"{field}: this server writes request dumps nowhere (they hold users' prompts); start it "
                        f"with --guard-operator-output-dir DIR to allow a folder under DIR"), None
            if not isinstance(v, str) or not _under(v, root):
                return f"{field}: got {v!r}; expected a folder under {root} (--guard-operator-output-dir)", None
    if path == "/start_profile":
        if not root:
            return ("profiling is off on this server (traces hold model state and are written to disk); start it "
                    "with --guard-operator-output-dir DIR"), None
        body = dict(data) if isinstance(data, dict) else {}
        v = body.get("output_dir")
        if v in (None, ""):
            body["output_dir"] = root
            return None, body
        if not isinstance(v, str) or not _under(v, root):
            return f"output_dir: got {v!r}; expected a folder under {root} (--guard-operator-output-dir)", None
    return None, None


async def peer_listening(host: str, port: int, timeout_s: float = _PEER_CONNECT_TIMEOUT_S) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, asyncio.TimeoutError, ValueError):
        return False
    writer.close()
    return True


def _peer(data) -> Optional[tuple[str, list[int]]]:
    if not isinstance(data, dict) or "master_address" not in data:
        return None
    ports = data.get("master_port", data.get("ports"))
    try:
        nums = [int(p) for p in str(ports).split(",") if str(p).strip()]
    except ValueError:
        nums = []
    return str(data["master_address"]), nums


class _RedactingSend:
    """Buffers a JSON answer and redacts it before it leaves."""

    def __init__(self, send, secrets_):
        self.send, self.secrets, self.start, self.buf = send, secrets_, None, None

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            ctype = dict((k.lower(), v) for k, v in message.get("headers", [])).get(b"content-type", b"")
            if ctype.startswith(b"application/json"):
                self.start, self.buf = message, bytearray()
                return
            return await self.send(message)
        if message["type"] == "http.response.body" and self.buf is not None:
            self.buf += message.get("body", b"")
            if message.get("more_body"):
                return
            body = bytes(self.buf)
            try:
                body = json.dumps(redact(json.loads(body), self.secrets)).encode()
            except ValueError:
                pass
            headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await self.send({**self.start, "headers": headers})
            return await self.send({"type": "http.response.body", "body": body})
        return await self.send(message)


class RouteGuardMiddleware:
    def __init__(self, app, ops: OpsConfig, keys: rp.Keys):
        self.app = app
        self.ops = ops
        self.keys = keys
        self.limit_bytes = int(ops.guard_max_body_mb * (1 << 20))

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        headers = dict((k.lower(), v) for k, v in scope.get("headers", []))
        token = rp.bearer(headers.get(b"authorization", b"").decode("latin-1"))
        decision = rp.decide(path, token, self.keys)
        if scope["type"] == "websocket":
            if not decision.allowed or shutdown.draining():
                return await send({"type": "websocket.close", "code": 1008})
            return await self.app(scope, receive, send)
        if not decision.allowed:
            logger.info("guard: %d %s %s", decision.status, scope.get("method"), path)
            extra = [(b"www-authenticate", b"Bearer")] if decision.status == 401 else []
            return await send_error(send, decision.status, decision.message, extra, path)
        cls = rp.classify(path)
        if shutdown.draining() and (cls == rp.INFERENCE or path in ("/health", "/health_generate", "/ready")):
            return await send_error(send, 503, "the server is shutting down; send the request to another replica",
                                    [(b"retry-after", b"5")], path)
        if scope.get("method") in _BODY_METHODS:
            length = headers.get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.limit_bytes:
                return await self._too_large(send, int(length), receive, path)
            try:
                body = await read_body(receive, self.limit_bytes)
            except BodyTooLarge as e:
                return await self._too_large(send, e.args[0], receive, path)
            data = None
            if body[:1] in (b"{", b"[") or body.lstrip()[:1] in (b"{", b"["):
                try:
                    data = json.loads(body)
                except RecursionError:
                    return await send_error(send, 400, "request body: JSON nested too deeply to parse; expected "
                                                       "a request object", path=path)
                except ValueError:
                    data = None                          # SGLang's own 400 (scrubbed by the request guard)
                else:
                    scope[JSON_KEY] = data
            refusal, replacement = output_dir_refusal(path, data, self.ops.guard_operator_output_dir)
            if refusal:
                return await send_error(send, 400, refusal, path=path)
            if replacement is not None:
                body, data = json.dumps(replacement).encode(), replacement
                scope[JSON_KEY] = data
                scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"] + \
                    [(b"content-length", str(len(body)).encode())]
            receive = replaying(body, receive)
            if cls == rp.BLOCKING:
                return await self._blocking(scope, receive, send, path, data)
        elif path == "/start_profile":
            refusal, replacement = output_dir_refusal(path, None, self.ops.guard_operator_output_dir)
            if refusal:
                return await send_error(send, 400, refusal, path=path)
            scope = {**scope, "method": "POST"}
            body = json.dumps(replacement).encode()
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"content-length",
                                                                                       b"content-type")] + \
                [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
            receive = replaying(body, receive)
        if cls in (rp.STATUS, rp.OPERATOR) and not path.startswith("/metrics"):
            send = _RedactingSend(send, (self.keys.api_key, self.keys.admin_api_key, self.keys.internal_token))
        return await self._call_app(scope, receive, send, path)

    async def _call_app(self, scope, receive, send, path):
        """A handler that raises ValueError / TypeError on what the client sent (SGLang does, e.g.
        /parse_function_call without a parser) answers 400 with the scrubbed message, not a 500 and
        a traceback in the log."""
        started = []

        async def tracking(message):
            if message["type"] == "http.response.start":
                started.append(True)
            await send(message)
        try:
            await self.app(scope, receive, tracking)
        except (ValueError, TypeError) as e:
            if started:
                raise
            logger.info("guard: 400 %s %s: %s: %s", scope.get("method"), path, type(e).__name__, e)
            await send_error(send, 400, scrub(str(e)) or "invalid request", path=path)
        except RuntimeError as e:
            # SGLang's tokenizer manager raises RuntimeError(scheduler's message) when the scheduler
            # refuses a profiler call for its state ("Profiling is not in progress. Call
            # /start_profile first."): a conflict with the server's state, not a server error
            if started or path not in _PROFILE_ROUTES:
                raise
            logger.info("guard: 409 %s %s: %s", scope.get("method"), path, e)
            await send_error(send, 409, f"{path}: {scrub(str(e)) or 'refused by the scheduler'}", path=path)

    async def _too_large(self, send, size: int, receive, path: str):
        # read (and drop) what the client is still sending, up to a bound, so it sees the 413 rather
        # than a reset connection; nothing of it is kept or parsed
        try:
            await read_body(receive, _DISCARD_FACTOR * self.limit_bytes)
        except BodyTooLarge:
            pass
        return await send_error(send, 413, f"request body: got {size} bytes or more; expected at most "
                                           f"{self.limit_bytes} (raise with --guard-max-body-mb)", path=path)

    async def _blocking(self, scope, receive, send, path, data):
        peer = _peer(data)
        if peer is not None:
            host, ports = peer
            for port in ports[:1]:
                if not await peer_listening(host, port):
                    return await send_error(send, 400, f"{path}: nothing accepts connections at {host}:{port} "
                                                       f"within {_PEER_CONNECT_TIMEOUT_S:g} s; start the peer "
                                                       f"first (the scheduler would wait for it indefinitely)")
        started = {}

        async def tracking(message):
            if message["type"] == "http.response.start":
                started["yes"] = True
            await send(message)
        try:
            await asyncio.wait_for(self.app(scope, receive, tracking), self.ops.guard_blocking_timeout_s)
        except asyncio.TimeoutError:
            logger.error("guard: %s did not finish within %g s", path, self.ops.guard_blocking_timeout_s)
            if not started:
                await send_error(send, 504, f"{path} did not finish within {self.ops.guard_blocking_timeout_s:g} s "
                                            f"(--guard-blocking-timeout-s)")


def new_internal_token() -> str:
    return secrets.token_hex(24)


def install(ops: OpsConfig, keys: rp.Keys) -> None:
    """Add the route guard as the outermost middleware of SGLang's app (call it last), and the
    connection limits below it (connection_limits.py: header deadline, connections per client)."""
    from sglang.srt.entrypoints import http_server

    from . import connection_limits

    http_server.app.add_middleware(RouteGuardMiddleware, ops=ops, keys=keys)
    connection_limits.install(ops.guard_header_timeout_s, ops.guard_max_connections_per_client)
