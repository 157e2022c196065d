"""Capacity planner: for a deployment and workload, the best batch, ratio and overlap strategy.

Search: for each candidate ratio the largest batch that fits (memory.py) is the start; if a TPOT SLO
is given the batch is bisected down until step_time / accepted tokens meets it (step time grows with
batch). The best ratio is then re-evaluated under every overlap strategy. The baseline is no offload
(ratio 1.0) under the same SLO; the gain is best / baseline - 1.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .config import OVERLAP_STRATEGIES, SimConfig, SimConfigError
from .step import StepResult, simulate

DEFAULT_RATIOS = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)


@dataclass
class PlanResult:
    baseline: StepResult | None
    best: StepResult | None
    by_overlap: dict[str, StepResult]
    by_ratio: list[StepResult]

    @property
    def gain(self) -> float | None:
        if self.baseline is None or self.best is None:
            return None
        return self.best.tokens_per_s_per_node / self.baseline.tokens_per_s_per_node - 1.0


def _with(cfg: SimConfig, batch: int | None = None, ratio: float | None = None, overlap: str | None = None):
    work = replace(cfg.work, batch=batch) if batch is not None else cfg.work
    ess = cfg.ess
    if ratio is not None:
        ess = replace(ess, ratio=ratio)
    if overlap is not None:
        ess = replace(ess, overlap=overlap)
    return replace(cfg, work=work, ess=ess)


def best_batch(cfg: SimConfig, slo_tpot_ms: float | None) -> StepResult | None:
    """Largest batch that fits and meets the SLO at cfg's ratio; None if not even batch 1 does."""
    probe = simulate(_with(cfg, batch=1), check=False)
    hi = probe.memory.max_batch
    if hi < 1:
        return None

    def ok(res: StepResult) -> bool:
        return slo_tpot_ms is None or res.step_us / 1e3 / res.accept <= slo_tpot_ms

    top = simulate(_with(cfg, batch=hi))
    if ok(top):
        return top
    lo_res = simulate(_with(cfg, batch=1))
    if not ok(lo_res):
        return None
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        res = simulate(_with(cfg, batch=mid))
        lo, hi, lo_res = (mid, hi, res) if ok(res) else (lo, mid, lo_res)
    return lo_res


def plan(cfg: SimConfig, slo_tpot_ms: float | None = None, ratios=DEFAULT_RATIOS) -> PlanResult:
    if slo_tpot_ms is not None and slo_tpot_ms <= 0:
        raise SimConfigError(f"slo_tpot_ms = {slo_tpot_ms}: expected a positive time per output token in ms; "
                             f"fix --slo-tpot-ms")
    ctx, k = cfg.work.context_tokens, 2048
    baseline = best_batch(_with(cfg, ratio=1.0), slo_tpot_ms)
    by_ratio = []
    for r in ratios:
        if r < 1.0 and r * ctx < k:
            continue      # the hot buffer must hold at least one top-k set
        res = best_batch(_with(cfg, ratio=r), slo_tpot_ms)
        if res is not None:
            by_ratio.append(res)
    best = max(by_ratio, key=lambda s: s.tokens_per_s_per_node, default=None)
    by_overlap = {}
    if best is not None and best.cfg.ess.offload:
        for ov in OVERLAP_STRATEGIES:
            by_overlap[ov] = simulate(_with(best.cfg, overlap=ov))
        best = max(by_overlap.values(), key=lambda s: s.tokens_per_s_per_node)
    return PlanResult(baseline, best, by_overlap, by_ratio)
