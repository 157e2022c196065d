"""Sensitivity of the predicted ESS gain to PCIe rate, hit rate, overlap strategy and copy method.

The gain is ESS (cfg's batch and ratio) over the no-offload point (baseline_batch at ratio 1.0), both
at cfg's context and MTP: by default the paper's headline, batch 160 at r = 0.21 vs batch 52.
Each table varies one knob and holds the rest at cfg's values.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .config import OVERLAP_STRATEGIES, SimConfig
from .step import simulate

PCIE_GBPS = (4.0, 8.0, 16.0, 24.0, 37.0, 50.0, 64.0)
HIT_RATES = (0.80, 0.90, 0.95, 0.98, 0.99, None)


@dataclass(frozen=True)
class SensitivityRow:
    knob: str
    value: str
    tokens_per_s_per_node: float
    gain_pct: float
    ess_exposed_ms: float
    pcie_busy_fraction: float


def _row(knob: str, value: str, cfg: SimConfig, base_tps: float) -> SensitivityRow:
    res = simulate(cfg, check=False)
    return SensitivityRow(knob, value, res.tokens_per_s_per_node, 100 * (res.tokens_per_s_per_node / base_tps - 1),
                          res.breakdown_us["ess_exposed"] / 1e3, res.pcie_busy_fraction)


def sensitivity(cfg: SimConfig, baseline_batch: int) -> list[SensitivityRow]:
    base = simulate(replace(cfg, work=replace(cfg.work, batch=baseline_batch),
                            ess=replace(cfg.ess, ratio=1.0)), check=False)
    b = base.tokens_per_s_per_node
    rows = [_row("as configured", "-", cfg, b)]
    for g in PCIE_GBPS:
        rows.append(_row("pcie_h2d_gbps", f"{g:g}", replace(cfg, ess=replace(cfg.ess, pcie_h2d_gbps=g)), b))
    for h in HIT_RATES:
        rows.append(_row("hit_rate", "model" if h is None else f"{h:g}",
                         replace(cfg, ess=replace(cfg.ess, hit_rate=h)), b))
    for ov in OVERLAP_STRATEGIES:
        rows.append(_row("overlap", ov, replace(cfg, ess=replace(cfg.ess, overlap=ov)), b))
    for tr in ("flashtrans", "memcpy"):
        rows.append(_row("transfer", tr, replace(cfg, ess=replace(cfg.ess, transfer=tr)), b))
    for w in (True, False):
        rows.append(_row("warmup", str(w).lower(), replace(cfg, ess=replace(cfg.ess, warmup=w)), b))
    return rows
