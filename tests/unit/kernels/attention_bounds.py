"""fp32 error bounds for sparse MLA decode: how far two correct fp32 implementations (the torch
reference and the Triton kernel) may differ, derived from the arithmetic, never from observed
error. Used as the test tolerances for the Triton sparse decode kernel.

Model (u = 2^-24, gamma(n) = n u / (1 - n u), per query token t and head h):
- The latent values are bit-identical in both implementations: bf16 -> fp32 is exact; fp8 e4m3
  -> fp32 is exact and the product with the fp32 tile scale is one IEEE round-to-nearest.
- Score s_j = sm_scale * (q . kv_j): any summation order of the D products gives
  |s^_j - s_j| <= eps = sm_scale * gamma(D + 1) * max_j sum_i |q_i kv_ji| (the +1: the scaling).
  If every product and partial sum is a short dyadic number (the `exact` inputs of the tests),
  every order gives the exact score and eps = 0.
- Softmax weights w_j = exp(s^_j - m) (m: a running or final max): each exp is accurate to
  C_EXP u relative; its argument, of magnitude <= the row's score range `spread`, is rounded
  (relative error of the result <= 2 * spread * u, the 2 covering log2(e) scaling); the kernel
  rescales partial sums once per KV block (B blocks), each rescale another exp and a product.
  So each weight's relative error is <= eta_r = ((B + 2) * (C_EXP + 2 * spread + 2) + k + C_LOG) u,
  the k covering the normaliser's summation (gamma(k)).
- Perturbing every weight by relative eta moves the convex combination out = sum w_j v_j /
  sum w_j by <= 2 eta V / (1 - eta), V = max |v|; the score error adds eta_s = exp(2 eps) - 1 to
  eta. The value accumulation adds gamma(k + 2B + 1) V. lse moves by <= 2 eps + eta + (C_LOG +
  |lse|) u.
Each implementation is within that of the exact result, so two may differ by twice as much.
C_EXP = C_LOG = 8: PTX's ex2/lg2.approx.f32 are within 2^-22 = 4u relative; doubled for the
scaling by log2(e) / ln 2 around them (numpy's and torch's CPU exp/log are within 1 ulp).
"""
from __future__ import annotations

import math

import torch

U = 2.0 ** -24
C_EXP = 8.0
C_LOG = 8.0


def _gamma(n: float) -> float:
    return n * U / (1 - n * U)


def decode_bounds(q: torch.Tensor, kv: torch.Tensor, keep: torch.Tensor, sm_scale: float, r: int,
                  lse: torch.Tensor, block_kv: int, exact_scores: bool):
    """q float [T, h, D], kv float [T, k, D] (decoded rows per query token), keep bool [T, k],
    lse float [T, h] (the reference's). Returns (tol_out [T, h, 1], tol_lse [T, h]) float64."""
    q64, kv64 = q.double(), kv.double()
    k, d = kv.shape[1], kv.shape[2]
    n_blocks = math.ceil(k / block_kv)
    absdot = torch.einsum("thd,tkd->thk", q64.abs(), kv64.abs()) * sm_scale   # [T, h, k]
    absdot = absdot.masked_fill(~keep.unsqueeze(1), 0.0)
    eps = torch.zeros_like(absdot[..., 0]) if exact_scores else _gamma(d + 1) * absdot.amax(dim=2)
    scores = torch.einsum("thd,tkd->thk", q64, kv64) * sm_scale
    hi = scores.masked_fill(~keep.unsqueeze(1), -math.inf).amax(dim=2)
    lo = scores.masked_fill(~keep.unsqueeze(1), math.inf).amin(dim=2)
    spread = torch.where(keep.any(dim=1, keepdim=True), hi - lo + 2 * eps, torch.zeros_like(hi))
    eta_r = ((n_blocks + 2) * (C_EXP + 2 * spread + 2) + k + C_LOG) * U
    eta = (1 + eta_r) * torch.exp(2 * eps) - 1
    v_max = kv64[..., :r].abs().masked_fill(~keep.unsqueeze(2), 0.0).amax(dim=(1, 2)).unsqueeze(1)
    one = 2 * eta * v_max / (1 - eta) + _gamma(k + 2 * n_blocks + 1) * v_max
    lse_fin = torch.where(torch.isfinite(lse), lse.double().abs(), torch.zeros_like(lse, dtype=torch.float64))
    one_lse = 2 * eps + eta + (C_LOG + lse_fin) * U
    return (2 * one).unsqueeze(2), 2 * one_lse


def merge_bounds(tol_out0, tol_lse0, tol_out1, tol_lse1, v_max, lse):
    """Bounds after `merge_lse` of two halves whose outputs / lse carry the given bounds (float64
    [T, h, 1] / [T, h]; v_max [T, 1]; lse [T, h] the merged reference): the merge weights
    exp(lse_i - lse) move by relative <= exp(2 max tol_lse) - 1, moving the convex combination
    by <= 2 * that * 2V; the merge's own exp/log/products, done once on each side, add
    2 (2 C_EXP + C_LOG + 4) u (2V, resp. 1 + |lse|)."""
    t_l = torch.maximum(tol_lse0, tol_lse1)
    dw = torch.exp(2 * t_l) - 1
    own = 2 * (2 * C_EXP + C_LOG + 4) * U
    lse_fin = torch.where(torch.isfinite(lse), lse.double().abs(), torch.zeros_like(lse, dtype=torch.float64))
    out = torch.maximum(tol_out0, tol_out1) + ((2 * dw + own) * 2 * v_max).unsqueeze(2)
    return out, t_l + own * (1 + lse_fin)


def plan_reference(lay, q, slot_rows, read_slots, staged, sm_scale, dual: bool, block_kv: int = 16):
    """For one planned (sub-)batch: the unsplit torch reference (out, lse) over its slot table and
    the fp32 error bound of an implementation that attends to it - in one pass, or (dual) as
    Attn0 over the resident entries and Attn1 over the staged ones merged by log-sum-exp.
    q [T, h, D], slot_rows uint8 [S, B], read_slots int [T, k], staged bool [T, k]."""
    from sgl_ess.attention.reference import sparse_mla_decode

    q, rows, sl, staged = q.cpu(), slot_rows.cpu(), read_slots.cpu(), staged.cpu()
    kv = lay.decode(rows[sl.clamp(min=0).long()])
    want, lse = sparse_mla_decode(q, rows, sl, lay, sm_scale)
    if not dual:
        tol, _ = decode_bounds(q.float(), kv, sl >= 0, sm_scale, lay.kv_lora_rank, lse, block_kv, False)
        return want, lse, tol
    parts = []
    for keep in ((sl >= 0) & ~staged, staged):
        _, lse_p = sparse_mla_decode(q, rows, sl, lay, sm_scale, mask=keep)
        parts += list(decode_bounds(q.float(), kv, keep, sm_scale, lay.kv_lora_rank, lse_p, block_kv, False))
    v_max = kv[..., :lay.kv_lora_rank].abs().amax(dim=(1, 2)).double().unsqueeze(1)
    tol, _ = merge_bounds(*parts, v_max, lse)
    return want, lse, tol
