"""A stand-in for an asynchronous fetch engine (the prefetch worker, a device stream) that completes
work late and out of order: nothing runs at submit; pending plans run newest first when one is
waited on or the engine is drained. Tests that swap it in for a store's engine see every ordering
bug a real asynchronous engine could hit (named "GPU fake" where it stands in for a stream)."""

from sgl_ess.prefetch.engine import FetchEngine
from sgl_ess.prefetch.execute import run_plan


class LateOutOfOrderEngine(FetchEngine):
    name = "late"

    def __init__(self, mem, backend="torch"):
        super().__init__(mem, backend)
        self.pending = {}

    def submit(self, plan):
        t = self._assign_id(plan)
        self.pending[t.plan_id] = plan
        return t

    def wait(self, ticket):
        if ticket.plan_id in self.pending:
            for pid in sorted(self.pending, reverse=True):          # later plans first: out of order
                if pid >= ticket.plan_id:
                    plan = self.pending.pop(pid)
                    self.tiers.completed(plan.tier, run_plan(plan, self.mem, self.backend), 0.0)

    def done(self, ticket):
        return ticket.plan_id not in self.pending

    def drain(self):
        for pid in sorted(self.pending, reverse=True):
            plan = self.pending.pop(pid)
            self.tiers.completed(plan.tier, run_plan(plan, self.mem, self.backend), 0.0)
