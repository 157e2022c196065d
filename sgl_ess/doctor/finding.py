"""Finding: one line of the doctor's report, and the rule that turns findings into an exit code."""
from __future__ import annotations

from dataclasses import asdict, dataclass

STATUSES = ("ok", "info", "skip", "warn", "fail")
FAILING_STATUSES = ("fail",)        # any of these makes `python -m sgl_ess.doctor` exit 1


@dataclass(frozen=True)
class Finding:
    check: str          # short name: pcie, host-memory, memlock, numa, thp, ipc, pd-*, gpu-probe
    status: str         # one of STATUSES
    detail: str         # what was found, with the numbers
    fix: str = ""       # what to do; set for warn and fail

    def __post_init__(self):
        assert self.status in STATUSES, self.status

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        text = f"{self.status:<4}  {self.check:<12} {self.detail}"
        if self.fix and self.status in ("warn", "fail"):
            text += f"  | fix: {self.fix}"
        return text


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.status in FAILING_STATUSES for f in findings) else 0


def bytes_text(n: int) -> str:
    """Decimal units, like the flags (--ess-memory-pool-size-gb is 1e9 bytes a GB)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
