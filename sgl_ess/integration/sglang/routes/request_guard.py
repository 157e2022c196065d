"""The request guard: an ASGI middleware in front of SGLang's FastAPI app (official seam:
``sglang.srt.entrypoints.http_server.app``), installed by the launcher before the server starts.

Inbound: bodies of /v1/completions, /v1/chat/completions, /generate (any method) and
/v1/detokenize are checked by ``sgl_ess.serving.request_rules`` and refused with a 400 (404 for an
unknown model) that names the field and the allowed range; the scheduler never sees them. That
includes every client pattern (``pattern_bound.py``: stop_regex compiles with RE2, grammars bounded
in size), object fields of the wrong type or nested too deep, a ``sampling_params`` list that does
not match the prompts, and a prompt that cannot fit the context (``prompt_bound.py``), the last
before anything is tokenized. Accepted bodies are replayed to SGLang
unchanged. The same rules also run in the tokenizer manager on every route's request object
(tokenizer.py), so other routes (/invocations, /vertex_generate, ...) cannot walk around them.
Outbound: every JSON error body (any route, any status >= 400) and every streamed
``error`` event is scrubbed of server paths and tracebacks (``sgl_ess.serving.sanitize``); 5xx
bodies say only that the server failed. The full text stays in the server log.
"""

from __future__ import annotations

import json
import logging
from typing import Optional

from sgl_ess.serving.ops_config import OpsConfig
from sgl_ess.serving.request_rules import GUARDED_PATHS, Refusal, ServingFacts, check
from sgl_ess.serving.sanitize import error_body, scrub

from .route_guard import JSON_KEY, read_body, replaying

logger = logging.getLogger("sgl_ess.guard")


def serving_facts(deterministic: bool) -> Optional[ServingFacts]:
    """Facts the rules need, from SGLang's HTTP-process state (None until the server is up)."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.entrypoints.openai.protocol import DEFAULT_MODEL_NAME

    state = http_server.get_global_state()
    if state is None:
        return None
    tm = state.tokenizer_manager
    names = [getattr(tm, "served_model_name", None), DEFAULT_MODEL_NAME, getattr(tm, "model_path", None)]
    names = tuple(dict.fromkeys(n for n in names if n))
    if hasattr(tm, "ess_facts"):                         # EssTokenizerManager: also the prompt-length bound
        return tm.ess_facts(names, deterministic)
    vocab = getattr(getattr(tm, "model_config", None), "vocab_size", None)
    return ServingFacts(vocab_size=vocab, model_names=names, deterministic=deterministic)


async def _send_json(send, status: int, payload: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def _scrub_json(obj, server_error: bool):
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("message", "detail", "msg") and isinstance(v, str):
                out[k] = "internal server error (details are in the server log)" if server_error else scrub(v)
            else:
                out[k] = _scrub_json(v, server_error)
        return out
    if isinstance(obj, list):
        return [_scrub_json(v, server_error) for v in obj]
    if isinstance(obj, str) and server_error:
        return scrub(obj)
    return obj


class _ScrubbingSend:
    """Wraps `send`: buffers JSON error bodies and rewrites them; scrubs streamed error events."""

    def __init__(self, send):
        self.send = send
        self.status = 200
        self.headers = []
        self.buffer: Optional[bytearray] = None
        self.stream = False

    async def __call__(self, message):
        t = message["type"]
        if t == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
            ctype = dict((k.lower(), v) for k, v in self.headers).get(b"content-type", b"")
            self.stream = ctype.startswith(b"text/event-stream")
            if self.status >= 400 and ctype.startswith(b"application/json"):
                self.buffer = bytearray()
                return                                   # start is sent with the rewritten body
            return await self.send(message)
        if t == "http.response.body" and self.buffer is not None:
            self.buffer += message.get("body", b"")
            if message.get("more_body"):
                return
            body = bytes(self.buffer)
            try:
                body = json.dumps(_scrub_json(json.loads(body), self.status >= 500)).encode()
            except ValueError:
                body = error_body("", self.status, "invalid request" if self.status < 500 else
                                  "internal server error (details are in the server log)")
            headers = [(k, v) for k, v in self.headers if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await self.send({"type": "http.response.start", "status": self.status, "headers": headers})
            return await self.send({"type": "http.response.body", "body": body})
        if t == "http.response.body" and self.stream and b'"error"' in message.get("body", b""):
            message = dict(message, body=_scrub_sse(message["body"]))
        return await self.send(message)


def _scrub_sse(chunk: bytes) -> bytes:
    out = []
    for line in chunk.decode(errors="replace").split("\n"):
        if line.startswith("data:") and '"error"' in line:
            try:
                line = "data: " + json.dumps(_scrub_json(json.loads(line[5:]), False))
            except ValueError:
                pass
        out.append(line)
    return "\n".join(out).encode()


class RequestGuardMiddleware:
    def __init__(self, app, ops: OpsConfig):
        self.app = app
        self.ops = ops

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if scope.get("method") in ("POST", "PUT") and path in GUARDED_PATHS:
            if JSON_KEY in scope:
                refusal = self._check_data(path, scope[JSON_KEY])
            else:
                body = await read_body(receive, 1 << 62)     # installed without the route guard only
                receive = replaying(body, receive)
                refusal = self._check(path, body)
            if refusal is not None:
                logger.info("guard: %d %s %s", refusal.status, path, refusal.message)
                return await _send_json(send, refusal.status, error_body(
                    path, refusal.status, refusal.message, refusal.param,
                    "NotFoundError" if refusal.status == 404 else "BadRequestError"))
        return await self.app(scope, receive, _ScrubbingSend(send))

    def _check(self, path: str, body: bytes) -> Optional[Refusal]:
        try:
            data = json.loads(body) if body else None
        except RecursionError:
            return Refusal(400, "", "request body: JSON nested too deeply to parse; expected a request object")
        except ValueError:
            return None                                  # SGLang answers malformed JSON (scrubbed on the way out)
        return self._check_data(path, data)

    def _check_data(self, path: str, data) -> Optional[Refusal]:
        facts = serving_facts(self.ops.enable_deterministic_inference)
        if facts is None:
            return None
        return check(path, data, self.ops, facts)


def install(ops: OpsConfig) -> None:
    """Add the guard to SGLang's FastAPI app (before the server starts)."""
    from sglang.srt.entrypoints import http_server

    http_server.app.add_middleware(RequestGuardMiddleware, ops=ops)
