"""Per-operator costs of one decode layer for one micro-batch, and the profiles that time them.

`layer_ops` lists what a layer does (FLOPs, HBM bytes, interconnect bytes) from the model's shapes alone.
An `OpProfile` turns an `OpCost` into microseconds. `AnalyticalProfile` is a roofline,
`max(flops / (peak x compute_eff), bytes / (hbm x hbm_eff))`; `MeasuredProfile` reads a table measured
on a GPU (op name -> [[tokens, us], ...], interpolated in tokens) and falls back to the roofline for ops
the table lacks, so measured kernels can replace the analytical costs one op at a time.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from .config import ModelSpec, SimConfigError
from .constants import const
from .hardware import HardwareProfile
from .memory import BF16_BYTES, FP8_BYTES, attention_params_per_layer, expert_params

# Phases of a layer, in execution order; overlap.py reads them by these names.
PHASES = ("indexer", "pre_attn", "attention", "post_attn", "ffn", "comm")


@dataclass(frozen=True)
class OpCost:
    name: str
    phase: str
    tokens: int            # query tokens of the micro-batch (the key a measured table is indexed by)
    flops: float = 0.0
    hbm_bytes: float = 0.0
    dtype: str = "bf16"    # compute precision: "fp8" or "bf16"
    rdma_bytes: float = 0.0
    nvlink_bytes: float = 0.0


class OpProfile(Protocol):
    def time_us(self, op: OpCost) -> float: ...


@dataclass(frozen=True)
class AnalyticalProfile:
    hw: HardwareProfile

    def time_us(self, op: OpCost) -> float:
        if op.phase == "comm":
            eff = const("network_efficiency")
            wire = max(op.rdma_bytes / (self.hw.rdma_bytes_per_s * eff),
                       op.nvlink_bytes / (self.hw.nvlink_bytes_per_s * eff))
            return wire * 1e6 + const("comm_latency_us")
        compute = op.flops / (self.hw.flops_per_s(op.dtype) * const("compute_efficiency"))
        memory = op.hbm_bytes / (self.hw.hbm_bytes_per_s * const("hbm_efficiency"))
        return max(compute, memory) * 1e6


class MeasuredProfile:
    """Measured per-op times: JSON {"ops": {"attention.sparse": [[tokens, us], ...], ...}}."""

    def __init__(self, path: str | Path, fallback: OpProfile):
        try:
            table = json.loads(Path(path).read_text())["ops"]
        except (OSError, KeyError, json.JSONDecodeError) as e:
            raise SimConfigError(f"op profile {str(path)!r}: could not read ({e}); expected JSON "
                                 f'{{"ops": {{name: [[tokens, us], ...]}}}}; fix --op-profile') from e
        self._points = {k: np.asarray(sorted(v), dtype=float) for k, v in table.items()}
        self._fallback = fallback

    def time_us(self, op: OpCost) -> float:
        pts = self._points.get(op.name)
        if pts is None:
            return self._fallback.time_us(op)
        return float(np.interp(op.tokens, pts[:, 0], pts[:, 1]))


def _gemm(name: str, phase: str, tokens: int, params: int, hidden_in: int, hidden_out: int) -> OpCost:
    """FP8 weight GEMM: weights read once, BF16 activations in and out."""
    return OpCost(name, phase, tokens, flops=2.0 * tokens * params,
                  hbm_bytes=params * FP8_BYTES + tokens * (hidden_in + hidden_out) * BF16_BYTES, dtype="fp8")


def attention_ops(m: ModelSpec, requests: int, q_tokens: int, context_tokens: int) -> list[OpCost]:
    """MLA + lightning indexer + sparse attention for `requests` x `q_tokens` query tokens."""
    t = requests * q_tokens
    h, k = m.hidden, m.topk_tokens
    latent_dim = m.kv_lora_rank + m.qk_rope_dim
    idx_proj = (m.q_lora_rank * m.index_heads * m.index_head_dim + m.hidden * m.index_head_dim
                + m.hidden * m.index_heads)
    w_uk = m.heads * m.qk_nope_dim * m.kv_lora_rank
    w_uv = m.heads * m.kv_lora_rank * m.v_head_dim
    o_proj = m.heads * m.v_head_dim * h
    pre = attention_params_per_layer(m) - idx_proj - (m.kv_lora_rank * m.heads * (m.qk_nope_dim + m.v_head_dim)) \
        - o_proj + w_uk
    ctx = context_tokens
    return [
        _gemm("indexer.proj", "indexer", t, idx_proj, h, m.index_heads * (m.index_head_dim + 1)),
        OpCost("indexer.score", "indexer", t,
               flops=2.0 * t * m.index_heads * m.index_head_dim * ctx,
               hbm_bytes=requests * ctx * m.indexer_bytes_per_token_layer + t * ctx * 4, dtype="fp8"),
        OpCost("indexer.topk", "indexer", t, hbm_bytes=t * ctx * 4 + t * k * 4),
        _gemm("pre_attn.proj", "pre_attn", t, pre, h, m.heads * latent_dim),
        OpCost("attention.sparse", "attention", t,
               flops=2.0 * t * m.heads * (latent_dim + m.kv_lora_rank) * k,
               hbm_bytes=t * k * m.latent_bytes_per_token_layer + t * m.heads * (latent_dim + m.kv_lora_rank) * 2),
        _gemm("post_attn.proj", "post_attn", t, w_uv + o_proj, m.heads * m.kv_lora_rank, h),
    ]


def ffn_ops(m: ModelSpec, tokens: int, dense: bool, gpus: int, gpus_per_node: int, ep: int) -> list[OpCost]:
    """Dense FFN, or MoE (router, shared expert, local routed experts) plus dispatch/combine traffic."""
    h = m.hidden
    if dense:
        return [_gemm("ffn.dense", "ffn", tokens, 3 * h * m.dense_intermediate, h, h)]
    local_experts = math.ceil(m.routed_experts / ep)
    pairs_per_gpu = tokens * m.experts_per_token * gpus / ep          # balanced routing
    pairs_per_expert = pairs_per_gpu / local_experts
    active = local_experts * (1.0 - math.exp(-pairs_per_expert))      # experts that receive >= 1 token
    send_bytes = tokens * m.experts_per_token * h * (FP8_BYTES + BF16_BYTES)   # fp8 dispatch + bf16 combine
    remote = 1.0 - gpus_per_node / gpus if gpus > gpus_per_node else 0.0
    return [
        _gemm("moe.router", "ffn", tokens, h * m.routed_experts, h, m.routed_experts),
        _gemm("moe.shared", "ffn", tokens, m.shared_experts * expert_params(m), h, h),
        OpCost("moe.experts", "ffn", tokens, flops=2.0 * pairs_per_gpu * expert_params(m),
               hbm_bytes=active * expert_params(m) * FP8_BYTES + pairs_per_gpu * 2 * h * BF16_BYTES, dtype="fp8"),
        OpCost("moe.dispatch_combine", "comm", tokens,
               rdma_bytes=send_bytes * remote, nvlink_bytes=send_bytes * (1.0 - remote)),
    ]


def head_op(m: ModelSpec, tokens: int) -> OpCost:
    """LM head (BF16 weights) with FP32 logits."""
    return OpCost("lm_head", "post_attn", tokens, flops=2.0 * tokens * m.vocab * m.hidden,
                  hbm_bytes=m.vocab * m.hidden * BF16_BYTES + tokens * m.vocab * 4)
