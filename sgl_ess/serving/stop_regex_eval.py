r"""How the scheduler evaluates a request's ``stop_regex`` patterns: RE2, within a time budget.

Pure Python (no torch, no sglang). Used by ``integration/sglang/observe/pattern_eval.py``, the hook
on SGLang's stop check, in scheduler processes only.

  * A pattern RE2 compiles is searched with RE2: time linear in the text, whatever the pattern.
    Python's ``$`` also matches just before a final newline, RE2's only at the end: a pattern with
    a ``$`` is searched once more without the text's final newline (a ``$`` followed by a newline
    of its own, as in ``a$\n``, is the one case this does not reproduce). RE2's ``\d``, ``\w``,
    ``\s`` and ``\b`` are ASCII; Python's are Unicode.
    (Ingress, ``pattern_bound.py``, refuses the others unless
    ``--guard-allow-backtracking-stop-regex`` is on.)
  * With that flag, a pattern RE2 cannot compile is searched with Python ``re``, under a deadline:
    on the main thread an interval timer (SIGALRM) interrupts the search (CPython's matcher checks
    for signals while it backtracks), and ``PatternBudgetExceeded`` is raised. Off the main thread
    no timer can be armed; the time is then checked after the search.
  * ``Budget`` adds up one request's evaluation time in one scheduler step; past the budget the
    caller aborts the request (the error names ``--guard-pattern-budget-ms``).
"""

from __future__ import annotations

import re
import signal
import threading
import time
from functools import lru_cache

from sgl_ess.serving.pattern_bound import re2_compiled

BUDGET_FLAG = "--guard-pattern-budget-ms"


class PatternBudgetExceeded(Exception):
    """A request's stop patterns took longer than its budget in one step."""


@lru_cache(maxsize=1024)
def _python_re(pattern: str):
    """Python re's compile of `pattern`; ValueError (with the reason) for any failure to compile."""
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as e:   # re.error is no ValueError
        raise ValueError(f"stop_regex {pattern!r}: Python re cannot compile it ({type(e).__name__}: {e})") from None


def compiled(pattern: str, allow_backtracking: bool):
    """(compiled pattern, engine name): RE2 when it compiles the pattern; else Python re when allowed.
    Raises ValueError for a pattern neither may evaluate (ingress should have refused it)."""
    rx, err = re2_compiled(pattern)
    if rx is not None:
        return rx, "re2"
    if not allow_backtracking:
        raise ValueError(f"stop_regex {pattern!r}: RE2 cannot compile it ({err}) and "
                         f"--guard-allow-backtracking-stop-regex is off")
    return _python_re(pattern), "re"


class _Alarm:
    """An interval timer that raises PatternBudgetExceeded in the main thread after `seconds`."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.armed = threading.current_thread() is threading.main_thread() and seconds > 0
        self.previous = None

    def _fire(self, signum, frame):
        raise PatternBudgetExceeded()

    def __enter__(self):
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous if self.previous is not None else signal.SIG_DFL)
        return False


class Budget:
    """One request's pattern time in one scheduler step."""

    def __init__(self, budget_s: float, allow_backtracking: bool):
        self.budget_s = budget_s
        self.allow_backtracking = allow_backtracking
        self.spent_s = 0.0

    def search(self, pattern: str, text: str) -> bool:
        """True if `pattern` matches somewhere in `text`. Raises PatternBudgetExceeded past the budget."""
        rx, engine = compiled(pattern, self.allow_backtracking)
        left = self.budget_s - self.spent_s
        if left <= 0:
            raise PatternBudgetExceeded()
        t0 = time.perf_counter()
        try:
            if engine == "re2":
                found = rx.search(text) is not None or (
                    "$" in pattern and text.endswith("\n") and rx.search(text[:-1]) is not None)
            else:
                with _Alarm(left):
                    found = rx.search(text) is not None
        finally:
            self.spent_s += time.perf_counter() - t0
        if self.spent_s > self.budget_s:
            raise PatternBudgetExceeded()
        return found

    def message(self, rid: str) -> str:
        return (f"request {rid}: its stop_regex evaluation took more than the {self.budget_s * 1e3:g} ms budget "
                f"of one scheduler step ({BUDGET_FLAG}); the request was aborted")


def budget_for(budget_ms: float, allow_backtracking: bool) -> Budget:
    return Budget(budget_ms / 1e3, allow_backtracking)

