"""What one decode layer does, as a list of operators with their shapes, FLOPs and bytes.

Nothing here knows how fast anything runs: `OpCost` carries the work (a GEMM's M, N, K; FLOPs; HBM
bytes; network bytes; kernel launches) and the work variable `x` a measured profile table is indexed
by (`x_unit`: "tokens" = query tokens of the micro-batch, "pairs" = token-expert pairs on this GPU,
"token_keys" = query tokens x context tokens). profile.py turns an OpCost into microseconds.

One micro-batch of `requests` requests, `q` query tokens each (q = MTP tokens verified per step, or 1
for a draft pass), at `context` tokens of history. Names are stable: measured tables use them as keys.
Phases (execution order within a layer; overlap.py reads them): attn_in (input norm, q_a/kv_a
projections: what the indexer needs), indexer, pre_attn, attention, post_attn, ffn; comm runs on the
network; head is outside the layers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .config import ModelSpec

BF16 = 2
FP8 = 1
FP32 = 4
SCALE_BLOCK = 128          # one fp32 scale per 128 fp8 values (DeepSeek's fine-grained FP8)


@dataclass(frozen=True)
class OpCost:
    name: str
    phase: str
    kind: str               # gemm | grouped_gemm | elementwise | attention | indexer | topk | dispatch | combine
    x: float                # work variable of a measured table
    x_unit: str             # tokens | pairs | token_keys
    flops: float = 0.0
    hbm_bytes: float = 0.0
    net_bytes: float = 0.0
    kernels: int = 1        # GPU kernel launches (each costs kernel_overhead_us on top of its roofline)
    dtype: str = "fp8"      # tensor-core precision of a GEMM: fp8 or bf16
    m: float = 0.0          # GEMM rows per group (tokens; mean over experts for grouped GEMMs)
    n: int = 0
    k: int = 0
    groups: int = 1


def gemm(name: str, phase: str, tokens: float, n: int, k: int, dtype: str = "fp8", groups: int = 1,
         x: float | None = None, x_unit: str = "tokens", weight_groups: float | None = None) -> OpCost:
    """D[m, n] = A[m, k] @ W[n, k]^T per group; weights read once per group that has rows."""
    wb = FP8 if dtype == "fp8" else BF16
    wg = groups if weight_groups is None else weight_groups
    flops = 2.0 * groups * tokens * n * k
    bytes_ = wg * n * k * wb + groups * tokens * (k * wb + n * BF16)
    return OpCost(name, phase, "gemm" if groups == 1 else "grouped_gemm", tokens if x is None else x, x_unit,
                  flops=flops, hbm_bytes=bytes_, dtype=dtype, m=tokens, n=n, k=k, groups=groups)


def elementwise(name: str, phase: str, rows: float, bytes_per_row: float, kernels: int = 1,
                x_unit: str = "tokens") -> OpCost:
    """A memory-bound kernel (norm, RoPE, activation, quantization, cache write) over `rows` rows."""
    return OpCost(name, phase, "elementwise", rows, x_unit, hbm_bytes=rows * bytes_per_row, kernels=kernels)


def attention_ops(m: ModelSpec, requests: int, q: int, context: int, indexer: bool = True) -> list[OpCost]:
    """MLA with the lightning indexer and sparse attention over the top-k, absorbed (decode) form.
    `indexer=False`: a shared-index layer (GLM-5.2) reuses the anchor's top-k, so it has no indexer ops.
    A model without an indexer (DeepSeek-V3) runs dense MLA over the whole context instead."""
    t = requests * q
    h = m.hidden
    latent = m.kv_lora_rank + m.qk_rope_dim
    k_sel = min(m.topk_tokens, context)
    qk_head = m.qk_nope_dim + m.qk_rope_dim
    ih, idim = m.index_heads, m.index_head_dim
    head = [
        elementwise("attn.input_norm", "attn_in", t, h * (BF16 * 2 + FP8)),
        gemm("attn.q_a_kv_a", "attn_in", t, m.q_lora_rank + latent, h),
        elementwise("attn.qkv_norm", "attn_in", t, m.q_lora_rank * (BF16 * 2 + FP8) + latent * BF16 * 2, 2),
    ]
    pre = [
        gemm("attn.q_b", "pre_attn", t, m.heads * qk_head, m.q_lora_rank),
        gemm("attn.w_uk", "pre_attn", t, m.kv_lora_rank, m.qk_nope_dim, groups=m.heads),
        elementwise("attn.rope_cache", "pre_attn", t, m.heads * m.qk_rope_dim * BF16 * 2 + latent * BF16
                    + m.latent_bytes_per_token_layer, 2),
    ]
    post = [
        gemm("attn.w_uv", "post_attn", t, m.v_head_dim, m.kv_lora_rank, groups=m.heads),
        elementwise("attn.o_quant", "post_attn", t, m.heads * m.v_head_dim * (BF16 + FP8)),
        gemm("attn.o_proj", "post_attn", t, h, m.heads * m.v_head_dim),
        elementwise("attn.post_norm", "post_attn", t, h * (BF16 * 3 + FP8)),
    ]
    if m.dense_attention:     # FlashMLA dense decode: every request reads its whole latent history
        return head + pre + [OpCost(
            "attention.dense", "attention", "dense_attention", t * context, "token_keys",
            flops=2.0 * t * m.heads * (latent + m.kv_lora_rank) * context,
            hbm_bytes=requests * context * m.latent_bytes_per_token_layer
            + t * m.heads * (latent + m.kv_lora_rank) * BF16, kernels=2)] + post
    sparse = OpCost("attention.sparse", "attention", "attention", t, "tokens",
                    flops=2.0 * t * m.heads * (latent + m.kv_lora_rank) * k_sel,
                    hbm_bytes=t * k_sel * m.latent_bytes_per_token_layer
                    + t * m.heads * (latent + m.kv_lora_rank) * BF16, kernels=2)
    if m.attention_sinks:     # Hunyuan V4: rescale the output by the sink's share of each head's softmax
        sparse = [sparse, elementwise("attention.sinks", "attention", t,
                                      m.heads * (m.kv_lora_rank * BF16 * 2 + FP32 * 2))]
    else:
        sparse = [sparse]
    if not indexer:
        return head + pre + sparse + post
    return head + [
        # the indexer reads q_a (after its norm) and the hidden state
        gemm("indexer.wq_b", "indexer", t, ih * idim, m.q_lora_rank),
        gemm("indexer.wk", "indexer", t, idim, h),
        gemm("indexer.weights", "indexer", t, ih, h, dtype="bf16"),
        elementwise("indexer.prep", "indexer", t, ih * idim * (BF16 + FP8) + idim * BF16 * 2
                    + m.indexer_bytes_per_token_layer, 2),
        OpCost("indexer.score", "indexer", "indexer", t * context, "token_keys",
               flops=2.0 * t * ih * idim * context,
               hbm_bytes=requests * context * m.indexer_bytes_per_token_layer + t * context * FP32, kernels=2),
        OpCost("indexer.topk", "indexer", "topk", t * context, "token_keys",
               hbm_bytes=t * context * FP32 + t * k_sel * FP32, m=t),       # m: rows (query tokens)
    ] + pre + sparse + post


def layer_ops(m: ModelSpec, requests: int, q: int, context: int, dense: bool, ep: int, anchor: bool = True,
              mtp: bool = False) -> list[OpCost]:
    """One decoder layer of one micro-batch: its attention sub-layers (LongCat-Flash: 2), then its FFN
    (an MoE, plus LongCat-Flash's dense MLPs beside it; the MTP layer's FFN is dense where the model says)."""
    ops = attention_ops(m, requests, q, context, anchor) * (1 if mtp else m.attention_sublayers)
    ffn_dense = dense or (mtp and m.mtp_dense_ffn)
    ops += ffn_ops(m, requests * q, ffn_dense, ep)
    if not ffn_dense:
        ops += ffn_ops(m, requests * q, True, ep) * m.dense_mlps_per_layer
    return ops


def moe_pairs(m: ModelSpec, tokens: float) -> float:
    """Token-expert pairs one GPU computes: balanced routing spreads every GPU's tokens x top-k evenly."""
    return tokens * m.experts_per_token


def ffn_ops(m: ModelSpec, tokens: int, dense: bool, ep: int) -> list[OpCost]:
    """Dense FFN, or MoE: router, shared expert, dispatch, local routed experts (grouped), combine."""
    h = m.hidden
    if dense:
        inter = m.dense_intermediate
        return [gemm("ffn.up", "ffn", tokens, 2 * inter, h),
                elementwise("ffn.act", "ffn", tokens, 2 * inter * BF16 + inter * FP8),
                gemm("ffn.down", "ffn", tokens, h, inter)]
    inter = m.moe_intermediate
    local = math.ceil(m.routed_experts / ep)
    pairs = moe_pairs(m, tokens)
    per_expert = pairs / local
    active = local * (1.0 - math.exp(-per_expert))        # experts that receive >= 1 token
    ops = [
        gemm("moe.router", "ffn", tokens, m.routed_experts, h, dtype="bf16"),
        elementwise("moe.route", "ffn", tokens, m.routed_experts * FP32 * 2),
        gemm("moe.shared_up", "ffn", tokens, 2 * inter * m.shared_experts, h),
        elementwise("moe.shared_act", "ffn", tokens, m.shared_experts * inter * (2 * BF16 + FP8)),
        gemm("moe.shared_down", "ffn", tokens, h, inter * m.shared_experts),
        gemm("moe.experts_up", "ffn", per_expert, 2 * inter, h, groups=local, x=pairs, x_unit="pairs",
             weight_groups=active),
        elementwise("moe.experts_act", "ffn", pairs, inter * (2 * BF16 + FP8), x_unit="pairs"),
        gemm("moe.experts_down", "ffn", per_expert, h, inter, groups=local, x=pairs, x_unit="pairs",
             weight_groups=active),
        elementwise("moe.add", "ffn", tokens, h * BF16 * 3),
    ]
    if ep > 1:   # DeepEP low latency: fp8 tokens (+ scales) out to each chosen expert, bf16 back
        send = tokens * m.experts_per_token
        ops += [OpCost("moe.dispatch", "comm", "dispatch", tokens, "tokens",
                       net_bytes=send * (h * FP8 + h // SCALE_BLOCK * FP32), kernels=0),
                OpCost("moe.combine", "comm", "combine", tokens, "tokens", net_bytes=send * h * BF16, kernels=0)]
    return ops


def head_ops(m: ModelSpec, tokens: int) -> list[OpCost]:
    """Final norm, LM head (BF16 weights) and sampling / draft verification over the vocabulary."""
    return [elementwise("head.norm", "head", tokens, m.hidden * BF16 * 2),
            gemm("head.lm", "head", tokens, m.vocab, m.hidden, dtype="bf16"),
            elementwise("head.sample", "head", tokens, m.vocab * FP32 * 2, 2)]


def mtp_input_ops(m: ModelSpec, tokens: int) -> list[OpCost]:
    """The MTP module's input: embedding and hidden-state norms, then eh_proj [2h -> h]."""
    return [elementwise("mtp.norms", "attn_in", tokens, m.hidden * BF16 * 4, 2),
            gemm("mtp.eh_proj", "attn_in", tokens, m.hidden, 2 * m.hidden)]


def resolve_op(m: ModelSpec, tokens: int) -> OpCost:
    """ESS hit/miss resolve over each token's top-k ids: read ids and LRU state, write the slot table."""
    return elementwise("ess.resolve", "indexer", tokens, m.topk_tokens * FP32 * 4)


def embed_op(m: ModelSpec, tokens: int) -> OpCost:
    return elementwise("embed", "head", tokens, m.hidden * BF16 * 2)
