"""PrecisionGate: trust a predictor only while it is right often enough (learning-augmented LRU).

The speculative stager reports, per claimed prediction, how many rows it staged and how many of them
the target layer then missed on (used). While LIVE, the gate keeps the last `window` outcomes; when
they are all in and their precision (used / staged rows) is below `min_precision`, it switches to
FALLBACK: plain LRU, nothing staged. The predictor keeps predicting there; the stager scores those
predictions against the target's misses without moving a byte (shadow outcomes), and once a full
window of shadow outcomes reaches `min_precision` the gate goes LIVE again. The window restarts at
each switch. Shadow precision ignores late arrivals (a live staging can land too late to be used),
so it is an upper bound on what going live would give. Pure Python; owned by the stager.
"""
from __future__ import annotations

from collections import deque


class PrecisionGate:
    def __init__(self, min_precision: float = 0.1, window: int = 64):
        if not 0.0 <= min_precision <= 1.0 or window < 1:
            raise ValueError(f"precision gate min_precision={min_precision}, window={window}: expected a fraction "
                             "in [0, 1] and window >= 1 (--ess-predictor-min-precision, --ess-predictor-window)")
        self.min_precision, self.window = min_precision, window
        self.live = True
        self._outcomes: deque[tuple[int, int, int]] = deque()    # (staged, used, plans), the last `window` plans
        self.fallbacks = 0            # live -> LRU switches
        self.resumes = 0              # LRU -> live switches
        self.plans_live = 0
        self.plans_shadow = 0
        self.rows_shadow = 0
        self.rows_shadow_used = 0

    def precision(self) -> float | None:
        staged = sum(s for s, _, _ in self._outcomes)
        return sum(u for _, u, _ in self._outcomes) / staged if staged else None

    def record(self, staged_rows: int, used_rows: int, shadow: bool) -> None:
        """One claimed prediction. An outcome of the other mode (made before a switch) is ignored."""
        self.record_window(staged_rows, used_rows, 1, shadow)

    def record_window(self, staged_rows: int, used_rows: int, plans: int, shadow: bool) -> None:
        """`plans` claimed predictions at once, their rows summed: a stager that reads its device
        counts a window late (host_feed.HostFeed) reports them this way."""
        if shadow == self.live or plans < 1:
            return
        if shadow:
            self.plans_shadow += plans
            self.rows_shadow += staged_rows
            self.rows_shadow_used += used_rows
        else:
            self.plans_live += plans
        self._outcomes.append((staged_rows, used_rows, plans))
        n = sum(p for _, _, p in self._outcomes)
        while n - self._outcomes[0][2] >= self.window:
            n -= self._outcomes.popleft()[2]
        if n < self.window:
            return
        p = self.precision()
        if p is None:
            return
        if self.live and p < self.min_precision:
            self.live = False
            self.fallbacks += 1
            self._outcomes.clear()
        elif not self.live and p >= self.min_precision:
            self.live = True
            self.resumes += 1
            self._outcomes.clear()

    def stats(self) -> dict:
        p = self.precision()
        return {"mode": "live" if self.live else "lru_fallback", "min_precision": self.min_precision,
                "window": self.window, "window_precision": None if p is None else round(p, 4),
                "fallbacks": self.fallbacks, "resumes": self.resumes, "plans_live": self.plans_live,
                "plans_shadow": self.plans_shadow, "rows_shadow": self.rows_shadow,
                "rows_shadow_used": self.rows_shadow_used}
