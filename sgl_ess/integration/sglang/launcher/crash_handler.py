"""One clear line and a distinct exit code when a server process dies (sgl_ess.serving.exit_codes).

SGLang 0.5.23 answers a dead child (its SubprocessWatchdog, or a scheduler exception) with SIGQUIT
to the launcher, whose handler waits 5 s plus 60 s "for CUDA coredumps" (also on CPU machines),
then SIGKILLs the whole tree including itself: exit 137, which supervisors read as out-of-memory.
Here (official seams: ``ServerArgs.custom_sigquit_handler`` for the launch phase and the
TokenizerManager's ``signal_handler_class`` for the serving phase, set by tokenizer.py) the
launcher names the process that died, stops the others, and exits with STARTUP_FAILED (4) or
PROCESS_DIED (5). Before it exits, every open request is ended with an error (shutdown.end_all)
and the event loop gets a moment to send it, so a streaming client reads an error event rather
than a body cut mid-stream. The launcher turns the coredump / py-spy waits off on machines
without CUDA. SIGTERM starts shutdown.py's bounded drain. Every exit here also removes the
server's /dev/shm files (shm_files.py).

A stop of the whole process group (``kill -TERM -PGID``, systemd's default ``KillMode=control-group``,
a test harness) delivers SIGTERM to the schedulers too: they exit at once and the launcher sees them
gone. When the launcher is already draining on its own SIGTERM and every process that went died of
SIGTERM, that is the stop that was asked for, not a crash: open requests end with a 503 ("the server
is shutting down"), one line says so, and the exit is 0.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import psutil

from sgl_ess.serving import exit_codes

from . import shm_files, shutdown

logger = logging.getLogger("sgl_ess.launch_server")
_children: dict[int, str] = {}    # pid -> process title, recorded when the server is ready
_ready = False
_ERROR_FLUSH_S = 1.5             # how long the loop may send the error events before the exit


def _title(p: psutil.Process) -> str:
    try:
        return p.name() or " ".join(p.cmdline()[:1])
    except psutil.Error:
        return f"pid {p.pid}"


def on_ready() -> None:
    """launch_callback: the server is up; remember its processes to name the one that dies."""
    global _ready
    _ready = True
    for p in psutil.Process().children(recursive=True):
        _children[p.pid] = _title(p)
    shm_files.record()                                   # its /dev/shm files, removed at exit


def is_ready() -> bool:
    return _ready


def _dead_children(known: dict[int, int] | None = None) -> list[tuple[str, int | None]]:
    """(name pid (how), exit code or None) of each recorded child that is gone; `known`: exit codes
    already reaped by SGLang's watchdog (multiprocessing), by pid."""
    dead = []
    for pid, name in _children.items():
        try:
            st = psutil.Process(pid).status()
            if st != psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            pass
        code = None
        try:
            wpid, status = os.waitpid(pid, os.WNOHANG)
            if wpid == pid:
                code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass
        if code is None and known:
            code = known.get(pid)
        how = "" if code is None else (f" (killed by signal {-code})" if code < 0 else f" (exit code {code})")
        dead.append((f"{name} pid {pid}{how}", code))
    return dead


_fatal_once = threading.Lock()


def fatal_exit(code: int, what: str) -> None:
    """Print one line, stop every child, exit with `code` (never returns; a second caller, e.g. the
    fallback timer, returns at once while the first one exits). Exit 0 is a stop, not a failure."""
    if not _fatal_once.acquire(blocking=False):
        return
    kind = "stopped" if code == exit_codes.OK else "fatal"
    line = f"sgl_ess.launch_server: {kind}: {what}; stopped all server processes (exit {code}, " \
           f"{exit_codes.NAMES[code]})"
    (logger.warning if code == exit_codes.OK else logger.error)(line)
    print(line, file=sys.stderr, flush=True)
    shm_files.record()
    try:
        from sglang.srt.utils import kill_process_tree

        kill_process_tree(os.getpid(), include_parent=False, wait_timeout=10)
    except Exception:  # noqa: BLE001 - exiting anyway; what failed is in the log above
        logger.exception("stopping server processes")
    shm_files.remove_all()
    from ..observe.scheduler_watchdog import remove_stall_files

    remove_stall_files()
    os._exit(code)


def launch_phase_handler(signum=None, frame=None) -> None:
    """ServerArgs.custom_sigquit_handler: a child died before the server was ready."""
    fatal_exit(exit_codes.STARTUP_FAILED, "a server process failed while starting (its error is above)")


_exiting = False


def _running_phase(tokenizer_manager) -> None:
    global _exiting
    if _exiting:
        return                                           # a repeated SIGQUIT while the errors are sent
    watchdog = getattr(tokenizer_manager, "_subprocess_watchdog", None)
    if watchdog is not None:
        watchdog.stop()
    try:
        tokenizer_manager.dump_requests_before_crash()     # returns at once unless --crash-dump-folder
    except Exception:  # noqa: BLE001
        logger.exception("crash dump")
    if not _ready:
        launch_phase_handler()
    reaped = {p.pid: p.exitcode for p in (getattr(watchdog, "_processes", None) or [])
              if getattr(p, "exitcode", None) is not None}
    dead = _dead_children(reaped)
    stop = shutdown.draining() and bool(dead) and all(c == -signal.SIGTERM for _, c in dead)
    if stop:
        code = exit_codes.OK
        what = ("SIGTERM reached the server processes too (a process-group stop): " +
                ", ".join(d for d, _ in dead))
        message, status = "the server is shutting down (stopped by SIGTERM); retry on another replica", 503
    else:
        code = exit_codes.PROCESS_DIED
        what = ("server process died while serving: " + ", ".join(d for d, _ in dead)) if dead else \
            "a server process reported a fatal error while serving (its error is above)"
        message, status = ("the server failed while serving this request (a server process died); "
                           "retry on another replica"), 500
    loop = getattr(tokenizer_manager, "event_loop", None)
    try:
        ended = shutdown.end_all(tokenizer_manager, message, status)
    except Exception:  # noqa: BLE001 - exiting anyway
        logger.exception("ending open requests")
        ended = 0
    if ended and loop is not None and loop.is_running():
        _exiting = True
        shutdown.begin_drain()                           # nothing new is admitted meanwhile
        # the handler runs on the loop's thread: return to it so the error events are sent, then exit
        threading.Timer(_ERROR_FLUSH_S * 3, fatal_exit, (code, what)).start()
        loop.call_later(_ERROR_FLUSH_S, fatal_exit, code, what)
        return
    fatal_exit(code, what)


def _signal_handler_class():
    from sglang.srt.managers.tokenizer_manager import SignalHandler

    class EssSignalHandler(SignalHandler):
        def sigterm_handler(self, signum=None, frame=None):
            super().sigterm_handler(signum, frame)
            shutdown.begin_drain()

        def running_phase_sigquit_handler(self, signum=None, frame=None):
            _running_phase(self.tokenizer_manager)

    return EssSignalHandler


EssSignalHandler = _signal_handler_class()
