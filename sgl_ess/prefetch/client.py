"""WorkerEngine: the FetchEngine that runs CopyPlans in a prefetch worker process (--ess-prefetch-engine worker).

Memory: StoreMemory is owned by the store and only borrowed (the worker maps the same memfds).
This class owns the ZMQ context, the CompletionLedger memfd and the current WorkerHandle (process,
sockets, ipc directory while it starts, stderr file); close() (also run at interpreter exit)
releases all. Plans are borrowed until completed: do not modify a plan's index tensors before
wait() returns. One caller thread (the scheduler's); not thread-safe.

States: running (plans go to the worker) · starting (a restarted worker is loading: plans run
inline meanwhile, the caller never waits for a torch import) · inline (permanent fallback after
too many restarts) · closed.

Faults: every wait/done/drain/submit polls the events socket together with a pidfd of the
worker, so a dead worker is seen as soon as the kernel reaps it (no sleeping poll loop). A
worker that sends nothing for `hang_timeout_s` while plans are outstanding is hung and is
killed. Then: plans the ledger shows finished are completed, every other outstanding plan runs
inline in submission order, one WARNING line is logged, the fault is counted and the worker is
restarted (fresh sockets, next incarnation); past `max_restarts` within `restart_window_s` one
ERROR line is logged and the engine stays inline. Requests never fail because of the worker.

Precondition (as for any engine that may reorder tiers): plans of different tiers must not
touch the same rows unless the caller waits in between, and a plan must not read rows it writes
(a background/speculative plan runs in chunks, interleaved with immediate plans).
"""
from __future__ import annotations

import collections
import logging
import os
import subprocess
import sys
import time
import weakref
from pathlib import Path

import zmq

import sgl_ess
from sgl_ess.prefetch.engine import EngineDeadError, FetchEngine, Ticket
from sgl_ess.prefetch.execute import run_plan
from sgl_ess.prefetch.memory import StoreMemory
from sgl_ess.prefetch.plan import CopyPlan
from sgl_ess.prefetch.protocol import (PROTOCOL_VERSION, CompletionLedger, Done, Error, Heartbeat, ProtocolError,
                                       Ready, check_plan_indices, decode, encode, plan_message)
from sgl_ess.prefetch.worker_handle import WorkerHandle, exit_text

logger = logging.getLogger("sgl_ess.prefetch")
_FIX = "--ess-prefetch-engine inline"


def _rows_of(plan: CopyPlan) -> int:
    """What run_plan(plan) returns, without running it (plans the ledger shows finished)."""
    if plan.kind == "zero":
        return int((plan.dst_idx >= 0).sum())
    return int(((plan.src_idx >= 0) & (plan.dst_idx >= 0)).sum())


class _Resources:
    """What close() and the interpreter-exit finalizer release; never references the engine."""

    def __init__(self, mem: StoreMemory, ledger_cap: int):
        self.pid = os.getpid()                 # a forked child must not stop its parent's worker
        self.ctx = zmq.Context(io_threads=1)
        self.ledger = CompletionLedger(ledger_cap)
        self.fds = [*mem.fds(), self.ledger.fd]
        self.cur: WorkerHandle | None = None

    def release(self) -> None:
        if os.getpid() != self.pid:
            return
        if self.cur is not None:
            self.cur.stop(grace_s=5.0)
            self.cur.close_log()
            self.cur = None
        self.ctx.term()
        self.ledger.close()


class WorkerEngine(FetchEngine):
    """FetchEngine backed by a prefetch worker process (see the module docstring)."""

    name = "worker"

    def __init__(self, mem: StoreMemory, backend: str = "auto", *, python: str | None = None,
                 env: dict[str, str] | None = None, start_timeout_s: float = 60.0, hang_timeout_s: float = 5.0,
                 chunk_rows: int = 4096, max_restarts: int = 3, restart_window_s: float = 60.0,
                 ledger_cap: int = 1 << 16, worker_threads: int = 1):
        super().__init__(mem, backend)
        self.start_timeout_s, self.hang_timeout_s = start_timeout_s, hang_timeout_s
        self.max_restarts, self.restart_window_s = max_restarts, restart_window_s
        self.python = python or sys.executable
        try:
            layout = mem.layout()
        except RuntimeError as e:
            raise EngineDeadError(f"prefetch worker cannot start: {e}") from e
        self._res = _Resources(mem, ledger_cap)
        self._finalizer = weakref.finalize(self, _Resources.release, self._res)
        root = str(Path(sgl_ess.__file__).resolve().parents[1])
        self._env = dict(os.environ, **(env or {}))
        self._env["PYTHONPATH"] = os.pathsep.join(p for p in (root, self._env.get("PYTHONPATH", "")) if p)
        self._cfg = {"version": PROTOCOL_VERSION, "layout": layout, "parent_pid": os.getpid(),
                     "ledger": {"fd": self._res.ledger.fd, "cap": ledger_cap},
                     "chunk_rows": int(chunk_rows), "heartbeat_s": max(0.02, hang_timeout_s / 4),
                     "backend": backend, "threads": int(worker_threads)}
        self._outstanding: dict[int, CopyPlan] = {}
        self._state = "starting"
        self._inc = -1
        self._last_heard = time.monotonic()
        self._restart_times: collections.deque = collections.deque()
        self._recent: collections.deque = collections.deque(maxlen=256)
        self.counts = collections.Counter()
        self.last_fault = ""
        try:
            self._spawn()
            while self._state == "starting":   # the launch fails here, naming the cause
                self._pump(0.05, fault=self._fail_start)
        except BaseException:
            self._finalizer()
            self._state = "closed"
            raise

    # ------------------------------------------------------------ FetchEngine
    def submit(self, plan: CopyPlan) -> Ticket:
        if self._state == "closed":
            raise EngineDeadError("WorkerEngine.submit after close(); create a new engine")
        if self._state != "inline":
            check_plan_indices(plan)
        t = self._assign_id(plan)
        self._pump(0)
        cap = self._res.ledger.cap
        while self._state == "running" and self._outstanding and plan.plan_id - next(iter(self._outstanding)) >= cap:
            self._pump(self._slice())          # keep the ledger exact (protocol.CompletionLedger)
        if self._state != "running":
            self._run_inline(plan)
            return t
        if not self._outstanding:
            self._last_heard = time.monotonic()
        self._outstanding[plan.plan_id] = plan  # kept until completed, whatever happens to the worker
        try:
            self._res.cur.plans.send(encode(plan_message(plan)), zmq.NOBLOCK, copy=False)
        except zmq.Again:                      # the worker closed its sockets: it is exiting or gone
            try:
                self._res.cur.proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass
            self._fault(self._res.cur.fatal or "its plan socket lost its peer")
        return t

    def wait(self, ticket: Ticket) -> None:
        self._check(ticket)
        while ticket.plan_id in self._outstanding:
            self._pump(self._slice())

    def done(self, ticket: Ticket) -> bool:
        self._check(ticket)
        self._pump(0)
        return ticket.plan_id not in self._outstanding

    def drain(self) -> None:
        self._pump(0)                          # also notices a restarted worker that became ready
        while self._outstanding:
            self._pump(self._slice())

    def stats(self) -> dict:
        cur = self._res.cur
        return {**super().stats(), "state": self._state, "incarnation": self._inc,
                "worker_pid": cur.proc.pid if cur and cur.proc else None,
                "restarts": self.counts["restarts"], "faults": self.counts["faults"], "last_fault": self.last_fault,
                "outstanding": len(self._outstanding), **{k: self.counts[k] for k in (
                    "plans_by_worker", "plans_inline", "recovered_by_ledger", "stale_messages",
                    "late_or_duplicate", "bad_messages")}}

    def recent_completions(self) -> list[tuple[int, str, str]]:
        """The last 256 completions in the order this engine saw them: (plan_id, tier, how),
        how in worker / dropped / inline / ledger."""
        return list(self._recent)

    def close(self) -> None:
        if self._state == "closed":
            return
        try:
            self.drain()
        finally:
            self._state = "closed"
            self._finalizer()

    # ------------------------------------------------------------ message pump
    def _check(self, ticket: Ticket) -> None:
        if not 0 <= ticket.plan_id < self._next_id:
            raise ValueError(f"ticket {ticket} was not issued by this engine (ids so far: 0..{self._next_id - 1})")

    def _slice(self) -> float:
        if self._res.cur is None or self._res.cur.pidfd < 0:
            return 0.001                      # no pidfd: notice a dead worker within ~1 ms by polling
        return max(0.0, min(0.05, self._last_heard + self.hang_timeout_s - time.monotonic()))

    def _pump(self, timeout_s: float, fault=None) -> None:
        """Handle every arrived message, then look for a dead, hung or slow-to-start worker."""
        cur = self._res.cur
        if cur is None or self._state in ("inline", "closed"):
            return
        fault = fault or self._fault
        cur.poller.poll(int(timeout_s * 1000))
        while True:
            try:
                data = cur.events.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                self._handle(cur, decode(data))
            except ProtocolError as e:
                self.counts["bad_messages"] += 1
                logger.debug("prefetch: ignored a bad message: %s", e)
        if self._state == "starting" and cur.check_connected():
            self._state = "running"
            self._last_heard = time.monotonic()
        if cur.dead():
            fault(cur.fatal or exit_text(cur.proc.returncode if cur.proc else None))
        elif self._state == "starting" and time.monotonic() - cur.started > self.start_timeout_s:
            fault(f"no ready message within start_timeout_s={self.start_timeout_s}")
        elif (self._state == "running" and self._outstanding
              and time.monotonic() - self._last_heard > self.hang_timeout_s):
            fault(f"hung: no message for {self.hang_timeout_s} s with {len(self._outstanding)} plans outstanding")

    def _handle(self, cur: WorkerHandle, msg) -> None:
        if not isinstance(msg, (Ready, Done, Heartbeat, Error)):
            self.counts["bad_messages"] += 1
            return
        if msg.inc != cur.inc:
            self.counts["stale_messages"] += 1
            return
        self._last_heard = time.monotonic()
        if isinstance(msg, Ready):
            if msg.version != PROTOCOL_VERSION:
                cur.fatal = f"protocol version {msg.version}; this client speaks {PROTOCOL_VERSION}"
                cur.proc.kill()
            cur.ready = True
        elif isinstance(msg, Done):
            plan = self._outstanding.pop(msg.id, None)
            if plan is None:
                self.counts["late_or_duplicate"] += 1
                return
            if msg.dropped:
                self.tiers.dropped(plan.tier)
            else:
                self.tiers.completed(plan.tier, msg.rows, msg.busy_us * 1e-6)
            self.counts["plans_by_worker"] += 1
            self._recent.append((msg.id, plan.tier, "dropped" if msg.dropped else "worker"))
        elif isinstance(msg, Error):
            if msg.id < 0:
                cur.fatal = f"worker reported: {msg.msg}"
                return
            plan = self._outstanding.pop(msg.id, None)
            if plan is None:
                self.counts["late_or_duplicate"] += 1
                return
            try:
                self._run_inline(plan)
            except Exception as e:
                raise RuntimeError(f"plan {msg.id} ({plan.kind}, {plan.tier}, {plan.num_rows} entries) failed in "
                                   f"the prefetch worker ({msg.msg}) and again inline: {e}") from e

    # ------------------------------------------------------------ inline execution and faults
    def _run_inline(self, plan: CopyPlan, how: str = "inline") -> None:
        # the same drop rule as InlineEngine.submit
        if plan.tier == "speculative" and plan.deadline_s is not None and time.monotonic() > plan.deadline_s:
            self.tiers.dropped(plan.tier)
            self._recent.append((plan.plan_id, plan.tier, "dropped"))
            return
        t0 = time.perf_counter()
        rows = run_plan(plan, self.mem, self.backend)
        self.tiers.completed(plan.tier, rows, time.perf_counter() - t0)
        self.counts["plans_inline"] += 1
        self._recent.append((plan.plan_id, plan.tier, how))

    def _start_failure(self, cause: str) -> str:
        cur = self._res.cur
        rc = cur.stop(grace_s=0)
        tail = cur.tail()
        cur.close_log()
        self._res.cur = None
        where = f"pid {cur.proc.pid}, {exit_text(rc)}" if cur.proc else "not started"
        return (f"prefetch worker failed to start ({where}): {cause}; last stderr: {tail or '(empty)'}; "
                f"command: {self.python} -m sgl_ess.prefetch.worker; to run without it use {_FIX}")

    def _fail_start(self, cause: str) -> None:
        raise EngineDeadError(self._start_failure(self._res.cur.fatal or cause))

    def _spawn(self) -> None:
        self._inc += 1
        self._state = "starting"
        self._res.cur = WorkerHandle(self._res.ctx, self._inc)
        self._res.cur.spawn(self._cfg, self.python, self._env, self._res.fds)

    def _fault(self, cause: str) -> None:
        """The current worker is dead, hung or failed to start: finish its plans inline, log one
        line, then restart it or fall back to inline for good."""
        cur = self._res.cur
        pid = cur.proc.pid if cur.proc else None
        alive = not cur.dead()
        rc = cur.stop(grace_s=0)               # SIGKILL + reap before any inline copy (no second writer)
        self._res.cur = None
        if alive:
            cause += "; killed it with SIGKILL"
        elif rc is not None and exit_text(rc) not in cause:
            cause += f" ({exit_text(rc)})"
        by_ledger = inline = 0
        errors = []
        for pid_, plan in list(self._outstanding.items()):   # submission order
            status = self._res.ledger.status(pid_)
            if status == "done":
                self.tiers.completed(plan.tier, _rows_of(plan), 0.0)
                self._recent.append((pid_, plan.tier, "ledger"))
                by_ledger += 1
            elif status == "dropped":
                self.tiers.dropped(plan.tier)
                self._recent.append((pid_, plan.tier, "dropped"))
                by_ledger += 1
            else:
                try:
                    self._run_inline(plan)
                except Exception as e:          # a bad plan: raised below, after the engine is consistent
                    errors.append((plan, e))
                inline += 1
            del self._outstanding[pid_]
        self.counts["faults"] += 1
        self.counts["recovered_by_ledger"] += by_ledger
        now = time.monotonic()
        while self._restart_times and now - self._restart_times[0] > self.restart_window_s:
            self._restart_times.popleft()
        tail = cur.tail()
        cur.close_log()
        what = (f"sgl-ess prefetch worker pid {pid} (incarnation {cur.inc}) failed: {cause}; "
                f"{by_ledger + inline} outstanding plans finished ({by_ledger} by the worker per the ledger, "
                f"{inline} inline); last stderr: {tail or '(empty)'}")
        self.last_fault = what
        if len(self._restart_times) >= self.max_restarts:
            self._state = "inline"
            logger.error("%s; %d restarts within %g s reached the bound (max_restarts=%d): running every plan "
                         "inline from now on (requests continue; fix the cause, or use %s)", what,
                         len(self._restart_times), self.restart_window_s, self.max_restarts, _FIX)
        else:
            self._restart_times.append(now)
            self.counts["restarts"] += 1
            logger.warning("%s; restarting it (restart %d within %g s, bound %d)", what, len(self._restart_times),
                           self.restart_window_s, self.max_restarts)
            self._spawn()
        if errors:
            plan, e = errors[0]
            raise RuntimeError(f"plan {plan.plan_id} ({plan.kind}, {plan.tier}, {plan.num_rows} entries) failed "
                               f"inline after a worker fault: {e}") from e
