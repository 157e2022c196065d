"""``--ess-slo-tpot-ms``: the scheduler admits new requests only up to the SLO controller's cap
(sgl_ess.core.slo_control), measured from its own decode steps.

Hooks (targets.py): AFTER ``Scheduler.run_batch`` records the end of every decode step;
AROUND ``Scheduler.get_num_allocatable_reqs`` (how many requests SGLang's prefill adder may
start now) returns at most ``cap - running``. Running requests are never preempted, so the
batch shrinks as requests finish. Without a target neither hook changes anything. The cap is
decided from this process's own timing, so it is refused with attention TP > 1 (ranks of a TP
group must schedule identical batches; compat.py).
"""

from __future__ import annotations

import time

from sgl_ess.config import config_from_env
from sgl_ess.core.slo_control import SloBatchController, SloSettings

_controller: SloBatchController | None = None
_built = False


def controller(sched=None) -> SloBatchController | None:
    """This scheduler's controller (None without a target). Built on first use from the config."""
    global _controller, _built
    if not _built and sched is not None:
        _built = True
        cfg = config_from_env()
        if cfg is not None and cfg.slo_tpot_ms > 0:
            _controller = SloBatchController(SloSettings(
                target_ms=cfg.slo_tpot_ms, max_cap=int(sched.max_running_requests),
                percentile=cfg.slo_itl_percentile, floor=min(cfg.slo_min_batch, int(sched.max_running_requests))))
    return _controller


def _running(sched) -> int:
    rb = getattr(sched, "running_batch", None)
    return len(getattr(rb, "reqs", []) or []) if rb is not None else 0


def _after_run_batch(result, sched, batch, *args, **kwargs):
    c = controller(sched)
    if c is not None and batch is not None and batch.forward_mode.is_decode():
        c.step_done(time.monotonic(), batch.batch_size())
    return result


def _around_allocatable(original_fn, sched, running_bs, *args, **kwargs):
    n = original_fn(sched, running_bs, *args, **kwargs)
    c = controller(sched)
    return n if c is None else c.admit(running_bs, n)


def state() -> dict | None:
    return _controller.state() if _controller is not None else None


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .. import targets

    HookRegistry.register(targets.SCHEDULER_RUN_BATCH, _after_run_batch, HookType.AFTER)
    HookRegistry.register(targets.SCHEDULER_ALLOCATABLE, _around_allocatable, HookType.AROUND)
