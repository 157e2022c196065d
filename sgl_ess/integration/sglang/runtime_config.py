"""Change the ESS overlap level of a running server, through SGLang's own /set_internal_state:

    curl -s -X POST 127.0.0.1:30000/set_internal_state -H 'Content-Type: application/json' \\
         -d '{"server_args": {"ess_prefetch_overlap_level": "dba"}}'

The scheduler validates every key before applying any (SGLang's contract): an unknown level
is refused with the allowed values in the log and `updated: false`. The level takes effect from
the next layer planned; plans already in flight finish under the level that made them.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sgl_ess.attention.overlap import LEVELS

from . import lifecycle, targets

KEY = "ess_prefetch_overlap_level"


class _LevelHandler:
    """Duck-types SGLang's update handler (validate, apply)."""

    def validate(self, key: str, value: Any) -> None:
        from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected

        if lifecycle.active_store() is None:
            raise UpdateRejected(f"{key}: ESS is off on this server (--ess-enabled false)")
        if value not in LEVELS:
            raise UpdateRejected(f"{key}: got {value!r}; allowed: {', '.join(LEVELS)}")

    def apply(self, key: str, value: Any):
        for adapter in lifecycle.all_adapters():
            adapter.set_level(value)
        return None


def _after_update_handlers(result, *args, **kwargs):
    result[KEY] = _LevelHandler()
    return result


def register() -> None:
    HookRegistry.register(targets.UPDATE_HANDLERS, _after_update_handlers, HookType.AFTER)
