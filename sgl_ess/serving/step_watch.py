"""The scheduler step watchdog's bookkeeping (issue 38, item 2). Pure Python: no torch, no sglang.

The scheduler thread calls ``begin``/``end`` around each step phase (running a batch, processing
its result) and ``pattern_begin``/``pattern_end`` around one request's stop-pattern evaluation; a
watchdog thread calls ``check`` a few times per bound. All state is replaced by single attribute
assignments, so the watchdog reads a consistent tuple without a lock.

A step longer than the bound is reported once (``Stall``): which phase, for how long, the batch's
requests and, when the step is inside one request's pattern evaluation, that request -- the
only one the watchdog can blame (a slow forward pass or grammar step is not a request's fault
that the watchdog can tell; it is logged and reported, nothing is aborted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

WATCHDOG_FLAG = "--guard-step-watchdog-s"


@dataclass(frozen=True)
class Stall:
    phase: str
    elapsed_s: float
    rids: tuple[str, ...]          # the batch's requests (the first few)
    culprit: Any = None            # the request object whose pattern is being evaluated, if any
    culprit_rid: Optional[str] = None

    def reason(self, bound_s: float) -> str:
        who = (f"evaluating the stop_regex of request {self.culprit_rid}" if self.culprit_rid
               else f"requests {', '.join(self.rids) or '(none)'}")
        return (f"a scheduler step ({self.phase}) has run for {self.elapsed_s:.1f} s, over the {bound_s:g} s "
                f"bound ({WATCHDOG_FLAG}): {who}")


class StepWatch:
    SHOWN_RIDS = 8

    def __init__(self, bound_s: float):
        self.bound_s = bound_s
        self._step: Optional[tuple[str, Any, float]] = None     # (phase, batch, start)
        self._pattern: Optional[tuple[Any, str]] = None         # (req, rid)
        self._reported: Optional[float] = None                  # start of the step already reported

    def begin(self, phase: str, batch: Any, now: float) -> None:
        self._step = (phase, batch, now)

    def end(self) -> bool:
        """Close the step; True if it had been reported as a stall (so the report can be withdrawn)."""
        step, self._step = self._step, None
        was = step is not None and self._reported == step[2]
        return was

    def pattern_begin(self, req: Any, rid: str) -> None:
        self._pattern = (req, rid)

    def pattern_end(self) -> None:
        self._pattern = None

    def check(self, now: float) -> Optional[Stall]:
        """A Stall the first time the current step is seen past the bound, else None."""
        step = self._step
        if step is None:
            return None
        phase, batch, start = step
        if now - start <= self.bound_s or self._reported == start:
            return None
        self._reported = start
        reqs = getattr(batch, "reqs", None) or []
        rids = tuple(str(getattr(r, "rid", "?")) for r in list(reqs)[: self.SHOWN_RIDS])
        pattern = self._pattern
        return Stall(phase, now - start, rids, pattern[0] if pattern else None, pattern[1] if pattern else None)
