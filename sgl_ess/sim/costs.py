"""The structured operator model: microseconds for an `OpCost` from its shape and a profile's constants.

Every kernel on the GPU is a blended roofline, t = (t_c^p + t_m^p)^(1/p), between its compute time
t_c and its HBM time t_m (p = roofline_blend_exp; the blend is what bends a GEMM's efficiency curve
over M from memory-bound at small M to compute-bound at large M):
- gemm / grouped_gemm: t_c = 2 x groups x ceil(m / gemm_m_tile) x gemm_m_tile x n x k / (peak x
  gemm_compute_eff), t_m = bytes / (HBM x gemm_mem_eff). MoE experts are a grouped GEMM with the mean
  tokens per local expert as m (balanced routing under EP).
- dense_attention (DeepSeek-V3's MLA over the whole context): FlashMLA's published dense decode rates
  (flashmla_dense_tflops, flashmla_dense_GBps as a fraction of H800 HBM, constants.json), blended.
- attention (sparse MLA over the top-k): t_c at sparse_attention_tflops; fixed by k, not by context.
- indexer (FP8 MQA logits over every key): t_c at mqa_logits_tflops, t_m at HBM x indexer_mem_eff, blended
  with indexer_blend_exp (both from H200 decode timings of the paged kernel); grows linearly with context.
- topk (k of each row of fp32 logits): max(latency(context), rows x context / rate(context)), both
  interpolated over SGLang's published H200 fast_topk_v2 figures: one call takes a latency set by the
  row length while the rows fit on the GPU at once, and runs at an element rate once they do not.
- elementwise: HBM-bound, bytes / (HBM x gemm_mem_eff).
- dispatch / combine (DeepEP low latency over RDMA): max(floor, bytes / rate(EP)), rate interpolated
  over the published EP table and scaled by the NIC (rdma_GBps / network_reference_GBps).
Rates published for H800/H200 SMs (attention, indexer) scale by bf16_tflops / compute_reference on
other GPUs. Kernel launch gaps are not in here: step.py adds the published per-launch gap (launches.py)
and multiplies compute ops by the fitted kernel_time_scale.
"""
from __future__ import annotations

import math

import numpy as np

from .constants import const
from .hardware import HardwareProfile, get_hardware
from .ops import OpCost


def blend_us(t_compute_s: float, t_memory_s: float, p: float) -> float:
    if t_compute_s <= 0 or t_memory_s <= 0:
        return max(t_compute_s, t_memory_s) * 1e6
    return (t_compute_s ** p + t_memory_s ** p) ** (1.0 / p) * 1e6


class CostModel:
    """Times one op from the named constants of a profile (`constants[name]["value"]`) and a GPU."""

    def __init__(self, constants: dict[str, dict], hw: HardwareProfile):
        v = {k: c["value"] for k, c in constants.items()}
        self.hw = hw
        self.e_c = float(v["gemm_compute_eff"])
        self.e_m = float(v["gemm_mem_eff"])
        self.p = float(v["roofline_blend_exp"])
        self.m_tile = int(v["gemm_m_tile"])
        sm_scale = hw.bf16_flops_per_s / (float(v["compute_reference_bf16_tflops"]) * 1e12)
        self.attention_flops_per_s = float(v["sparse_attention_tflops"]) * 1e12 * sm_scale
        self.mqa_flops_per_s = float(v["mqa_logits_tflops"]) * 1e12 * sm_scale
        self.indexer_hbm = hw.hbm_bytes_per_s * float(v["indexer_mem_eff"])
        self.indexer_p = float(v["indexer_blend_exp"])
        lat, rate = np.asarray(v["topk_latency_us"], dtype=float), np.asarray(v["topk_elements_per_s"], dtype=float)
        self._topk_lat = (lat[:, 0], lat[:, 1] / sm_scale)
        self._topk_rate = (rate[:, 0], rate[:, 1] * 1e9 * sm_scale)
        table = np.asarray(v["deepep_ll_table"], dtype=float)
        nic = hw.rdma_bytes_per_s / (float(v["network_reference_GBps"]) * 1e9)
        self._ep_log = np.log2(table[:, 0])
        self._dispatch = table[:, 1] * 1e9 * nic
        self._combine = table[:, 2] * 1e9 * nic
        self.comm_floor_us = float(v["deepep_ll_floor_us"])
        ref = get_hardware("h800")         # FlashMLA's dense figures were measured on H800 SXM5
        self.dense_flops_per_s = float(const("flashmla_dense_tflops")) * 1e12 * sm_scale
        self.dense_hbm = hw.hbm_bytes_per_s * float(const("flashmla_dense_GBps")) * 1e9 / ref.hbm_bytes_per_s

    @property
    def hbm(self) -> float:
        return self.hw.hbm_bytes_per_s * self.e_m

    def gemm_us(self, op: OpCost) -> float:
        padded = math.ceil(op.m / self.m_tile) * self.m_tile if op.m > 0 else 0
        flops = 2.0 * op.groups * padded * op.n * op.k
        return blend_us(flops / (self.hw.flops_per_s(op.dtype) * self.e_c), op.hbm_bytes / self.hbm, self.p)

    def topk_us(self, rows: float, context: float) -> float:
        """Top-k of `rows` rows of `context` logits: the call's latency, or the element rate if slower."""
        if rows <= 0 or context <= 0:
            return 0.0
        ctx, lat = self._topk_lat
        if context <= ctx[-1] or len(ctx) == 1:
            t_lat = float(np.interp(context, ctx, lat))
        else:   # longer rows: extend along the last segment
            t_lat = float(lat[-1] + max(0.0, (lat[-1] - lat[-2]) / (ctx[-1] - ctx[-2])) * (context - ctx[-1]))
        t_rate = rows * context / float(np.interp(context, *self._topk_rate)) * 1e6
        return max(t_lat, t_rate)

    def comm_rate(self, kind: str, ep: int) -> float:
        rates = self._dispatch if kind == "dispatch" else self._combine
        return float(np.interp(math.log2(max(ep, 1)), self._ep_log, rates))

    def time_us(self, op: OpCost, ep: int) -> float:
        if op.kind in ("gemm", "grouped_gemm"):
            return self.gemm_us(op)
        if op.kind == "attention":
            return blend_us(op.flops / self.attention_flops_per_s, op.hbm_bytes / self.hbm, self.p)
        if op.kind == "dense_attention":
            return blend_us(op.flops / self.dense_flops_per_s, op.hbm_bytes / self.dense_hbm, self.p)
        if op.kind == "indexer":
            return blend_us(op.flops / self.mqa_flops_per_s, op.hbm_bytes / self.indexer_hbm, self.indexer_p)
        if op.kind == "topk":
            return self.topk_us(op.m, op.x / op.m if op.m > 0 else 0.0)
        if op.kind == "elementwise":
            return op.hbm_bytes / self.hbm * 1e6
        if op.kind in ("dispatch", "combine"):
            if op.net_bytes <= 0:
                return 0.0
            return max(self.comm_floor_us, op.net_bytes / self.comm_rate(op.kind, ep) * 1e6)
        raise ValueError(f"op {op.name!r}: unknown kind {op.kind!r}")
