"""Where every byte went: the startup table of host and device memory of one scheduler.

Pure formatting; the numbers come from the scheduler (integration/sglang/observe/scheduler_probe.py).
Roles, not devices, name the rows: on a CPU-only machine "device" rows are host memory too.
"""

from __future__ import annotations


def _fmt(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)} B"


def format_report(rows: list[tuple[str, str, int, str]]) -> str:
    """rows: (where, what, bytes, how it was sized) -> a multi-line table with totals per place."""
    width = max((len(w) + len(x) for w, x, _, _ in rows), default=10) + 3
    lines = ["sgl-ess memory: where every byte went"]
    for where, what, nbytes, how in rows:
        lines.append(f"  {(where + ': ' + what).ljust(width)} {_fmt(nbytes):>10}   {how}")
    totals: dict[str, int] = {}
    for where, _, nbytes, _ in rows:
        totals[where] = totals.get(where, 0) + nbytes
    lines.append("  totals: " + ", ".join(f"{w} {_fmt(b)}" for w, b in totals.items()))
    return "\n".join(lines)
