"""DeepSeek-V4 on CPU: torch stand-ins for the model's own JIT CUDA norm / RoPE calls
(kernels/ops/attention/dsv4/norm_rope.py), installed at their call sites in models/deepseek_v4.py and
taken for CPU tensors only:

  fused_q_norm_rope(q_in, q_out, eps, freqs_cis, positions)   q_out = rope(rms(q_in) if eps else q_in),
      the weightless RMS norm over each head's row, RoPE on its last rope_dim channels (_compute_q_b)
  fused_norm_rope_inplace(kv, weight, eps, freqs_cis, positions)   kv = rope(rms(kv) * weight) in place
      (the window row, _compute_kv_bf16)
  fused_rope_inplace(q, k, freqs_cis, positions, inverse)   RoPE (inverse: conjugate) over all of q's and
      k's channels in place (the output's rope channels are rotated back before wo_a)

Computed in float32 from the rows' values and written back in the rows' dtype, as the kernels do
(fp32 registers, one rounding on the store). RoPE is V4's interleaved form (sgl_ess/attention/dsv4_rope.py).
"""

from __future__ import annotations

import torch

from sgl_ess.attention.dsv4_rope import apply_rope_tail, rms_norm


def _freqs(freqs_cis: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    f = freqs_cis[positions.long()]                          # [T, rope_dim // 2]
    return f.view(f.shape[0], *([1] * (rows.dim() - 2)), f.shape[-1])


def q_norm_rope(q_input, q_output, eps, freqs_cis, positions) -> None:
    rope_dim = 2 * freqs_cis.shape[-1]
    q = rms_norm(q_input, None, eps) if eps is not None else q_input.float()
    q_output.copy_(apply_rope_tail(q, _freqs(freqs_cis, positions, q_input), rope_dim))


def norm_rope_inplace(kv, weight, eps, freqs_cis, positions) -> None:
    rope_dim = 2 * freqs_cis.shape[-1]
    kv.copy_(apply_rope_tail(rms_norm(kv, weight, eps), _freqs(freqs_cis, positions, kv), rope_dim))


def rope_inplace(q, k, freqs_cis, positions, inverse: bool = False) -> None:
    for x in (q, k):
        if x is not None:
            x.copy_(apply_rope_tail(x, _freqs(freqs_cis, positions, x), x.shape[-1], inverse=inverse))


def around_fused_q_norm_rope(original_fn, q_input, q_output, eps, freqs_cis, positions):
    if q_input.device.type != "cpu":
        return original_fn(q_input, q_output, eps, freqs_cis, positions)
    if q_output.dtype == torch.float8_e4m3fn:
        raise NotImplementedError("DeepSeek-V4 on CPU: an FP8 query (V4.1's uniform-FP8 pool) is not implemented")
    return q_norm_rope(q_input, q_output, eps, freqs_cis, positions)


def around_fused_norm_rope_inplace(original_fn, kv, weight, eps, freqs_cis, positions):
    if kv.device.type != "cpu":
        return original_fn(kv, weight, eps, freqs_cis, positions)
    return norm_rope_inplace(kv, weight, eps, freqs_cis, positions)


def around_fused_rope_inplace(original_fn, q, k, freqs_cis, positions, inverse=False):
    if q.device.type != "cpu":
        return original_fn(q, k, freqs_cis, positions, inverse)
    return rope_inplace(q, k, freqs_cis, positions, inverse)
