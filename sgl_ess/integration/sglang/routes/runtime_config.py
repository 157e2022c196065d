"""Change the ESS overlap level of a running server:

    curl -s -X POST 127.0.0.1:30000/ess/overlap_level -H 'Content-Type: application/json' -d '{"level": "dba"}'

The route (on SGLang's FastAPI app) forwards to every scheduler through SGLang's own internal-state
channel (/set_internal_state), whose request schema carries numbers only, so the level travels
as its index in LEVELS under the key `ess_prefetch_overlap_level`. The schedulers validate
before applying; an unknown level is a 400 naming the allowed values. The level takes effect
from the next layer planned; plans already in flight finish under the level that made them.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sgl_ess.attention.overlap import LEVELS

from ..pools import lifecycle
from .. import targets

KEY = "ess_prefetch_overlap_level"


class _LevelHandler:
    """Duck-types SGLang's update handler (validate, apply)."""

    def validate(self, key: str, value: Any) -> None:
        from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected

        if lifecycle.active_store() is None:
            raise UpdateRejected(f"{key}: ESS is off on this server (--ess-enabled false)")
        if not isinstance(value, (int, float)) or int(value) != value or not 0 <= int(value) < len(LEVELS):
            raise UpdateRejected(f"{key}: got {value!r}; expected an index into {list(LEVELS)}")
        if any(a.graphs.captures for a in lifecycle.all_adapters()):
            raise UpdateRejected(f"{key}: the overlap level is fixed in the decode CUDA graphs this server captured "
                                 "(--ess-cuda-graph); restart with --ess-prefetch-overlap-level to change it")

    def apply(self, key: str, value: Any):
        for adapter in lifecycle.all_adapters():
            adapter.set_level(LEVELS[int(value)])
        return None


def _after_update_handlers(result, *args, **kwargs):
    result[KEY] = _LevelHandler()
    return result


def register() -> None:
    HookRegistry.register(targets.UPDATE_HANDLERS, _after_update_handlers, HookType.AFTER)


def install_route() -> None:
    """POST /ess/overlap_level {"level": ...} on SGLang's app (the launcher process)."""
    from fastapi.responses import ORJSONResponse
    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.io_struct import SetInternalStateReq

    if any(getattr(r, "path", None) == "/ess/overlap_level" for r in http_server.app.routes):
        return

    @http_server.app.post("/ess/overlap_level")
    async def ess_overlap_level(body: dict):
        level = body.get("level") if isinstance(body, dict) else None
        if level not in LEVELS:
            return ORJSONResponse({"error": f"level: got {level!r}; allowed: {', '.join(LEVELS)}"}, status_code=400)
        tm = http_server.get_global_state().tokenizer_manager
        updated = await tm.set_internal_state(SetInternalStateReq(server_args={KEY: LEVELS.index(level)}))
        if not all(updated):
            return ORJSONResponse({"error": "a scheduler refused the level (is ESS on? see the server log)",
                                   "updated": updated}, status_code=409)
        return {"level": level, "updated": updated}
