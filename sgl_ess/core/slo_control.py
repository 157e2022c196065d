"""SLO-aware decode batch control: as many running requests as a TPOT target allows (issue 19).

SGLang 0.5.23 has no TPOT target: its running batch grows to ``--max-running-requests`` whatever
each step then costs. With ``--ess-slo-tpot-ms T`` the scheduler asks this controller for a cap on
running requests before it admits new ones (it never preempts a running request):

  measure   the time between consecutive decode steps of the running batch (what every running
            request sees as its inter-token latency, prefill steps in between included); a gap
            longer than ``idle_gap_s`` (an idle server) is not a sample
  decide    every ``every`` samples, the ``percentile`` of the last ``window`` samples q:
              q > T (1 + hysteresis)                -> cap down by max(1, cap // 8), not below ``floor``
              q < T (1 - hysteresis) and the batch is at the cap -> cap up by 1 (no wind-up while
                                                       the load is below the cap)
            the window is cleared after a change, so the next decision sees only the new cap
  report    target, cap, last decision's q, number of changes (metrics and /ess/status)

Without a target (T = 0) the controller is not built and nothing changes. Pure Python, no torch.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass


def percentile(values, p: float) -> float:
    """The p-th percentile (0..100) of `values`, nearest-rank."""
    xs = sorted(values)
    if not xs:
        return 0.0
    k = max(0, min(len(xs) - 1, math.ceil(p / 100.0 * len(xs)) - 1))
    return xs[k]


@dataclass
class SloSettings:
    target_ms: float
    max_cap: int
    percentile: float = 50.0
    floor: int = 1
    window: int = 24
    every: int = 8
    hysteresis: float = 0.05
    idle_gap_s: float = 1.0

    def __post_init__(self):
        if self.target_ms <= 0:
            raise ValueError(f"SLO target {self.target_ms} ms: expected > 0 (--ess-slo-tpot-ms; 0 turns it off)")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"SLO percentile {self.percentile}: expected in (0, 100] (--ess-slo-itl-percentile)")
        if not 1 <= self.floor <= self.max_cap:
            raise ValueError(f"SLO floor {self.floor}: expected 1 .. max running requests ({self.max_cap}) "
                             "(--ess-slo-min-batch)")


class SloBatchController:
    def __init__(self, settings: SloSettings):
        self.s = settings
        self.cap = settings.max_cap
        self.samples: collections.deque[float] = collections.deque(maxlen=settings.window)
        self._since = 0
        self._last_step_s: float | None = None
        self.measured_ms = 0.0
        self.changes = 0

    def step_done(self, now_s: float, running: int) -> None:
        """A decode step of `running` requests finished at `now_s` (monotonic seconds)."""
        last, self._last_step_s = self._last_step_s, now_s
        if last is None or now_s - last > self.s.idle_gap_s or running <= 0:
            return
        self.samples.append((now_s - last) * 1000.0)
        self._since += 1
        if self._since >= self.s.every and len(self.samples) >= min(self.s.window, self.s.every):
            self._since = 0
            self._decide(running)

    def _decide(self, running: int) -> None:
        q = percentile(self.samples, self.s.percentile)
        self.measured_ms = q
        t, h = self.s.target_ms, self.s.hysteresis
        new = self.cap
        if q > t * (1 + h):
            new = max(self.s.floor, min(self.cap, running) - max(1, self.cap // 8))
        elif q < t * (1 - h) and running >= self.cap:
            new = min(self.s.max_cap, self.cap + 1)
        if new != self.cap:
            self.cap = new
            self.changes += 1
            self.samples.clear()

    def admit(self, running: int, allocatable: int) -> int:
        """How many more requests may start now: SGLang's own number, capped."""
        return max(0, min(allocatable, self.cap - running))

    def state(self) -> dict:
        return {"target_ms": self.s.target_ms, "percentile": self.s.percentile, "cap": self.cap,
                "max_cap": self.s.max_cap, "measured_ms": round(self.measured_ms, 3), "changes": self.changes}
