"""``GET /health`` that reflects ESS state, for load balancers (ASGI middleware on SGLang's app).

SGLang answers first (503 while starting, shutting down, or after a failed health check); when it
says 200, every scheduler is asked for its ESS state (the internal-state channel, bounded by
``--health-timeout-s``) and the answer is 503 if
  * a scheduler does not answer in time,
  * ESS is configured on but a scheduler has no ESS store (the backend did not build it),
  * a scheduler step has run longer than ``--guard-step-watchdog-s`` (scheduler_watchdog.py; asked
    first, without waiting for SGLang: the stuck scheduler could not answer),
  * the store reports its prefetch engine not running (``usage()["prefetch"]["state"] == "closed"``,
    or ``worker_alive`` False). A worker that fell back to inline fetches (state "inline") still
    serves: 200, and the body shows the state and the last fault.
The body is JSON: ``{"status": "ok"|"unhealthy", "reason": ..., "schedulers": [...]}`` with each
scheduler's host pool live / cached / free tokens, open hot buffers and queue.
"""

from __future__ import annotations

import asyncio
import json
import logging

from sgl_ess.config import config_from_env

from ..observe.scheduler_state import merged
from ..observe.scheduler_watchdog import stall_reasons

logger = logging.getLogger("sgl_ess.health")


def verdict(states: list[dict], ess_configured_on: bool) -> tuple[bool, str]:
    """(healthy, reason) from each scheduler's ``ess`` entry."""
    for i, s in enumerate(states):
        if ess_configured_on and not s.get("enabled"):
            return False, f"scheduler {i}: ESS is configured on but this scheduler has no ESS store"
        prefetch = s.get("prefetch") if isinstance(s.get("prefetch"), dict) else {}
        if prefetch.get("worker_alive") is False or prefetch.get("state") == "closed":
            return False, f"scheduler {i}: the ESS prefetch engine is not running (state {prefetch.get('state')!r})"
    return True, ""


def _summary(s: dict) -> dict:
    keys = ("enabled", "host_tokens_live", "host_tokens_cached", "host_tokens_free", "host_tokens_capacity",
            "hot_requests_open", "hit_rate", "queue", "kv_pool_tokens_live", "kv_pool_tokens_cached",
            "kv_pool_tokens_free")
    out = {k: s[k] for k in keys if k in s}
    p = s.get("prefetch")
    if isinstance(p, dict):
        out["prefetch"] = {k: p[k] for k in ("engine", "state", "worker_alive", "restarts", "worker_restarts",
                                             "last_fault") if k in p}
    return out


class EssHealthMiddleware:
    def __init__(self, app, timeout_s: float):
        self.app = app
        self.timeout_s = timeout_s
        cfg = config_from_env()
        self.ess_on = bool(cfg and cfg.enabled)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") != "/health" or scope.get("method") != "GET":
            return await self.app(scope, receive, send)
        stalled = stall_reasons()                     # a scheduler stuck in one step cannot answer below
        if stalled:
            return await self._answer(send, False, "; ".join(stalled), [])
        status = {}

        async def capture(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            if status.get("code") != 200:
                await send(message)

        await self.app(scope, receive, capture)
        if status.get("code") != 200:
            return
        ok, reason, schedulers = await self._ess()
        await self._answer(send, ok, reason, schedulers)

    async def _answer(self, send, ok: bool, reason: str, schedulers: list) -> None:
        if not ok:
            logger.warning("health: 503: %s", reason)
        body = json.dumps({"status": "ok" if ok else "unhealthy", "reason": reason or None,
                           "schedulers": schedulers}).encode()
        await send({"type": "http.response.start", "status": 200 if ok else 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _ess(self) -> tuple[bool, str, list]:
        from sglang.srt.entrypoints import http_server

        try:
            states = await asyncio.wait_for(http_server.get_global_state().tokenizer_manager.get_internal_state(),
                                            self.timeout_s)
        except asyncio.TimeoutError:
            return False, f"a scheduler did not report its ESS state within {self.timeout_s:g} s", []
        ess = [merged(s) for s in states]
        ok, reason = verdict(ess, self.ess_on)
        return ok, reason, [_summary(s) for s in ess]


def install(timeout_s: float) -> None:
    from sglang.srt.entrypoints import http_server

    http_server.app.add_middleware(EssHealthMiddleware, timeout_s=timeout_s)
