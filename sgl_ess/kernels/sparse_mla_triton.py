"""Triton sparse MLA decode over a slot table: the fallback for decode implementations other than
FlashMLA, on any CUDA GPU whose shared memory per block fits its tiles (sparse_mla_smem.py: the
pipelining depth is picked per device, 3 stages on an H100/H200, 2 on an A100, 1 on an L40S; a
device where even 1 stage does not fit is refused with its limit, the need and the flags).

Absorbed MLA decode is MQA over the latent: every head's query q [kv_lora_rank + rope_dim]
scores each selected latent row; the values are the row's first kv_lora_rank columns. This is
the kernel version of `sgl_ess.attention.reference.sparse_mla_decode` (same arguments, same
results up to fp32 summation order):

  q:      bf16/fp16/fp32 [T, h, dim]     absorbed queries; T = query tokens (MTP verify tokens
                                         are separate rows, each with its own slot row)
  rows:   uint8 [S, row_bytes]           slot buffer in a LatentLayout (fp8_flashmla is
                                         dequantised in the kernel: fp8 e4m3 bits decoded with
                                         integer ops, so no fp8 hardware support is needed)
  slots:  int32/int64 [T, k]             row indices into `rows`, -1 = padding
  mask:   optional bool [T, k]           keep only these entries (the DA split: two calls with
                                         complementary masks, merged by `merge_lse`)
  sink:   optional float [h]             learnable per-head sink logits (Hunyuan V4): counted in
                                         each head's softmax denominator, exp(sink_h) next to the
                                         selected rows' exp(score); out and lse then include it. Pass
                                         it only to a call over the whole key set (never to DA's two
                                         masked calls: their merge adds it once, reference.with_sink)
  returns out fp32 [T, h, kv_lora_rank], lse fp32 [T, h] (natural log; -inf and out = 0 where a
          token selected nothing)

One program per (query token, block of BLOCK_H heads) walks the k entries in blocks of BLOCK_KV
with an online softmax; dot products are fp32 (input_precision="ieee"), like the reference.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from sgl_ess.kernels.latent_layout import FP8_TILE, LatentLayout
from sgl_ess.kernels.sparse_mla_smem import padded_dims, pick_decode_stages

_KINDS = {"fp8_flashmla": 0, "bf16": 1, "fp32": 2}


@triton.jit
def _fp8_e4m3_to_f32(b):
    """uint8 bits of float8 e4m3fn -> fp32 (exact), by integer ops: sign | 4-bit exp | 3-bit man."""
    b = b.to(tl.int32)
    sign = tl.where((b & 0x80) != 0, -1.0, 1.0)
    e = (b >> 3) & 0xF
    man = (b & 0x7).to(tl.float32)
    normal = (((e + 120) << 23) | ((b & 0x7) << 20)).to(tl.float32, bitcast=True)
    sub = man * 0.001953125                           # man * 2^-9 (e == 0)
    v = tl.where(e == 0, sub, normal)
    v = tl.where((e == 15) & ((b & 0x7) == 7), float("nan"), v)
    return sign * v


@triton.jit
def _sparse_mla_decode_kernel(q_ptr, nope_ptr, rope_ptr, scale_ptr, slots_ptr, mask_ptr, sink_ptr,
                              out_ptr, lse_ptr, sm_scale, H,
                              stride_qt, stride_qh, nope_stride, rope_stride, rope_off,
                              scale_stride, scale_off,
                              K: tl.constexpr, R: tl.constexpr, ROPE: tl.constexpr, R_PAD: tl.constexpr,
                              ROPE_PAD: tl.constexpr, KIND: tl.constexpr, TILE: tl.constexpr,
                              HAS_MASK: tl.constexpr, HAS_SINK: tl.constexpr, BLOCK_H: tl.constexpr,
                              BLOCK_KV: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    cr = tl.arange(0, R_PAD)
    cp = tl.arange(0, ROPE_PAD)
    q_row = q_ptr + t * stride_qt + heads[:, None] * stride_qh
    q_nope = tl.load(q_row + cr[None, :], mask=hmask[:, None] & (cr[None, :] < R), other=0.0).to(tl.float32)
    q_rope = tl.load(q_row + R + cp[None, :], mask=hmask[:, None] & (cp[None, :] < ROPE),
                     other=0.0).to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, R_PAD], tl.float32)
    for s in range(0, K, BLOCK_KV):
        e = s + tl.arange(0, BLOCK_KV)
        slot = tl.load(slots_ptr + t * K + e, mask=e < K, other=-1).to(tl.int64)
        keep = (e < K) & (slot >= 0)
        if HAS_MASK:
            keep = keep & (tl.load(mask_ptr + t * K + e, mask=e < K, other=0) != 0)
        slot = tl.where(keep, slot, 0)
        nmask = keep[:, None] & (cr[None, :] < R)
        pmask = keep[:, None] & (cp[None, :] < ROPE)
        raw = tl.load(nope_ptr + slot[:, None] * nope_stride + cr[None, :], mask=nmask, other=0)
        if KIND == 0:
            sc = tl.load(scale_ptr + slot[:, None] * scale_stride + scale_off + cr[None, :] // TILE,
                         mask=nmask, other=0.0)
            kv = _fp8_e4m3_to_f32(raw) * sc
        else:
            kv = raw.to(tl.float32)
        kv = tl.where(nmask, kv, 0.0)
        kr = tl.load(rope_ptr + slot[:, None] * rope_stride + rope_off + cp[None, :], mask=pmask,
                     other=0.0).to(tl.float32)
        scores = tl.dot(q_nope, tl.trans(kv), input_precision="ieee")
        scores += tl.dot(q_rope, tl.trans(kr), input_precision="ieee")
        scores = tl.where(keep[None, :], scores * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # nothing kept yet: no NaN
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, kv, input_precision="ieee")
        m_i = m_new
    has = l_i > 0
    if HAS_SINK:
        # the sink joins the denominator: l_i (relative to m_i) + exp(sink - m_i); no value
        sink = tl.load(sink_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
        m_safe = tl.where(has, m_i, sink)
        l_i = tl.where(has, l_i + tl.exp(sink - m_safe), l_i)
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    o_row = out_ptr + (t * H + heads[:, None]) * R + cr[None, :]
    tl.store(o_row, out, mask=hmask[:, None] & (cr[None, :] < R))
    tl.store(lse_ptr + t * H + heads, lse, mask=hmask)


def sparse_mla_decode_triton(q: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
                             layout: LatentLayout, sm_scale: float,
                             mask: torch.Tensor | None = None, sink: torch.Tensor | None = None, block_h: int = 16,
                             block_kv: int = 16, num_warps: int = 8, num_stages: int | None = None):
    """See the module docstring. All tensors on one device (CUDA, or CPU under
    TRITON_INTERPRET=1). No host sync; allocates only the outputs (CUDA-graph capturable).
    `num_stages` None: the deepest pipelining that fits the device's shared memory
    (sparse_mla_smem.pick_decode_stages; ValueError where none fits)."""
    if q.dim() != 3 or q.shape[2] != layout.dim:
        raise ValueError(f"sparse_mla_decode_triton: q must be [T, heads, {layout.dim}] for layout "
                         f"{layout}, got {list(q.shape)}")
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != layout.row_bytes:
        raise ValueError(f"sparse_mla_decode_triton: rows must be uint8 [S, {layout.row_bytes}], got "
                         f"{rows.dtype} {list(rows.shape)}")
    if slots.dim() != 2 or slots.shape[0] != q.shape[0]:
        raise ValueError(f"sparse_mla_decode_triton: slots must be [T={q.shape[0]}, k], got "
                         f"{list(slots.shape)}")
    t_tokens, h = q.shape[0], q.shape[1]
    k = slots.shape[1]
    r, rope = layout.kv_lora_rank, layout.rope_dim
    dev = q.device
    out = torch.empty((t_tokens, h, r), dtype=torch.float32, device=dev)
    lse = torch.empty((t_tokens, h), dtype=torch.float32, device=dev)
    if t_tokens == 0 or h == 0:
        return out, lse
    q = q if q.stride(2) == 1 else q.contiguous()
    rows = rows.contiguous()
    slots = slots.contiguous()
    if layout.kind == "fp8_flashmla":
        tiles = r // FP8_TILE
        if layout.row_bytes % 4 or (r + 4 * tiles) % 2:
            raise ValueError(f"sparse_mla_decode_triton: fp8 rows of {layout.row_bytes} B are not "
                             "4-byte aligned (rope_dim must be even)")
        nope, nope_stride = rows, layout.row_bytes
        scales, scale_stride, scale_off = rows.view(torch.float32), layout.row_bytes // 4, r // 4
        rope_v, rope_stride, rope_off = rows.view(torch.bfloat16), layout.row_bytes // 2, (r + 4 * tiles) // 2
    else:
        typed = rows.view(torch.bfloat16 if layout.kind == "bf16" else torch.float32)
        nope, nope_stride = typed, layout.dim
        scales, scale_stride, scale_off = typed, 0, 0
        rope_v, rope_stride, rope_off = typed, layout.dim, r
    mask_arg = mask.contiguous().view(torch.int8) if mask is not None else slots
    if mask is not None and mask.shape != slots.shape:
        raise ValueError(f"sparse_mla_decode_triton: mask must match slots {list(slots.shape)}, got "
                         f"{list(mask.shape)}")
    if sink is not None and (sink.dim() != 1 or sink.shape[0] != h):
        raise ValueError(f"sparse_mla_decode_triton: sink must be [heads={h}], got {list(sink.shape)}")
    sink_arg = sink.to(device=dev, dtype=torch.float32).contiguous() if sink is not None else lse
    if num_stages is None:
        num_stages = _stages_for(dev, layout, block_h, block_kv)
    r_pad, rope_pad = padded_dims(r, rope)
    grid = (t_tokens, triton.cdiv(h, block_h))
    _sparse_mla_decode_kernel[grid](
        q, nope, rope_v, scales, slots, mask_arg, sink_arg, out, lse, float(sm_scale), h,
        q.stride(0), q.stride(1), nope_stride, rope_stride, rope_off, scale_stride, scale_off,
        K=k, R=r, ROPE=rope, R_PAD=r_pad, ROPE_PAD=rope_pad, KIND=_KINDS[layout.kind], TILE=FP8_TILE,
        HAS_MASK=mask is not None, HAS_SINK=sink is not None, BLOCK_H=block_h, BLOCK_KV=block_kv,
        num_warps=num_warps, num_stages=num_stages)
    return out, lse


@functools.lru_cache(maxsize=None)
def _stages_for_cuda(index: int, layout: LatentLayout, block_h: int, block_kv: int) -> int:
    props = torch.cuda.get_device_properties(index)     # cached by torch: no device work
    return pick_decode_stages(layout.kind, layout.kv_lora_rank, layout.rope_dim, block_h, block_kv,
                              props.shared_memory_per_block_optin, props.name)


def _stages_for(dev: torch.device, layout: LatentLayout, block_h: int, block_kv: int) -> int:
    """The pipelining depth for `dev`: picked from its opt-in shared memory on CUDA; the
    interpreter (CPU) ignores it."""
    if dev.type != "cuda":
        return 1
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return _stages_for_cuda(index, layout, block_h, block_kv)
