"""``GET /ess/status``: the ESS configuration as given, and what each scheduler really uses.

Per scheduler (see scheduler_state.py): host pool tokens live / cached (evictable prefix cache) /
free / capacity, ``host_bytes`` and ``memory_pool_size_gb_effective`` (the host memory actually
allocated, whatever flag sized it), hot-buffer use, hit rate, rows fetched, the queue (waiting
requests, oldest wait), ``pool_sizing`` (which flag set the pool size) and ``memory`` (the
startup report of scheduler 0: host and device bytes by role). Official seam: a route
on SGLang's FastAPI app; the scheduler's numbers come through its internal-state channel.
"""

from __future__ import annotations

import json
import os

from sgl_ess.config import ENV_CONFIG_JSON

from ..observe.scheduler_state import merged

ENV_POOL_SIZING = "SGLESS_POOL_SIZING"   # set by the launcher: {"tokens": N, "source": "..."}


def install() -> None:
    from sglang.srt.entrypoints import http_server

    if any(getattr(r, "path", None) == "/ess/status" for r in http_server.app.routes):
        return

    @http_server.app.get("/ess/status")
    async def ess_status():
        states = await http_server.get_global_state().tokenizer_manager.get_internal_state()
        cfg = os.environ.get(ENV_CONFIG_JSON)
        sizing = os.environ.get(ENV_POOL_SIZING)
        info = getattr(http_server.get_global_state(), "scheduler_info", None) or {}
        return {"config": json.loads(cfg) if cfg else None,
                "pool_sizing": json.loads(sizing) if sizing else None,
                "memory": info.get("ess_memory"),         # scheduler 0's startup report: where every byte went
                "schedulers": [merged(s) for s in states]}
