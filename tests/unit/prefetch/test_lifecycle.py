"""Process lifecycle: interpreter exit leaves nothing behind, workers follow their parent's death
(also during start-up, while the ipc directory exists), and a worker that cannot start gives
EngineDeadError naming the cause. close() is checked at the end of test_faults' SIGKILL test."""
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sgl_ess.prefetch.client import WorkerEngine
from sgl_ess.prefetch.engine import EngineDeadError
from tests.unit.prefetch.helpers import make_memory, our_dirs, pid_alive, wait_until

ROOT = Path(__file__).resolve().parents[3]
PR_SET_CHILD_SUBREAPER = 36


def _parent(mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name("parent_process.py")), mode],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))


@contextlib.contextmanager
def _subreaper():
    """Orphans are re-parented to this process, so the test can reap them and read their status."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _reap(pid: int, timeout_s: float = 20.0) -> int | None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    return None


def _worker_children(pid: int) -> list[int]:
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(k) for k in kids]


def test_workers_exit_when_their_parent_is_killed():
    """One SIGKILLed parent, two workers: A was connected (its ipc dir already gone), B was still
    starting (its ipc dir on disk, nobody else left to remove it). Both exit cleanly; no dir stays."""
    dirs = our_dirs()
    with _subreaper():
        parent = _parent("kill")
        line = parent.stdout.readline()
        assert line, parent.stderr.read()
        a_pid = json.loads(line)["worker_pid"]
        assert our_dirs() == dirs                              # A is connected: no files on disk
        parent.stdin.write("start B\n")                      # only now: B's ipc dir cannot be mistaken for A's
        parent.stdin.flush()
        wait_until(lambda: len(our_dirs() - dirs) == 1 and len(_worker_children(parent.pid)) == 2, 60.0,
                   "engine B's worker to be spawned")
        b_dir = (our_dirs() - dirs).pop()
        b_pid = [p for p in _worker_children(parent.pid) if p != a_pid][0]
        parent.kill()                                          # SIGKILL: no cleanup runs in the parent
        parent.wait(10)
        assert Path(b_dir).exists()                            # B's worker still importing: nobody removed it
        assert _reap(a_pid) == 0, "worker A did not exit cleanly within 20 s"
        assert _reap(b_pid, 60.0) == 0, "worker B did not exit cleanly within 60 s"
    assert not pid_alive(a_pid) and not pid_alive(b_pid) and our_dirs() == dirs


def test_interpreter_exit_without_close_stops_the_worker():
    dirs = our_dirs()
    parent = _parent("exit")
    line = parent.stdout.readline()
    assert parent.wait(30) == 0, parent.stderr.read()
    wpid = json.loads(line)["worker_pid"]
    assert not pid_alive(wpid) and our_dirs() == dirs         # reaped by the parent before it exited


def test_bad_python_names_the_cause():
    dirs = our_dirs()
    with pytest.raises(EngineDeadError, match=r"could not execute '/nonexistent/python'.*--ess-prefetch-engine inline"):
        WorkerEngine(make_memory(seed=0), python="/nonexistent/python")
    assert our_dirs() == dirs


def test_worker_that_exits_at_start_names_exit_code_and_stderr():
    dirs = our_dirs()
    with pytest.raises(EngineDeadError, match=r"exited with code 1.*last stderr: .*(PYTHONHOME|encodings)"):
        WorkerEngine(make_memory(seed=0), env={"PYTHONHOME": "/nonexistent"})
    assert our_dirs() == dirs


def test_non_shared_memory_is_refused_with_the_flag():
    mem = make_memory(seed=0)
    mem.host_segment = None                                   # what CUDA placement looks like
    with pytest.raises(EngineDeadError, match="cannot start.*--ess-prefetch-engine inline"):
        WorkerEngine(mem)
