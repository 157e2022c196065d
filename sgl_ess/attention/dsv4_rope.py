"""DeepSeek-V4's RMS norm and interleaved RoPE on the tail channels, in plain torch.

V4 rotates the last ``rope_dim`` channels of a row as complex pairs (x[2i], x[2i+1]) multiplied by
``freqs_cis[position, i]`` (SGLang's ``precompute_freqs_cis``, kernels/ops/attention/dsv4/rope.py:28;
the Triton kernel's real/imag offsets 2i and 2i+1, rope.py:120-121; ``is_neox_style=False``,
deepseek_v4.py:1401). The attention output's rope channels are rotated back (``inverse=True``,
deepseek_v4.py:2954-2960). A compressed entry (C4 / C128 / the indexer's C4 keys) is RMS-normed with
the compressor's weight and rotated at its block's first position (fused_norm_rope_v2.cuh:100-105:
``position = seq_len - compress_ratio``). Stateless; tensors float (CPU).
"""
from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x float [..., d]; weight [d] or None (V4's weightless per-head query norm). Returns float32."""
    x = x.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.float()


def apply_rope_tail(x: torch.Tensor, freqs_cis: torch.Tensor, rope_dim: int,
                    inverse: bool = False) -> torch.Tensor:
    """Rotate the last rope_dim channels of x float [..., d] by freqs_cis complex [..., rope_dim // 2]
    (broadcast over x's leading dims, e.g. [T, 1, rope_dim // 2] for [T, heads, d]). Returns a new
    float32 tensor; the first d - rope_dim channels are unchanged."""
    x = x.float()
    if x.shape[-1] < rope_dim or rope_dim % 2:
        raise ValueError(f"rope_dim {rope_dim} must be even and at most the row width {x.shape[-1]}")
    f = freqs_cis.conj() if inverse else freqs_cis
    tail = torch.view_as_complex(x[..., -rope_dim:].reshape(*x.shape[:-1], rope_dim // 2, 2).contiguous())
    rotated = torch.view_as_real(tail * f).reshape(*x.shape[:-1], rope_dim)
    return torch.cat([x[..., :-rope_dim], rotated], dim=-1)


def finish_entry(pooled: torch.Tensor, block_index: torch.Tensor | int, ratio: int, norm_weight: torch.Tensor,
                 eps: float, freqs_cis: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """A pooled compressed entry float [..., d] -> the stored entry: RMS norm, then RoPE at the block's
    first position block_index * ratio. freqs_cis complex [max_positions, rope_dim // 2] (the layer's
    table). Returns float32 [..., d]."""
    pos = torch.as_tensor(block_index, dtype=torch.long) * ratio
    return apply_rope_tail(rms_norm(pooled, norm_weight, eps), freqs_cis[pos], rope_dim)
