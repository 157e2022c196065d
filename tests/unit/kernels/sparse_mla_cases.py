"""Inputs for the sparse MLA decode checks.

`exact_case` builds short dyadic values (q: multiples of 1/8 in [-1, 1]; latents: multiples of
1/16 in [-1, 1], or fp8 e4m3 values 2^-2..2^2 with 3 mantissa bits times a tile scale of 1/4;
sm_scale 1/8): every product and partial sum of a score fits in 24 bits, so every summation
order gives the exact score, and the kernel/reference difference comes only from the softmax
(see attention_bounds.py). `generic_case` is what the engine sees: LatentLayout.encode of
Gaussian latents, Gaussian queries, sm_scale 1/sqrt(D)."""
from __future__ import annotations

import torch

from sgl_ess.kernels.latent_layout import FP8_TILE, LatentLayout

R, ROPE = 128, 64


def _fp8_rows(g, s, lay):
    sign = torch.randint(0, 2, (s, lay.kv_lora_rank), generator=g) << 7
    expo = torch.randint(5, 10, (s, lay.kv_lora_rank), generator=g) << 3   # 2^-2 .. 2^2
    man = torch.randint(0, 8, (s, lay.kv_lora_rank), generator=g)
    nope = (sign | expo | man).to(torch.uint8)
    scale = torch.full((s, lay.kv_lora_rank // FP8_TILE), 0.25).view(torch.uint8)
    rope = (torch.randint(-16, 17, (s, lay.rope_dim), generator=g) / 16).to(torch.bfloat16)
    return torch.cat([nope, scale, rope.view(torch.uint8)], dim=1)


def _slots(g, t, k, s):
    slots = torch.randint(0, s, (t, k), generator=g)
    slots[torch.rand((t, k), generator=g) < 0.2] = -1      # padding anywhere
    if t > 1:
        slots[1, k // 2:] = -1                               # a short row
    return slots.to(torch.int32)


def exact_case(kind, seed=0, t=3, h=5, k=40, s=50, q_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lay = LatentLayout(kind, R, ROPE)
    if kind == "fp8_flashmla":
        rows = _fp8_rows(g, s, lay)
    else:
        rows = lay.encode(torch.randint(-16, 17, (s, lay.dim), generator=g) / 16)
    q = (torch.randint(-8, 9, (t, h, lay.dim), generator=g) / 8).to(q_dtype)
    return lay, q, rows, _slots(g, t, k, s), 0.125


def generic_case(kind, seed=1, t=3, h=5, k=40, s=50, q_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lay = LatentLayout(kind, R, ROPE)
    rows = lay.encode(torch.randn(s, lay.dim, generator=g))
    q = torch.randn(t, h, lay.dim, generator=g).to(q_dtype)
    return lay, q, rows, _slots(g, t, k, s), lay.dim ** -0.5
