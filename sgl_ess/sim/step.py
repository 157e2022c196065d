"""The decode step model: composes ops, memory, misses, transfer and overlap into one step time.

One step on one GPU (DP attention), as SGLang runs MTP (EAGLE-style, topk 1): the main model verifies
`mtp` tokens per request through all layers and the LM head; then the MTP layer runs once over the
`mtp` tokens (draft extend, producing the first draft) and `mtp - 2` more times with one token (the
remaining drafts), each followed by the LM head on one token per request. With Two-Batch Overlap the
MoE layers run two micro-batches under SGLang's five-stage decode schedule (tbo.py: each DeepEP
all-to-all hides behind the other micro-batch's stages, the rest waits); the dense layers and the MTP
layer run the whole batch with blocking all-to-alls, as SGLang does.
Every kernel launch adds the published launch gap (launches.py: CUDA graph node or stream launch), and
every compute op's time from the published kernel figures is multiplied by kernel_time_scale (the one
step-time constant fitted, on DeepSeek's measured decode deployment, fit.py). Shared-index layers
(GLM-5.2) run no indexer, and their miss fetch is sent when the layer starts (the anchor's top-k is
already known: lead time). Hunyuan V4 (also shared-index) adds its sink rescale to attention; LongCat-Flash
runs two attention sub-layers per decoder layer (each its own rows, indexer and write-back; the layer's
misses of both travel as one fetch), two dense MLPs beside its MoE, and a dense MLP in its NextN layer.
Throughput per node = gpus_per_node x batch x accepted tokens per step / step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import ModelSpec, SimConfig, SimConfigError
from .constants import const
from .hardware import get_hardware
from .hitrate import misses_per_layer
from .memory import MemoryReport, check_fits, memory_report
from .ops import embed_op, head_ops, layer_ops, mtp_input_ops, resolve_op
from .overlap import LayerPhaseTimes, overlap, writeback_exposed
from .profile import OpProfile, OpTimer
from .tbo import STAGES, Fetch, LayerStages, serial, stage_of, tbo
from .transfer import d2h_bytes_per_s, h2d_bytes_per_s, transfer_us

COMPUTE_PHASES = ("attn_in", "indexer", "pre_attn", "attention", "post_attn", "ffn")
BREAKDOWN_KEYS = COMPUTE_PHASES + ("kernel_overhead", "comm_exposed", "ess_exposed", "head", "mtp_draft",
                                   "cpu_gap")
ESS_LAUNCHES = 2        # the FlashTrans fetch and write-back kernels of each layer (the resolve is an op)


@dataclass
class StepResult:
    cfg: SimConfig
    step_us: float
    breakdown_us: dict[str, float]
    memory: MemoryReport
    misses_per_layer: np.ndarray          # per cached layer, per request per step
    pcie_busy_fraction: float
    kernels_per_step: int
    strategies: dict[str, int] = field(default_factory=dict)   # layers x micro-batches per strategy used

    @property
    def accept(self) -> float:
        return self.cfg.work.accept_tokens

    @property
    def otps(self) -> float:
        """Output tokens per second per request."""
        return self.accept / (self.step_us * 1e-6)

    @property
    def tpot_ms(self) -> float:
        return self.step_us / 1e3 / self.accept

    @property
    def tokens_per_s_per_node(self) -> float:
        return self.cfg.deploy.gpus_per_node * self.cfg.work.batch * self.otps

    def row(self) -> dict:
        """The flat record `run --json` prints."""
        w, e, d = self.cfg.work, self.cfg.ess, self.cfg.deploy
        m = self.misses_per_layer[:-1] if len(self.misses_per_layer) > 1 else self.misses_per_layer
        return {
            "hardware": d.hardware, "model": d.model, "context": w.context_tokens, "mtp": w.mtp,
            "accept": round(self.accept, 4), "batch": w.batch, "ratio": e.ratio,
            "overlap": e.overlap if e.offload else "off",
            "tokens_per_s_per_node": round(self.tokens_per_s_per_node, 2), "otps": round(self.otps, 3),
            "tpot_ms": round(self.tpot_ms, 3), "step_ms": round(self.step_us / 1e3, 3),
            "max_batch_fits": self.memory.max_batch, "misses_per_layer": round(float(m.mean()), 2),
            "misses_per_layer_max": round(float(m.max()), 2), "pcie_busy_fraction": round(self.pcie_busy_fraction, 4),
            "gpu_mem_gb": round(self.memory.gpu_used_bytes(w.batch) / 1e9, 2),
            "host_mem_gb_per_node": round(self.memory.host_bytes_per_request * w.batch * d.gpus_per_node / 1e9, 1),
            "kernels_per_step": self.kernels_per_step,
            "breakdown_ms": {k: round(v / 1e3, 3) for k, v in self.breakdown_us.items()},
        }


def micro_batches(batch: int, tbo: bool) -> list[int]:
    return [batch - batch // 2, batch // 2] if tbo and batch >= 2 else [batch]


class ScaledTimer:
    """An op timer whose compute ops (not the all-to-alls, not a measured table's ops) take `scale` x longer."""

    def __init__(self, timer: OpTimer, scale: float):
        self.timer, self.scale = timer, scale

    def time_us(self, op) -> float:
        t = self.timer.time_us(op)
        if op.phase == "comm" or op.name in self.timer.profile.tables:
            return t
        return t * self.scale


class _Stepper:
    """Times layers for one configuration; adds every op's time to the breakdown."""

    def __init__(self, cfg: SimConfig, m: ModelSpec, timer: OpTimer, kernel_us: float):
        self.cfg, self.m, self.timer, self.kernel_us = cfg, m, timer, kernel_us
        hw = get_hardware(cfg.deploy.hardware)
        self.h2d, self.d2h = h2d_bytes_per_s(cfg.ess, hw), d2h_bytes_per_s(cfg.ess, hw)
        self.bd = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        self.fetch_total_us = 0.0
        self.kernels = 0
        self.strategies: dict[str, int] = {}

    def ops_us(self, ops, key: str) -> float:
        """Ops outside the layers (embedding, LM head): all compute, booked under `key`."""
        t = sum(self.timer.time_us(op) + op.kernels * self.kernel_us for op in ops)
        self.kernels += sum(op.kernels for op in ops)
        self.bd[key] += t
        return t

    def layer_stages(self, b: int, q: int, dense: bool, misses: float, extra_ops=None,
                     anchor: bool = True, mtp: bool = False) -> LayerStages:
        """One layer of one micro-batch of `b` requests: its TBO stages; books phases and launches.
        `misses`: per request, summed over the layer's attention sub-layers (one fetch carries them all)."""
        d, w, e, m = self.cfg.deploy, self.cfg.work, self.cfg.ess, self.m
        sub = 1 if mtp else m.attention_sublayers
        ops = ((list(extra_ops(b)) if extra_ops else [])
               + layer_ops(m, b, q, w.context_tokens, dense, d.ep, anchor, mtp))
        if e.offload:
            ops += [resolve_op(m, b * q)] * sub
        stages = [0.0] * STAGES
        phase = dict.fromkeys(COMPUTE_PHASES, 0.0)
        launches = dict.fromkeys(COMPUTE_PHASES, 0)
        comm = {"dispatch": 0.0, "combine": 0.0}
        for op in ops:
            t = self.timer.time_us(op)
            if op.phase == "comm":
                comm[op.kind] += t
                continue
            phase[op.phase] += t
            launches[op.phase] += op.kernels
            stages[stage_of(op.name, op.phase)] += t + op.kernels * self.kernel_us
        n_launch = sum(launches.values())
        fetch_job = None
        if e.offload:
            fetch = transfer_us(b * misses, m.latent_bytes_per_token_layer, self.h2d)
            wb = transfer_us(b * q * sub, m.latent_bytes_per_token_layer, self.d2h)
            on_path = {k: phase[k] + launches[k] * self.kernel_us for k in COMPUTE_PHASES}
            union = min(m.topk_tokens * q, w.context_tokens) * sub
            t = LayerPhaseTimes(on_path["indexer"], on_path["pre_attn"], on_path["attention"], on_path["post_attn"],
                                fetch, wb, min(1.0, misses / union), on_path["attn_in"])
            res = overlap(e.overlap, t, self.kernel_us)     # picks DA or DBA for "full", and the extra launches
            self.fetch_total_us += fetch + wb
            self.strategies[res.strategy] = self.strategies.get(res.strategy, 0) + 1
            ess_launch = (ESS_LAUNCHES + res.extra_kernels) * sub
            n_launch += ess_launch
            stages[1] += ess_launch * self.kernel_us
            indexer_end = stages[0] - on_path["pre_attn"]          # T0 = previous output, attn_in, indexer, pre_attn
            if fetch > 0:
                if not anchor:      # shared index: the top-k is known before the layer starts
                    fetch_job = Fetch(((0.0, fetch),), 0 if res.strategy == "none" else 1,
                                      indexer_end if res.strategy == "none"
                                      else on_path["attention"] * (1.0 - t.miss_fraction))
                elif res.strategy == "dba":
                    half = indexer_end - on_path["indexer"] / 2
                    fetch_job = Fetch(((half, fetch / 2), (indexer_end, fetch / 2)), 1,
                                      on_path["attention"] * (1.0 - t.miss_fraction))
                elif res.strategy == "da":
                    fetch_job = Fetch(((indexer_end, fetch),), 1, on_path["attention"] * (1.0 - t.miss_fraction))
                else:
                    fetch_job = Fetch(((indexer_end, fetch),), 0, indexer_end)
            wb_exposed = wb if res.strategy == "none" else writeback_exposed(t)
            stages[0 if res.strategy == "none" else 1] += wb_exposed
            self.bd["ess_exposed"] += wb_exposed
        for k in COMPUTE_PHASES:
            self.bd[k] += phase[k]
        self.bd["kernel_overhead"] += n_launch * self.kernel_us
        self.kernels += n_launch
        return LayerStages(tuple(stages), comm["dispatch"], comm["combine"], fetch_job)

    def layers_us(self, mbs: list[int], q: int, specs: list[tuple], key: str | None = None,
                  extra_ops=None) -> float:
        """Layers given as (dense, misses per request[, anchor]): two micro-batches under TBO, else the whole batch
        with blocking all-to-alls. `key` books the whole time under one entry (the MTP draft)."""
        before = dict(self.bd)
        if len(mbs) > 1:
            a = [self.layer_stages(mbs[0], q, *sp[:2], extra_ops, *sp[2:]) for sp in specs]
            b = [self.layer_stages(mbs[1], q, *sp[:2], extra_ops, *sp[2:]) for sp in specs]
            sched = tbo(a, b)
        else:
            sched = serial([self.layer_stages(mbs[0], q, *sp[:2], extra_ops, *sp[2:]) for sp in specs])
        if key is None:
            self.bd["comm_exposed"] += sched.comm_wait_us
            self.bd["ess_exposed"] += sched.fetch_wait_us
        else:
            for k in self.bd:
                self.bd[k] = before[k]
            self.bd[key] += sched.total_us
        return sched.total_us


def simulate(cfg: SimConfig, profile: OpProfile | None = None, check: bool = True,
             model: ModelSpec | None = None, kernel_overhead_us: float | None = None,
             kernel_scale: float | None = None) -> StepResult:
    """Simulate one decode step. `check=False` skips the does-the-batch-fit error (for sweeps).

    `profile` defaults to cfg.deploy.op_profile (or the shipped H200 one); `kernel_overhead_us` (per
    launch) defaults to the published gap for cfg.deploy.cuda_graph (launches.py), `kernel_scale` to
    kernel_time_scale as fitted for that profile on DeepSeek's decode deployment (fit.py)."""
    d, w, e = cfg.deploy, cfg.work, cfg.ess
    m = model or ModelSpec.load(d.model)
    hw = get_hardware(d.hardware)
    prof = profile or OpProfile.load(d.op_profile)
    prof.check(m, hw)
    if w.mtp > 1 and m.num_mtp_layers < 1:
        raise SimConfigError(f"mtp = {w.mtp}: model {m.name!r} has no MTP layer; expected --mtp 1")
    if e.offload and e.ratio * w.context_tokens < m.topk_tokens:
        raise SimConfigError(f"ratio = {e.ratio}: ratio x context = {e.ratio * w.context_tokens:.0f} GPU slots per "
                             f"layer, fewer than the top-k ({m.topk_tokens}) attention must hold; expected ratio >= "
                             f"{m.topk_tokens / w.context_tokens:.3f} at context {w.context_tokens}; fix --ratio")
    mem = memory_report(m, hw, d, w, e)
    if check:
        check_fits(mem, w, e, hw.name)
    if e.offload and m.dense_attention:
        raise SimConfigError(f"ratio = {e.ratio}: model {m.name!r} has dense MLA (no indexer top-k), which reads "
                             f"every cached row each step, so ESS cannot offload it; expected --ratio 1.0 or a "
                             f"sparse-attention model (--model deepseek_v32_exp, glm_5, glm_5_2, hyv4, "
                             f"longcat_flash_dsa)")
    from .fit import kernel_overhead_for, kernel_scale_for
    if kernel_overhead_us is None:
        kernel_overhead_us = kernel_overhead_for(prof, d.cuda_graph)
    if kernel_scale is None:
        kernel_scale = kernel_scale_for(prof)
    st = _Stepper(cfg, m, ScaledTimer(prof.timer(hw, d.ep), kernel_scale), kernel_overhead_us)
    misses = misses_per_layer(m.cached_layers, w.context_tokens, m.topk_tokens, e.ratio, w.mtp, e.warmup,
                              w.output_tokens / w.accept_tokens, e.hit_rate)
    whole, mbs = [w.batch], micro_batches(w.batch, d.tbo)
    nd = m.num_dense_layers
    step = st.ops_us([embed_op(m, w.batch * w.mtp)], "head")
    # SGLang runs the dense layers before TBO starts, on the whole batch; TBO covers the MoE layers
    def layer_misses(i: int) -> float:
        return float(sum(misses[j] for j in m.cached_of(i)))
    step += st.layers_us(whole, w.mtp, [(True, layer_misses(i), m.is_anchor(i)) for i in range(nd)])
    step += st.layers_us(mbs, w.mtp, [(False, layer_misses(i), m.is_anchor(i)) for i in range(nd, m.num_layers)])
    step += st.ops_us(head_ops(m, w.batch * w.mtp), "head")
    if w.mtp > 1:   # draft extend over the mtp tokens, then mtp - 2 one-token draft passes (no TBO in NextN)
        mtp_misses = layer_misses(m.num_layers)
        step += st.layers_us(whole, w.mtp, [(False, mtp_misses, True, True)], "mtp_draft",
                             lambda b: mtp_input_ops(m, b * w.mtp))
        step += st.ops_us(head_ops(m, w.batch), "mtp_draft")
        for _ in range(w.mtp - 2):
            step += st.layers_us(whole, 1, [(False, mtp_misses / w.mtp, True, True)], "mtp_draft",
                                 lambda b: mtp_input_ops(m, b))
            step += st.ops_us(head_ops(m, w.batch), "mtp_draft")
    gap = const("step_cpu_gap_us")
    st.bd["cpu_gap"] += gap
    step += gap
    return StepResult(cfg, step, st.bd, mem, misses, min(1.0, st.fetch_total_us / step), st.kernels, st.strategies)
