"""WorkerHandle: one incarnation of the prefetch worker as its client sees it.

Owns (and releases in `stop`): the worker process, a pidfd on it, the two ZMQ sockets bound for
it, its private ipc directory and an anonymous file holding its stdout/stderr. Borrows: the
client's zmq.Context and the memfds it passes down (StoreMemory segments, CompletionLedger).

The ipc directory (mode 0700, two socket files) exists only while the worker starts: once it
is connected (`ready` received and the plan socket writable) the client unlinks both files and
removes the directory; established ZMQ connections do not need the path. So nothing is left on
disk when SGLang's kill_process_tree SIGKILLs the scheduler and the worker together. Should the
parent die during start-up, the worker removes the directory itself.

Fresh sockets per incarnation: no message of an earlier worker can reach this one's queues.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import orjson
import zmq

from sgl_ess.prefetch.ipc_dir import IPC_DIR_PREFIX, ipc_base_dir
from sgl_ess.prefetch.protocol import Stop, encode


def exit_text(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with code {rc}"


def _private_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix=IPC_DIR_PREFIX, dir=ipc_base_dir()))   # ipc_dir.py: the path rule
    os.chmod(path, 0o700)
    return path


class WorkerHandle:
    def __init__(self, ctx: zmq.Context, inc: int):
        self.inc = inc
        self.proc: subprocess.Popen | None = None
        self.pidfd = -1
        self.ready = False                     # `ready` received (the client still checks the plan socket)
        self.connected = False                 # ready + plan socket writable: ipc files removed
        self.fatal = ""                        # why it cannot work (fatal Error message, exec failure, ...)
        self.started = time.monotonic()
        self.dir: Path | None = _private_dir()
        self.log = tempfile.TemporaryFile(prefix="sgless-worker-")   # unnamed: nothing to clean up
        self.plans = ctx.socket(zmq.PUSH)
        self.events = ctx.socket(zmq.PULL)
        for s in (self.plans, self.events):
            s.setsockopt(zmq.LINGER, 0)
        self.plans.setsockopt(zmq.SNDHWM, 0)   # submit never blocks; the engine bounds what is outstanding
        self.events.setsockopt(zmq.RCVHWM, 0)
        self.plans_ep, self.events_ep = f"ipc://{self.dir}/plans", f"ipc://{self.dir}/events"
        self.plans.bind(self.plans_ep)
        self.events.bind(self.events_ep)
        self.poller = zmq.Poller()             # completions and the worker's exit wake one poll
        self.poller.register(self.events, zmq.POLLIN)

    def spawn(self, cfg: dict, python: str, env: dict, fds: list[int]) -> None:
        """Start the process (same process group as the caller: SGLang's kill_process_tree reaches it)."""
        cfg = dict(cfg, incarnation=self.inc, ipc_dir=str(self.dir), plans_endpoint=self.plans_ep,
                   events_endpoint=self.events_ep)
        cmd = [python, "-m", "sgl_ess.prefetch.worker", "--config", orjson.dumps(cfg).decode()]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=env,
                                         pass_fds=fds, close_fds=True)
        except OSError as e:
            self.fatal = f"could not execute {python!r}: {e}"
            return
        try:
            self.pidfd = os.pidfd_open(self.proc.pid)
            self.poller.register(self.pidfd, zmq.POLLIN)
        except (AttributeError, OSError):
            self.pidfd = -1                    # no pidfd: the client polls in short slices instead

    def check_connected(self) -> bool:
        """After `ready`: once the plan socket has its peer, drop the ipc files and directory."""
        if self.ready and not self.connected and self.plans.poll(0, zmq.POLLOUT):
            self.connected = True
            self._remove_dir()
        return self.connected

    def dead(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def tail(self, lines: int = 4) -> str:
        """The last lines the worker wrote (pread: the worker shares the file offset)."""
        try:
            size = os.fstat(self.log.fileno()).st_size
            text = os.pread(self.log.fileno(), 4096, max(0, size - 4096)).decode(errors="replace")
        except (OSError, ValueError):
            return ""
        return " | ".join(ln.strip() for ln in text.strip().splitlines()[-lines:])

    def stop(self, grace_s: float) -> int | None:
        """Send `stop` and wait up to grace_s when connected, then SIGKILL; reap; release everything
        except the stderr file (read `tail()` first, then `close_log()`)."""
        if self.proc is not None and self.proc.poll() is None:
            if self.connected and grace_s > 0:
                try:
                    self.plans.send(encode(Stop()), zmq.NOBLOCK)
                    self.proc.wait(grace_s)
                except (zmq.ZMQError, subprocess.TimeoutExpired):
                    pass
            if self.proc.poll() is None:
                self.proc.kill()
            try:
                self.proc.wait(10.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not delivered within 10 s
                pass
        if self.pidfd >= 0:
            self.poller.unregister(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1
        if not self.plans.closed:
            self.plans.close(0)
            self.events.close(0)
        self._remove_dir()
        return None if self.proc is None else self.proc.returncode

    def close_log(self) -> None:
        self.log.close()

    def _remove_dir(self) -> None:
        if self.dir is not None:
            for name in ("plans", "events"):
                try:
                    os.unlink(self.dir / name)
                except FileNotFoundError:
                    pass
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
