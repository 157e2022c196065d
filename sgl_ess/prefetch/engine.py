"""FetchEngine: where CopyPlans run. One interface, several engines:

  inline   runs each plan in the calling thread at `submit` (the fallback; the comparison point)
  worker   sends plans to a prefetch worker process over ZMQ (sgl_ess.prefetch.client)

Contract (every engine):
  submit(plan) -> Ticket      queue a plan; never blocks on the copy itself (inline: it already ran)
  wait(ticket)                return once the plan's rows have landed (ring tags written); raises
                              EngineDeadError only if the rows can no longer be produced at all
  done(ticket) -> bool        non-blocking check
  drain()                     wait for every plan submitted so far (fences, shutdown)
  stats() -> dict             plans / rows / seconds per tier, faults, restarts
  close()                     drain, stop background resources; idempotent
Tickets are only valid for the engine that issued them. Plans of one engine run in submission
order within a tier; immediate plans may overtake queued background/speculative ones.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from sgl_ess.prefetch.execute import run_plan
from sgl_ess.prefetch.memory import StoreMemory
from sgl_ess.prefetch.plan import TIERS, CopyPlan

ENGINES = ("inline", "worker")


class EngineDeadError(RuntimeError):
    """The fetch engine failed and could not recover; the message says why and what to do."""


@dataclass(frozen=True)
class Ticket:
    plan_id: int
    tier: str


class TierStats:
    """Counters per tier: plans submitted / completed / dropped, rows, busy seconds."""

    def __init__(self):
        self.data = {t: {"plans": 0, "done": 0, "dropped": 0, "rows": 0, "busy_s": 0.0} for t in TIERS}

    def submitted(self, tier: str) -> None:
        self.data[tier]["plans"] += 1

    def completed(self, tier: str, rows: int, busy_s: float) -> None:
        d = self.data[tier]
        d["done"] += 1
        d["rows"] += rows
        d["busy_s"] += busy_s

    def dropped(self, tier: str) -> None:
        self.data[tier]["dropped"] += 1

    def snapshot(self) -> dict:
        return {t: dict(v) for t, v in self.data.items()}


class FetchEngine(ABC):
    name = "abstract"
    # True when completed plans are ordered with later device work by the device itself (a CUDA
    # stream engine): readers then need not verify ring tags. False for engines in this or another
    # process that write host-visible memory.
    ordered_on_device = False
    # True when submit() has finished the move before it returns (nothing can overlap with it):
    # overlap levels then have nothing to hide and decode runs as 'none' (see layer_mode).
    synchronous = False

    def __init__(self, mem: StoreMemory, backend: str = "auto"):
        self.mem = mem
        self.backend = backend
        self.tiers = TierStats()
        self._next_id = 0

    def _assign_id(self, plan: CopyPlan) -> Ticket:
        plan.plan_id = self._next_id
        self._next_id += 1
        self.tiers.submitted(plan.tier)
        return Ticket(plan.plan_id, plan.tier)

    @abstractmethod
    def submit(self, plan: CopyPlan) -> Ticket: ...

    @abstractmethod
    def wait(self, ticket: Ticket) -> None: ...

    @abstractmethod
    def done(self, ticket: Ticket) -> bool: ...

    def wait_layer(self, ticket: Ticket, layer: int) -> bool:
        """Order later work after layer `layer`'s part of a zero plan (its every-layer memset). Returns
        True when the whole plan is now ordered (the caller may forget the ticket). An engine that
        runs a zero plan as one operation waits for all of it."""
        self.wait(ticket)
        return True

    def complete(self, ticket: Ticket) -> None:
        """The host returns once the plan's writes are done, not only ordered before later device
        work (the store's zeroing of released host rows where a writer outside every stream - a PD
        decode node's transfer - may reuse them). A host engine's wait is that already; call it
        before anything else waits on the ticket."""
        self.wait(ticket)

    @abstractmethod
    def drain(self) -> None: ...

    def stats(self) -> dict:
        return {"engine": self.name, "tiers": self.tiers.snapshot()}

    def close(self) -> None:
        self.drain()


class InlineEngine(FetchEngine):
    """Runs every plan at submit, in the caller's thread (speculative plans past their deadline
    are dropped, as a worker would)."""

    name = "inline"
    synchronous = True

    def submit(self, plan: CopyPlan) -> Ticket:
        t = self._assign_id(plan)
        if plan.tier == "speculative" and plan.deadline_s is not None and time.monotonic() > plan.deadline_s:
            self.tiers.dropped(plan.tier)
            return t
        t0 = time.perf_counter()
        rows = run_plan(plan, self.mem, self.backend)
        self.tiers.completed(plan.tier, rows, time.perf_counter() - t0)
        return t

    def wait(self, ticket: Ticket) -> None:
        return None

    def done(self, ticket: Ticket) -> bool:
        return True

    def drain(self) -> None:
        return None
