"""The prefetch worker process: `python -m sgl_ess.prefetch.worker --config JSON`.

Started by sgl_ess.prefetch.client.WorkerEngine, never by hand (the config names inherited fds).
Memory: it maps StoreMemory (host pool, slot space, ring tags: owned by the store) and the
CompletionLedger (owned by the client) from fds the client passed; it owns nothing but its
ZMQ sockets and queues. Everything it writes lands in those shared mappings.

Loop (one thread; decoding is cheap next to the copies, and a second thread would only contend
for the GIL): take every message that has arrived, then run ONE unit of work:
  1. the oldest queued immediate plan, whole;
  2. else the next chunk (`chunk_rows` entries) of the oldest background plan;
  3. else the next chunk of the oldest speculative plan, dropped once past its deadline.
So a newly arrived immediate plan waits for at most one chunk. Each tier is FIFO. After a plan's
last chunk: ledger entry, then a `done` message.

Exit: on `stop`; on SIGTERM (after the current unit); when the parent process dies, seen by a
pidfd on the parent polled with the plan socket, and by a parent-pid check after every unit and
every idle poll (kernels without pidfd, a parent that died before we looked).
PR_SET_PDEATHSIG delivers SIGUSR2, which only triggers that check: the kernel sends it when the
parent *thread* that spawned us exits, which is not the parent's death if its other threads run
on. If the ipc directory still exists (the parent died while this worker started), the worker
removes it. SIGINT is ignored: Ctrl-C reaches the whole process
group and the parent decides. The process ends with os._exit after its own cleanup.
"""
from __future__ import annotations

import argparse
import ctypes
import collections
import os
import select
import shutil
import signal
import sys
import time

import orjson
import torch
import zmq

from sgl_ess.prefetch.execute import clear_staged, run_plan
from sgl_ess.prefetch.memory import StoreMemory
from sgl_ess.prefetch.plan import CopyPlan
from sgl_ess.prefetch.protocol import (PROTOCOL_VERSION, CompletionLedger, Done, Error, Heartbeat, PlanMsg,
                                       ProtocolError, Ready, Stop, decode, encode)

_PR_SET_PDEATHSIG = 1
_IDLE_POLL_MS = 100          # how often an idle worker checks SIGTERM / its parent
_PARENT_DEATH_SIGNAL = signal.SIGUSR2


class _Job:
    """A queued plan: decoded indices and how far it has run."""

    __slots__ = ("msg", "src", "dst", "pos", "rows", "busy_s")

    def __init__(self, msg: PlanMsg):
        self.msg = msg
        src, dst = msg.indices()
        self.src, self.dst = torch.from_numpy(src), torch.from_numpy(dst)
        self.pos, self.rows, self.busy_s = 0, 0, 0.0

    def chunk(self, n: int | None) -> CopyPlan:
        """The next `n` entries (all with None). A "move" runs its chunks as copies; its sources are
        cleared once the last chunk has copied (a source row may feed entries in two chunks)."""
        end = self.src.shape[0] if n is None else min(self.pos + n, self.src.shape[0])
        m = self.msg
        plan = CopyPlan("s2s" if m.kind == "move" else m.kind, self.src[self.pos:end], self.dst[self.pos:end], layer=m.layer, tier=m.tier,
                        micro_batch=m.mb, tag_seq=m.tag, deadline_s=m.deadline, plan_id=m.id)
        self.pos = end
        return plan

    @property
    def finished(self) -> bool:
        return self.pos >= self.src.shape[0]


class Worker:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.inc = int(cfg["incarnation"])
        self.parent_pid = int(cfg["parent_pid"])
        self.chunk_rows = int(cfg["chunk_rows"])
        self.heartbeat_s = float(cfg["heartbeat_s"])
        self.backend = cfg.get("backend", "auto")
        self.queues = {t: collections.deque() for t in ("immediate", "background", "speculative")}
        self.stopping: str | None = None
        self.last_sent = time.monotonic()
        self.ctx = zmq.Context(io_threads=1)
        self.plans = self.ctx.socket(zmq.PULL)
        self.events = self.ctx.socket(zmq.PUSH)
        for s in (self.plans, self.events):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVHWM if s is self.plans else zmq.SNDHWM, 0)
        self.plans.connect(cfg["plans_endpoint"])
        self.events.connect(cfg["events_endpoint"])
        self.mem: StoreMemory | None = None
        self.ledger: CompletionLedger | None = None
        try:
            self.parent_fd = os.pidfd_open(self.parent_pid)
        except (AttributeError, OSError):
            self.parent_fd = -1                # the parent-pid check alone
        self.poller = zmq.Poller()
        self.poller.register(self.plans, zmq.POLLIN)
        if self.parent_fd >= 0:
            self.poller.register(self.parent_fd, zmq.POLLIN)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Map the shared memory, then say ready (the client sends nothing before that)."""
        self.mem = StoreMemory.attach(self.cfg["layout"])
        self.ledger = CompletionLedger(self.cfg["ledger"]["cap"], fd=self.cfg["ledger"]["fd"])
        self.send(Ready(version=PROTOCOL_VERSION, pid=os.getpid(), inc=self.inc))

    def parent_alive(self, wait_s: float = 0.0) -> bool:
        """False once the parent process is gone (or, with wait_s, goes within wait_s)."""
        if os.getppid() != self.parent_pid:
            return False
        if self.parent_fd < 0:
            return True
        r, _, _ = select.select([self.parent_fd], [], [], wait_s)
        return not r

    def close(self) -> None:
        self.plans.close(0)
        # the last messages (a start failure, an exit notice) may still be queued while the connect
        # completes: a bounded linger delivers them instead of dropping them (at most EVENTS_LINGER_MS
        # when nobody reads any more)
        self.events.close(EVENTS_LINGER_MS)
        self.ctx.term()
        if self.ledger is not None:
            self.ledger.close()

    def remove_ipc_dir_if_orphaned(self, wait_s: float) -> None:
        """The parent removes the directory once connected; if it still exists, the parent died
        during start-up (after a SIGTERM, wait_s lets a dying parent finish: PDEATHSIG comes when
        its thread exits, possibly before the whole process is gone)."""
        d = self.cfg.get("ipc_dir")
        if d and os.path.isdir(d) and not self.parent_alive(wait_s):
            shutil.rmtree(d, ignore_errors=True)
        if self.parent_fd >= 0:
            os.close(self.parent_fd)
            self.parent_fd = -1

    def send(self, msg) -> None:
        self.events.send(encode(msg))
        self.last_sent = time.monotonic()

    # ------------------------------------------------------------ scheduling
    def has_work(self) -> bool:
        return any(self.queues.values())

    def receive(self) -> None:
        """Take every message that has arrived; block up to _IDLE_POLL_MS only when idle."""
        timeout = 0 if self.has_work() else _IDLE_POLL_MS
        while True:
            ready = dict(self.poller.poll(timeout))
            if self.parent_fd in ready:
                self.stopping = f"parent {self.parent_pid} died"
                return
            if self.plans not in ready:
                return
            timeout = 0
            msg = decode(self.plans.recv())
            if isinstance(msg, Stop):
                self.stopping = "stop message"
                return
            if not isinstance(msg, PlanMsg):
                raise ProtocolError(f"worker received {type(msg).__name__}; expected plan or stop")
            try:
                self.queues[msg.tier].append(_Job(msg))
            except ProtocolError as e:
                self.send(Error(inc=self.inc, id=msg.id, msg=str(e)))

    def step(self) -> None:
        """Run one unit of work (see the module docstring)."""
        for tier in ("immediate", "background", "speculative"):
            q = self.queues[tier]
            if not q:
                continue
            job = q[0]
            if tier == "speculative" and job.msg.deadline is not None and time.monotonic() > job.msg.deadline:
                q.popleft()
                self.finish(job, dropped=True)
                return
            plan = job.chunk(None if tier == "immediate" else self.chunk_rows)
            t0 = time.perf_counter()
            try:
                job.rows += run_plan(plan, self.mem, self.backend)
            except Exception as e:  # a bad plan (indices out of range, ...): the client runs it inline
                q.popleft()
                self.send(Error(inc=self.inc, id=job.msg.id, msg=f"{type(e).__name__}: {e}"))
                return
            if job.finished and job.msg.kind == "move":
                clear_staged(self.mem, job.src[(job.src >= 0) & (job.dst >= 0)])
            job.busy_s += time.perf_counter() - t0
            if job.finished:
                q.popleft()
                self.finish(job, dropped=False)
            return

    def finish(self, job: _Job, dropped: bool) -> None:
        self.ledger.mark(job.msg.id, dropped)   # after the rows landed, before the message
        self.send(Done(inc=self.inc, id=job.msg.id, rows=job.rows, busy_us=int(job.busy_s * 1e6),
                       dropped=dropped))

    def run(self) -> str:
        while self.stopping is None:
            self.receive()
            if self.stopping is not None:
                break
            if not self.parent_alive():
                self.stopping = f"parent {self.parent_pid} died"
                break
            if self.has_work():
                self.step()
                if time.monotonic() - self.last_sent > self.heartbeat_s:
                    self.send(Heartbeat(inc=self.inc))
        return self.stopping


# ---------------------------------------------------------------- process entry

def _set_parent_death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(_PARENT_DEATH_SIGNAL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    except (OSError, AttributeError) as e:  # not Linux: the parent-pid check still stops the worker
        print(f"sgl-ess prefetch worker: PR_SET_PDEATHSIG unavailable ({e}); relying on the parent-pid check",
              file=sys.stderr)


def _log(inc: int, text: str) -> None:
    print(f"sgl-ess prefetch worker pid {os.getpid()} incarnation {inc}: {text}", file=sys.stderr, flush=True)


EVENTS_LINGER_MS = 2000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="sgl-ess prefetch worker (started by WorkerEngine; not by hand)")
    ap.add_argument("--config", required=True, help="JSON written by sgl_ess.prefetch.client.WorkerEngine")
    cfg = orjson.loads(ap.parse_args(argv).config)
    inc = int(cfg.get("incarnation", -1))
    if cfg.get("version") != PROTOCOL_VERSION:
        _log(inc, f"config version {cfg.get('version')!r}; expected {PROTOCOL_VERSION} (client and worker "
                  f"come from different sgl-ess installs)")
        return 2
    signal.signal(_PARENT_DEATH_SIGNAL, lambda *_: None)   # wakes the loop, which checks the parent
    _set_parent_death_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(int(cfg.get("threads", 1)))
    worker = Worker(cfg)
    signal.signal(signal.SIGTERM, lambda *_: setattr(worker, "stopping", worker.stopping or "SIGTERM"))
    if not worker.parent_alive():
        worker.stopping = f"parent {worker.parent_pid} died before the worker started"
    rc = 0
    try:
        if worker.stopping is None:
            try:
                worker.start()
            except Exception as e:
                worker.send(Error(inc=inc, id=-1, msg=f"worker start failed: {type(e).__name__}: {e}"))
                _log(inc, f"start failed: {type(e).__name__}: {e}")
                rc = 3
            else:
                try:
                    reason = worker.run()
                except Exception as e:          # e.g. a message that is not this protocol: a client bug
                    worker.send(Error(inc=inc, id=-1, msg=f"worker loop failed: {type(e).__name__}: {e}"))
                    reason, rc = f"{type(e).__name__}: {e}", 4
                _log(inc, f"exiting ({reason})")
    finally:
        worker.close()
        worker.remove_ipc_dir_if_orphaned(wait_s=2.0 if worker.stopping == "SIGTERM" else 0.0)
    return rc


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)     # everything shared is released above; skip torch's slow interpreter teardown
