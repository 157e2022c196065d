"""DeepSeek-V4 on CPU: torch stand-ins for the hyper-connection kernels ``hc_pre`` calls
(kernels/ops/layernorm/mhc.py; with SGLANG_OPT_USE_TILELANG_MHC_PRE / _POST, SGLANG_OPT_DEEPGEMM_HC_PRENORM
and SGLANG_OPT_USE_FLASHINFER_MHC off, which dsv4.register sets without CUDA, the mixes and the post are
SGLang's own torch code; these two remain):

  hc_split_sinkhorn(mixes [b, s, (2+hc)*hc], hc_scale [3], hc_base)  -> pre, post, comb: SGLang's math
      (its torch ``_mhc_pre_torch``, mhc.py:1900-1938, and its Triton port): pre = sigmoid(m*s0 + b) + eps,
      post = 2 * sigmoid(m*s1 + b), comb = row softmax + eps, column-normalised, then (iters - 1) x
      row- and column-normalised, each with + eps in the denominator
  mhc_combine(x_flat [m, hc*H], pre [m, hc], hc, dtype)  -> y[m, h] = sum_k pre[m, k] * x_flat[m, k*H + h]

For CPU tensors only, at their module (get_mhc_ops and hc_pre import them from it when called).
"""

from __future__ import annotations

import torch


def split_sinkhorn(mixes, hc_scale, hc_base, hc_mult: int = 4, sinkhorn_iters: int = 20, eps: float = 1e-6):
    b, s, _ = mixes.shape
    n = hc_mult
    m = mixes.reshape(b * s, (2 + n) * n).float()
    scale, base = hc_scale.float(), hc_base.float()
    pre = torch.sigmoid(m[:, :n] * scale[0] + base[:n]) + eps
    post = 2.0 * torch.sigmoid(m[:, n:2 * n] * scale[1] + base[n:2 * n])
    comb = (m[:, 2 * n:] * scale[2] + base[2 * n:]).view(-1, n, n)
    comb = comb.softmax(-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return (pre.view(b, s, n).to(mixes.dtype), post.view(b, s, n).to(mixes.dtype),
            comb.view(b, s, n, n).to(mixes.dtype))


def combine(x_flat, pre, hc: int, out_dtype):
    m = x_flat.shape[0]
    y = (pre.float()[:, :, None] * x_flat.float().view(m, hc, -1)).sum(1)
    return y.to(out_dtype)


def around_hc_split_sinkhorn(original_fn, mixes, *args, **kwargs):
    if mixes.device.type != "cpu":
        return original_fn(mixes, *args, **kwargs)
    return split_sinkhorn(mixes, *args, **kwargs)


def around_mhc_combine(original_fn, x_flat, pre, hc, out_dtype):
    if x_flat.device.type != "cpu":
        return original_fn(x_flat, pre, hc, out_dtype)
    return combine(x_flat, pre, hc, out_dtype)


def around_fused_hc_head(original_fn, x, hc_fn, hc_scale, hc_base, norm_eps, hc_eps):
    """The model's last hyper-connection (DeepseekV4Model.hc_head): for CPU tensors SGLang's own torch
    form, ``hc_head_torch`` (models/deepseek_v4.py:664), which the model itself takes for an empty batch."""
    if x.device.type != "cpu":
        return original_fn(x, hc_fn, hc_scale, hc_base, norm_eps=norm_eps, hc_eps=hc_eps)
    from sglang.srt.models.deepseek_v4 import hc_head_torch

    return hc_head_torch(x, hc_fn, hc_scale, hc_base, norm_eps=norm_eps, hc_eps=hc_eps)
