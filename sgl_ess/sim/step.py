"""The decode step model: composes ops, memory, misses, transfer and overlap into one step time.

One step on one GPU (DP attention): the main model verifies `mtp` tokens per request through all 61
layers, then the LM head; the MTP layer runs once over the `mtp` tokens (draft extend) and `mtp - 1`
times with one token (drafting), each followed by the LM head. With Two-Batch Overlap the batch is
split into two micro-batches; per layer the step pays max(compute_0 + compute_1, comm_0 + comm_1),
so communication (and ESS exposure) hides behind the other micro-batch. Throughput per node =
gpus_per_node x batch x accepted tokens per step / step time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import ModelSpec, SimConfig, SimConfigError
from .constants import const
from .hardware import get_hardware
from .hitrate import misses_per_layer
from .memory import MemoryReport, check_fits, memory_report
from .ops import AnalyticalProfile, OpProfile, attention_ops, ffn_ops, head_op
from .overlap import LayerPhaseTimes, overlap
from .transfer import d2h_bytes_per_s, h2d_bytes_per_s, transfer_us

BREAKDOWN_KEYS = ("indexer", "pre_attn", "attention", "post_attn", "ffn", "comm_exposed",
                  "ess_exposed", "overhead", "head", "mtp_draft")


@dataclass
class StepResult:
    cfg: SimConfig
    step_us: float
    breakdown_us: dict[str, float]
    memory: MemoryReport
    misses_per_layer: np.ndarray          # per cached layer, per request per step
    pcie_busy_fraction: float
    strategies: dict[str, int] = field(default_factory=dict)   # layers x micro-batches per strategy used

    @property
    def accept(self) -> float:
        return self.cfg.work.accept_tokens

    @property
    def otps(self) -> float:
        """Output tokens per second per request."""
        return self.accept / (self.step_us * 1e-6)

    @property
    def tokens_per_s_per_node(self) -> float:
        return self.cfg.deploy.gpus_per_node * self.cfg.work.batch * self.otps

    def row(self) -> dict:
        """The flat record `run --json` prints."""
        w, e, d = self.cfg.work, self.cfg.ess, self.cfg.deploy
        return {
            "hardware": d.hardware, "context": w.context_tokens, "mtp": w.mtp, "accept": round(self.accept, 4),
            "batch": w.batch, "ratio": e.ratio, "overlap": e.overlap if e.offload else "off",
            "tokens_per_s_per_node": round(self.tokens_per_s_per_node, 2), "otps": round(self.otps, 3),
            "step_ms": round(self.step_us / 1e3, 3), "max_batch_fits": self.memory.max_batch,
            "misses_per_layer": round(float(self.misses_per_layer[:-1].mean()), 2),
            "misses_per_layer_max": round(float(self.misses_per_layer[:-1].max()), 2),
            "pcie_busy_fraction": round(self.pcie_busy_fraction, 4),
            "gpu_mem_gb": round(self.memory.gpu_used_bytes(w.batch) / 1e9, 2),
            "host_mem_gb_per_node": round(self.memory.host_bytes_per_request * w.batch * d.gpus_per_node / 1e9, 1),
            "breakdown_ms": {k: round(v / 1e3, 3) for k, v in self.breakdown_us.items()},
        }


def _micro_batches(batch: int, tbo: bool) -> list[int]:
    return [batch - batch // 2, batch // 2] if tbo and batch >= 2 else [batch]


class _Stepper:
    """Times layers for one configuration; op lists are shared by all layers of the same kind."""

    def __init__(self, cfg: SimConfig, m: ModelSpec, profile: OpProfile):
        self.cfg, self.m, self.p = cfg, m, profile
        hw = get_hardware(cfg.deploy.hardware)
        self.h2d, self.d2h = h2d_bytes_per_s(cfg.ess, hw), d2h_bytes_per_s(cfg.ess, hw)
        self.bd = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        self.fetch_total_us = 0.0
        self.strategies: dict[str, int] = {}

    def _phase_us(self, ops) -> dict[str, float]:
        out: dict[str, float] = {}
        for op in ops:
            out[op.phase] = out.get(op.phase, 0.0) + self.p.time_us(op)
        return out

    def layer_us(self, mbs: list[int], q: int, dense: bool, misses: float, key: str | None = None) -> float:
        """One layer over all micro-batches; `misses` per request; `key` books time elsewhere (draft)."""
        d, w, e, m = self.cfg.deploy, self.cfg.work, self.cfg.ess, self.m
        computes, comms = [], []
        local = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        for b in mbs:
            ph = self._phase_us(attention_ops(m, b, q, w.context_tokens)
                                + ffn_ops(m, b * q, dense, d.gpus, d.gpus_per_node, d.ep))
            fetch = transfer_us(b * misses, m.latent_bytes_per_token_layer, self.h2d) if e.offload else 0.0
            wb = transfer_us(b * q, m.latent_bytes_per_token_layer, self.d2h) if e.offload else 0.0
            union = min(m.topk_tokens * q, w.context_tokens)
            res = overlap(e.overlap, LayerPhaseTimes(
                ph.get("indexer", 0.0), ph.get("pre_attn", 0.0), ph.get("attention", 0.0),
                ph.get("post_attn", 0.0), fetch, wb, min(1.0, misses / union)))
            self.fetch_total_us += fetch + wb
            if e.offload:
                self.strategies[res.strategy] = self.strategies.get(res.strategy, 0) + 1
            for k in ("indexer", "pre_attn", "attention", "post_attn", "ffn"):
                local[k] += ph.get(k, 0.0)
            local["ess_exposed"] += res.cost_us
            local["overhead"] += const("layer_overhead_us")
            computes.append(sum(ph.get(k, 0.0) for k in ("indexer", "pre_attn", "attention", "post_attn", "ffn"))
                            + res.cost_us + const("layer_overhead_us"))
            comms.append(ph.get("comm", 0.0))
        total = max(sum(computes), sum(comms)) if len(mbs) > 1 else computes[0] + comms[0]
        local["comm_exposed"] = total - sum(computes)
        if key is None:
            for k, v in local.items():
                self.bd[k] += v
        else:
            self.bd[key] += total
        return total


def simulate(cfg: SimConfig, profile: OpProfile | None = None, check: bool = True,
             model: ModelSpec | None = None) -> StepResult:
    """Simulate one decode step. `check=False` skips the does-the-batch-fit error (for sweeps)."""
    m = model or ModelSpec.deepseek_v32_exp()
    d, w, e = cfg.deploy, cfg.work, cfg.ess
    hw = get_hardware(d.hardware)
    if e.offload and e.ratio * w.context_tokens < m.topk_tokens:
        raise SimConfigError(f"ratio = {e.ratio}: ratio x context = {e.ratio * w.context_tokens:.0f} GPU slots per "
                             f"layer, fewer than the top-k ({m.topk_tokens}) attention must hold; expected ratio >= "
                             f"{m.topk_tokens / w.context_tokens:.3f} at context {w.context_tokens}; fix --ratio")
    mem = memory_report(m, hw, d, w, e)
    if check:
        check_fits(mem, w, e, hw.name)
    prof = profile or AnalyticalProfile(hw)
    st = _Stepper(cfg, m, prof)
    decode_steps = w.output_tokens / w.accept_tokens
    misses = misses_per_layer(m.cached_layers, w.context_tokens, m.topk_tokens, e.ratio, w.mtp, e.warmup,
                              decode_steps, e.hit_rate)
    mbs = _micro_batches(w.batch, d.tbo)
    step = 0.0
    for layer in range(m.num_layers):
        step += st.layer_us(mbs, w.mtp, layer < m.num_dense_layers, float(misses[layer]))
    head = prof.time_us(head_op(m, w.batch * w.mtp))
    st.bd["head"] += head
    step += head
    if w.mtp > 1:   # draft extend over the mtp tokens, then mtp - 1 single-token draft passes
        step += st.layer_us(mbs, w.mtp, False, float(misses[-1]), key="mtp_draft")
        for _ in range(w.mtp - 1):
            step += st.layer_us(mbs, 1, False, 0.0, key="mtp_draft")
            t = prof.time_us(head_op(m, w.batch))
            st.bd["mtp_draft"] += t
            step += t
    step += const("step_overhead_us")
    st.bd["overhead"] += const("step_overhead_us")
    return StepResult(cfg, step, st.bd, mem, misses, min(1.0, st.fetch_total_us / step), st.strategies)
