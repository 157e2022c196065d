"""The data behind `plan --plot`: tokens/s vs batch with ESS (at the planned ratio and overlap) and
without offload, and the batch at which each limit binds (GPU memory, host memory, the TPOT SLO).

Points past a memory limit are simulated anyway (check=False) so the curve shows what the limit costs;
the SLO limit is the largest batch whose TPOT meets the SLO, bisected (TPOT grows with batch).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .config import SimConfig
from .planner import PlanResult
from .step import simulate


@dataclass
class Curve:
    label: str
    ratio: float
    batches: list[int]
    tokens_per_s_per_node: list[float]
    limits: dict[str, int] = field(default_factory=dict)     # limit name -> largest batch it allows


def _at(cfg: SimConfig, batch: int, ratio: float):
    return simulate(replace(cfg, work=replace(cfg.work, batch=batch), ess=replace(cfg.ess, ratio=ratio)), check=False)


def slo_batch(cfg: SimConfig, ratio: float, slo_tpot_ms: float, hi: int) -> int:
    """Largest batch in [0, hi] whose TPOT meets the SLO (0: not even batch 1)."""
    if _at(cfg, 1, ratio).tpot_ms > slo_tpot_ms:
        return 0
    if _at(cfg, hi, ratio).tpot_ms <= slo_tpot_ms:
        return hi
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _at(cfg, mid, ratio).tpot_ms <= slo_tpot_ms else (lo, mid)
    return lo


def batch_grid(top: int, points: int = 16) -> list[int]:
    """About `points` batches from 1 to top, evenly spaced, distinct, ascending."""
    return sorted({max(1, round(1 + i * (top - 1) / (points - 1))) for i in range(points)})


def curves(cfg: SimConfig, res: PlanResult, slo_tpot_ms: float | None) -> list[Curve]:
    ess = res.best if res.best is not None and res.best.cfg.ess.offload else None
    base = ess.cfg if ess is not None else cfg
    mems = {}
    specs = [("ESS off", 1.0)] + ([(f"ESS on (r={ess.cfg.ess.ratio:g}, {ess.cfg.ess.overlap})", ess.cfg.ess.ratio)]
                                  if ess is not None else [])
    for label, r in specs:
        mems[label] = _at(base, 1, r).memory
    top = max(8, int(1.25 * max(max(m.max_batch_gpu, 1) for m in mems.values())))
    out = []
    for label, r in specs:
        m = mems[label]
        grid = batch_grid(top)
        c = Curve(label, r, grid, [_at(base, b, r).tokens_per_s_per_node for b in grid])
        c.limits["GPU memory"] = m.max_batch_gpu
        if r < 1.0 and m.max_batch_host is not None:
            c.limits["host memory"] = m.max_batch_host
        if slo_tpot_ms is not None:
            c.limits[f"TPOT SLO {slo_tpot_ms:g} ms"] = slo_batch(base, r, slo_tpot_ms, top)
        out.append(c)
    return out
