"""One MoE layer's phase times for a given miss count: what the immediate fetch leaves exposed, and
how much link time the layer leaves for speculative rows (MODELLED from the simulator's op costs,
not measured). For `python -m bench prefetch --predictors`; no torch.

The layer runs one micro-batch of `cfg.work.batch` requests serially (no Two-Batch Overlap), with
the same ops, op timer, kernel-launch overhead and FlashTrans rates as step.py. `exposed_us` is
overlap.py's accounting for `cfg.ess.overlap`; `spare_link_us` is the layer's critical-path time
minus its own immediate fetch: what a speculative fetch for the next layer can use without
delaying an immediate one (the worker serves immediate plans first).
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import ModelSpec, SimConfig
from .fit import kernel_overhead_for, kernel_scale_for
from .hardware import get_hardware
from .ops import attention_ops, ffn_ops, resolve_op
from .overlap import LayerPhaseTimes, overlap
from .profile import OpProfile
from .step import ScaledTimer
from .transfer import d2h_bytes_per_s, h2d_bytes_per_s, transfer_us


@dataclass(frozen=True)
class LayerExposure:
    phases: LayerPhaseTimes
    exposed_us: float          # fetch + write-back time left on the critical path
    layer_us: float            # the layer's compute on the critical path (launches included)
    spare_link_us: float       # link time the layer leaves free after its own immediate fetch
    h2d_bytes_per_s: float


class LayerExposureModel:
    """Times the compute once per configuration; `at(misses)` prices any miss count."""

    def __init__(self, cfg: SimConfig):
        d, w = cfg.deploy, cfg.work
        self.cfg = cfg
        self.m = ModelSpec.load(d.model)
        hw = get_hardware(d.hardware)
        prof = OpProfile.load(d.op_profile)
        timer = ScaledTimer(prof.timer(hw, d.ep), kernel_scale_for(prof))
        kernel_us = kernel_overhead_for(prof, d.cuda_graph)
        b, q = w.batch, w.mtp
        ops = attention_ops(self.m, b, q, w.context_tokens) + [resolve_op(self.m, b * q)] + ffn_ops(
            self.m, b * q, False, d.ep)
        self.on_path = dict.fromkeys(("attn_in", "indexer", "pre_attn", "attention", "post_attn", "ffn", "comm"), 0.0)
        for op in ops:
            self.on_path[op.phase] += timer.time_us(op) + op.kernels * kernel_us
        self.h2d = h2d_bytes_per_s(cfg.ess, hw)
        self.wb_us = transfer_us(b * q, self.m.latent_bytes_per_token_layer, d2h_bytes_per_s(cfg.ess, hw))
        self.union = min(self.m.topk_tokens * q, w.context_tokens)

    @property
    def row_bytes(self) -> int:
        return self.m.latent_bytes_per_token_layer

    @property
    def topk(self) -> int:
        return self.m.topk_tokens

    def at(self, misses_per_request: float) -> LayerExposure:
        p, b = self.on_path, self.cfg.work.batch
        fetch = transfer_us(b * misses_per_request, self.m.latent_bytes_per_token_layer, self.h2d)
        t = LayerPhaseTimes(p["indexer"], p["pre_attn"], p["attention"], p["post_attn"], fetch, self.wb_us,
                            min(1.0, misses_per_request / self.union), p["attn_in"])
        res = overlap(self.cfg.ess.overlap, t)
        layer_us = sum(p.values())
        return LayerExposure(t, res.exposed_us, layer_us, max(0.0, layer_us - fetch), self.h2d)
