"""The scheduler step watchdog (issue 38, item 2): a step longer than ``--guard-step-watchdog-s``
is logged with its requests, /health answers 503 saying why while it lasts, and a request whose
stop_regex is being evaluated when it happens is aborted.

AROUND hooks on ``Scheduler.run_batch`` and ``Scheduler.process_batch_result`` (targets
SCHEDULER_RUN_BATCH, SCHEDULER_PROCESS_RESULT), registered with pattern_eval.py in processes of a
launcher-started server. The bookkeeping is ``sgl_ess.serving.step_watch.StepWatch``; a daemon
thread of the scheduler process checks it four times per bound.

The abort is SGLang's own cooperative one (``req.to_finish``: applied at the request's next
finish check), never an exception thrown into the scheduler thread. A pattern search is bounded
anyway (RE2 is linear; Python re runs under ``--guard-pattern-budget-ms``), so in practice the
watchdog is what reports a step slowed by something else.

/health reads the report from a file the scheduler writes while the stall lasts
(``stall_dir()/sgl_ess_stall_<run id>_<scheduler pid>.json``) -- the scheduler cannot answer a
status request while it is stuck. The run id is ``SGLESS_RUN_ID``, which the launcher exports
before SGLang starts (launcher/process_env.py) and every server process inherits: with
--dp-size > 1 the schedulers are children of SGLang's DataParallelController, not of the HTTP
process. Without it (a process not started by the launcher) the key is the HTTP process's pid,
the scheduler's parent. The launcher's cleanup removes the run's stall files (a scheduler killed
mid-stall leaves its file).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import tempfile
import threading
import time
from http import HTTPStatus
from typing import Optional

from sgl_ess.serving.ops_config import ops_from_env
from sgl_ess.serving.step_watch import WATCHDOG_FLAG, StepWatch

ENV_RUN_ID = "SGLESS_RUN_ID"      # the run id the launcher exports (launcher/process_env.apply)
logger = logging.getLogger("sgl_ess.watchdog")
_watch: Optional[StepWatch] = None
_thread: Optional[threading.Thread] = None
_lock = threading.Lock()


def stall_dir() -> str:
    return tempfile.gettempdir()


def _run_key(fallback_pid: int) -> str:
    return os.environ.get(ENV_RUN_ID) or str(fallback_pid)


def _stall_path() -> str:
    return os.path.join(stall_dir(), f"sgl_ess_stall_{_run_key(os.getppid())}_{os.getpid()}.json")


def _run_stall_files() -> list[str]:
    return sorted(glob.glob(os.path.join(stall_dir(), f"sgl_ess_stall_{glob.escape(_run_key(os.getpid()))}_*.json")))


def remove_stall_files() -> None:
    """Remove this run's stall files (the launcher's exit paths)."""
    for path in _run_stall_files():
        try:
            os.unlink(path)
        except OSError:
            pass


def stall_reasons() -> list[str]:
    """The reasons every scheduler of this server reports a stall now (read by /health)."""
    out = []
    for path in _run_stall_files():
        try:
            with open(path) as fh:
                out.append(json.load(fh)["reason"])
        except (OSError, ValueError, KeyError):
            continue
    return out


def watch() -> Optional[StepWatch]:
    return _watch


def _report(stall) -> None:
    reason = stall.reason(_watch.bound_s)
    logger.error("watchdog: %s", reason)
    if stall.culprit is not None:
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        stall.culprit.to_finish = FINISH_ABORT(
            f"request {stall.culprit_rid} was aborted: the scheduler spent more than {_watch.bound_s:g} s in one "
            f"step evaluating its stop_regex ({WATCHDOG_FLAG})", HTTPStatus.BAD_REQUEST, "BadRequestError")
    try:
        tmp = _stall_path() + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"reason": reason}, fh)
        os.replace(tmp, _stall_path())
    except OSError:
        logger.exception("watchdog: could not write the stall report for /health")


def _clear() -> None:
    logger.warning("watchdog: the slow scheduler step has ended")
    try:
        os.unlink(_stall_path())
    except OSError:
        pass


def _run() -> None:
    period = max(0.05, _watch.bound_s / 4)
    while True:
        time.sleep(period)
        try:
            stall = _watch.check(time.monotonic())
            if stall is not None:
                _report(stall)
        except Exception:  # noqa: BLE001 - the watchdog must outlive any one bad report
            logger.exception("watchdog")


def _ensure_started() -> None:
    global _watch, _thread
    with _lock:
        if _thread is None:
            _watch = StepWatch(ops_from_env().guard_step_watchdog_s)
            _thread = threading.Thread(target=_run, name="sgl-ess-step-watchdog", daemon=True)
            _thread.start()


def _around(phase: str):
    def hook(original_fn, scheduler, batch, *args, **kwargs):
        if _thread is None:
            _ensure_started()
        _watch.begin(phase, batch, time.monotonic())
        try:
            return original_fn(scheduler, batch, *args, **kwargs)
        finally:
            if _watch.end():
                _clear()
    return hook


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .. import targets

    HookRegistry.register(targets.SCHEDULER_RUN_BATCH, _around("run_batch"), HookType.AROUND)
    HookRegistry.register(targets.SCHEDULER_PROCESS_RESULT, _around("process_batch_result"), HookType.AROUND)
