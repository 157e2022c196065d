"""SLO-aware decode batch control: as many running requests as a TPOT target allows (issue 19).

SGLang 0.5.23 has no TPOT target: its running batch grows to ``--max-running-requests`` whatever
each step then costs. With ``--ess-slo-tpot-ms T`` the scheduler asks this controller for a cap on
running requests before it admits new ones (it never preempts a running request):

  measure   the time between consecutive decode steps of the running batch (what every running
            request sees as its inter-token latency, prefill steps in between included), weighted
            by the batch (one gap per token, as the clients see them); a gap longer than
            ``idle_gap_s`` (an idle server) is not a sample
  decide    every ``every`` samples once a full window is in, the ``percentile`` of the window's
            samples q; a step's cost grows with its batch, so about n = T / c requests
            meet the target, c the same percentile over the window of each step's gap per running
            request (r T / q for a window at one batch r):
              q > T (1 + hysteresis)                -> cap to n (at least one lower when the batch is
                                                       already within the cap), not below ``floor``
              q < T (1 - hysteresis) and the batch is at the cap -> cap to n (at least one higher),
                                                       not above the max (no wind-up while the load
                                                       is below the cap), and by at most cap / 8
                                                       (at least one) per decision
            n is taken from the batch that was measured, not from the cap, so while running requests
            drain down to a lowered cap (they are never preempted) the same samples give the same n
            and the cap does not wind down. With a fixed part in the step cost (a + k r) n
            over-estimates the right cap when lowering it and under-estimates it when raising it:
            it never steps past the target. The window is cleared after a change, and after an idle
            gap (a new load is measured on its own).
  window    ``window`` samples (24) for the median; a tail percentile p is estimated from the few
            samples above it, so its window holds as many of those as the median's does:
            window / 2 / (1 - p/100) samples (p90: 120, p95: 240), at most ``MAX_WINDOW``. With 24
            samples a p90 rests on 2.4 of them and flips with each slow step (a simulation with 15%
            of steps 1.4x slower moved the cap between 7 and 11, ~85 changes per 400 requests; with
            120 samples and the bounded raise: 14-19 changes over 10 seeds, the cap within 7..11;
            tests/unit/test_slo_control.py). A long window is slow to react, so a
            window already ``window`` samples long lowers the cap at once when its median is over
            the target (the tail then surely is); raising waits for the full window.
  report    target, cap, last decision's q and r, number of changes (metrics and /ess/status)

Without a target (T = 0) the controller is not built and nothing changes. Pure Python, no torch.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

MAX_WINDOW = 512


def percentile(values, p: float, weights=None) -> float:
    """The p-th percentile (0..100) of `values`, nearest-rank; with `weights`, each value counts
    as many times as its weight (a step's gap weighted by its batch: the gap of every token)."""
    if weights is None:
        xs = sorted(values)
        if not xs:
            return 0.0
        k = max(0, min(len(xs) - 1, math.ceil(p / 100.0 * len(xs)) - 1))
        return xs[k]
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        return 0.0
    need, seen = p / 100.0 * total, 0.0
    for v, w in pairs:
        seen += w
        if seen >= need:
            return v
    return pairs[-1][0]


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

    @property
    def decision_window(self) -> int:
        """Samples one decision reads: as many above the percentile as the median's window has."""
        if self.percentile <= 50:
            return self.window
        if self.percentile >= 100:
            return max(self.window, MAX_WINDOW)
        return max(self.window, min(MAX_WINDOW, math.ceil(round(self.window / 2 / (1 - self.percentile / 100.0), 6))))


class SloBatchController:
    def __init__(self, settings: SloSettings):
        self.s = settings
        self.cap = settings.max_cap
        self.window = settings.decision_window
        self.samples: collections.deque[float] = collections.deque(maxlen=self.window)
        self.batches: collections.deque[int] = collections.deque(maxlen=self.window)
        self._since = 0
        self._last_step_s: float | None = None
        self.measured_ms = 0.0
        self.measured_batch = 0
        self.changes = 0

    def step_done(self, now_s: float, running: int) -> None:
        """A decode step of `running` requests finished at `now_s` (monotonic seconds)."""
        last, self._last_step_s = self._last_step_s, now_s
        if last is not None and now_s - last > self.s.idle_gap_s:
            self.samples.clear()
            self.batches.clear()
        if last is None or now_s - last > self.s.idle_gap_s or running <= 0:
            return
        self.samples.append((now_s - last) * 1000.0)
        self.batches.append(running)
        self._since += 1
        if self._since < self.s.every or len(self.samples) < self.s.window:
            return
        self._since = 0                        # a check every `every` samples, decided or not
        if len(self.samples) >= self.window:
            self._decide(running, self.s.percentile)
        elif percentile(self.samples, 50, self.batches) > self.s.target_ms * (1 + self.s.hysteresis):
            self._decide(running, 50)          # a partial tail window: its median is already over T

    def _decide(self, running: int, pct: float) -> None:
        q = percentile(self.samples, pct, self.batches)
        self.measured_ms = q
        t, h = self.s.target_ms, self.s.hysteresis
        r = int(percentile(self.batches, 50))
        self.measured_batch = r
        per_request = percentile([g / b for g, b in zip(self.samples, self.batches)], pct, self.batches)
        n = int(t / per_request) if per_request > 0 else self.s.max_cap
        new = self.cap
        if q > t * (1 + h):
            new = min(self.cap, n) if r > self.cap else min(self.cap - 1, n)
        elif q < t * (1 - h) and running >= self.cap:
            new = max(self.cap + 1, min(n, self.cap + max(1, self.cap // 8)))
        new = max(self.s.floor, min(self.s.max_cap, new))
        if new != self.cap:
            self.cap = new
            self.changes += 1
            self.samples.clear()
            self.batches.clear()

    def admit(self, running: int, allocatable: int) -> int:
        """How many more requests may start now: SGLang's own number, capped."""
        return max(0, min(allocatable, self.cap - running))

    def state(self) -> dict:
        return {"target_ms": self.s.target_ms, "percentile": self.s.percentile, "window": self.window, "cap": self.cap,
                "max_cap": self.s.max_cap, "measured_ms": round(self.measured_ms, 3),
                "measured_batch": self.measured_batch, "changes": self.changes}
