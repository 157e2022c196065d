"""Capacity planner: for a deployment (GPU type and count, context, TPOT SLO, host memory), the batch,
hot-buffer size, host-pool size and expected tokens/s, and which resource binds.

Search: for each candidate ratio, the largest batch that fits in GPU memory and in host memory
(memory.py) is the start; with a TPOT SLO the batch is bisected down until step_time / accepted tokens
meets it (step time grows with batch). The best ratio is re-evaluated under every overlap strategy.
The baseline is no offload (ratio 1.0) under the same SLO; the gain is best / baseline - 1.

Which resource binds: if the SLO stops the batch before memory does, compute binds (a faster step is
the only way to a larger batch). Otherwise the plan is redone with each resource 25% larger (GPU
memory, host memory when it is limited, the PCIe rate); the one whose relief raises tokens/s most
binds. If none raises it by 0.5%, compute binds: throughput no longer grows with what memory allows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .config import OVERLAP_STRATEGIES, ModelSpec, SimConfig, SimConfigError
from .hardware import get_hardware
from .memory import ess_store_bytes
from .step import StepResult, simulate
from .transfer import GB, h2d_bytes_per_s

DEFAULT_RATIOS = (0.1, 0.15, 0.21, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
RELIEF = 1.25                 # how much more of a resource the binding test offers
BINDING_MIN_GAIN = 0.005      # below this relative gain no resource is said to bind but compute


@dataclass
class PlanResult:
    baseline: StepResult | None
    best: StepResult | None
    by_overlap: dict[str, StepResult]
    by_ratio: list[StepResult]
    slo_tpot_ms: float | None
    binding: str = "none"
    binding_why: str = ""
    relief_gain: dict[str, float] = field(default_factory=dict)

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


def meets(res: StepResult, slo_tpot_ms: float | None) -> bool:
    return slo_tpot_ms is None or res.tpot_ms <= slo_tpot_ms


def best_batch(cfg: SimConfig, slo_tpot_ms: float | None) -> StepResult | None:
    """Largest batch that fits and meets the SLO at cfg's ratio; None if not even batch 1 does."""
    hi = simulate(_with(cfg, batch=1), check=False).memory.max_batch
    if hi < 1:
        return None
    top = simulate(_with(cfg, batch=hi))
    if meets(top, slo_tpot_ms):
        return top
    lo_res = simulate(_with(cfg, batch=1))
    if not meets(lo_res, slo_tpot_ms):
        return None
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        res = simulate(_with(cfg, batch=mid))
        lo, hi, lo_res = (mid, hi, res) if meets(res, slo_tpot_ms) else (lo, mid, lo_res)
    return lo_res


def _search(cfg: SimConfig, slo_tpot_ms: float | None, ratios) -> tuple[StepResult | None, list[StepResult]]:
    m = ModelSpec.load(cfg.deploy.model)
    k = m.topk_tokens
    by_ratio = []
    for r in ratios:
        if r < 1.0 and (m.dense_attention or r * cfg.work.context_tokens < k):
            continue      # the hot buffer must hold at least one top-k set
        res = best_batch(_with(cfg, ratio=r), slo_tpot_ms)
        if res is not None:
            by_ratio.append(res)
    return max(by_ratio, key=lambda s: s.tokens_per_s_per_node, default=None), by_ratio


def plan(cfg: SimConfig, slo_tpot_ms: float | None = None, ratios=DEFAULT_RATIOS, binding: bool = True) -> PlanResult:
    if slo_tpot_ms is not None and slo_tpot_ms <= 0:
        raise SimConfigError(f"slo_tpot_ms = {slo_tpot_ms}: expected a positive time per output token in ms; "
                             f"fix --slo-tpot-ms")
    bad = [r for r in ratios if not 0 < r <= 1]
    if bad:
        raise SimConfigError(f"ratios {bad}: expected sparse memory ratios in (0, 1]; fix --ratios")
    baseline = best_batch(_with(cfg, ratio=1.0), slo_tpot_ms)
    best, by_ratio = _search(cfg, slo_tpot_ms, ratios)
    by_overlap = {}
    if best is not None and best.cfg.ess.offload:
        for ov in OVERLAP_STRATEGIES:
            by_overlap[ov] = simulate(_with(best.cfg, overlap=ov))
        best = max(by_overlap.values(), key=lambda s: s.tokens_per_s_per_node)
    out = PlanResult(baseline, best, by_overlap, by_ratio, slo_tpot_ms)
    if binding and best is not None:
        _binding(out, cfg, ratios)
    return out


def _binding(out: PlanResult, cfg: SimConfig, ratios) -> None:
    best, slo = out.best, out.slo_tpot_ms
    mem = best.memory
    if slo is not None and best.cfg.work.batch < mem.max_batch:
        out.binding = "compute"
        out.binding_why = (f"the TPOT SLO ({slo:g} ms) stops the batch at {best.cfg.work.batch}; memory would "
                           f"allow {mem.max_batch}")
        return
    hw = get_hardware(cfg.deploy.hardware)
    d = cfg.deploy
    reliefs = {"HBM": replace(cfg, deploy=replace(d, gpu_mem_gb=(d.gpu_mem_gb or hw.memory_bytes / GB) * RELIEF))}
    if mem.max_batch_host is not None and d.host_mem_gb is not None:
        reliefs["host memory"] = replace(cfg, deploy=replace(d, host_mem_gb=d.host_mem_gb * RELIEF))
    if any(r < 1.0 for r in ratios):
        rate = h2d_bytes_per_s(cfg.ess, hw) / GB * RELIEF
        reliefs["PCIe"] = replace(cfg, ess=replace(cfg.ess, pcie_h2d_gbps=rate))
    base = best.tokens_per_s_per_node
    for name, c in reliefs.items():
        b, _ = _search(c, slo, ratios)
        out.relief_gain[name] = (b.tokens_per_s_per_node / base - 1.0) if b else -1.0
    name, g = max(out.relief_gain.items(), key=lambda kv: kv[1])
    if g < BINDING_MIN_GAIN:
        out.binding = "compute"
        out.binding_why = (f"25% more of any memory or of PCIe adds < {BINDING_MIN_GAIN:.1%} tokens/s: "
                           f"throughput is bound by step time")
    else:
        out.binding = name
        out.binding_why = f"25% more {name} would add {g:+.1%} tokens/s (the largest of: " + ", ".join(
            f"{k} {v:+.1%}" for k, v in out.relief_gain.items()) + ")"


def sizes(res: StepResult) -> dict[str, float]:
    """What to provision for a planned point (per GPU and per node), in the units ESS's config uses."""
    cfg = res.cfg
    m = ModelSpec.load(cfg.deploy.model)
    slots = math.ceil(cfg.ess.ratio * cfg.work.context_tokens)
    hot = cfg.work.batch * slots * m.latent_bytes_per_token_layer * m.cached_layers
    idx = cfg.work.batch * cfg.work.context_tokens * m.indexer_bytes_per_token_layer * m.index_layers
    host = res.memory.host_bytes_per_request * cfg.work.batch * cfg.deploy.gpus_per_node
    out = {"hot_slots_per_request_layer": slots, "hot_buffer_gb_per_gpu": hot / GB,
           "indexer_keys_gb_per_gpu": idx / GB, "host_pool_gb_per_node": host / GB,
           "gpu_used_gb": res.memory.gpu_used_bytes(cfg.work.batch) / GB}
    if cfg.ess.offload and not m.dense_attention:
        # the target model's ESS store, every tensor (what --ess-explain prints), and its part beyond the hot
        # buffers: staging rings, MTP scratch rows, LRU tables, token map, counters, page rounding
        store = ess_store_bytes(m, cfg.work, cfg.ess, cfg.work.batch)
        target_hot = cfg.work.batch * slots * m.latent_bytes_per_token_layer * m.num_layers * m.attention_sublayers
        out.update(ess_store_bytes_per_gpu=store, ess_store_rest_gb_per_gpu=(store - target_hot) / GB)
    return out
