"""LatentLayout: how one token's MLA latent (kv_lora_rank nope values + rope_dim rope values)
is packed into an opaque byte row, and back.

kinds:
  "fp8_flashmla": FlashMLA's sparse FP8 layout. kv_lora_rank fp8 e4m3 bytes, then one fp32
                  scale per 128 values, then rope_dim bf16 values. DeepSeek-V3.2: 512 + 16 + 128
                  = 656 B.
  "bf16":         (kv_lora_rank + rope_dim) bf16 values (1152 B for V3.2).
  "fp32":         (kv_lora_rank + rope_dim) fp32 values (tests and tiny models).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_TILE = 128
FP8_MAX = 448.0  # largest finite float8 e4m3fn value


@dataclass(frozen=True)
class LatentLayout:
    kind: str
    kv_lora_rank: int
    rope_dim: int

    def __post_init__(self) -> None:
        if self.kind not in ("fp8_flashmla", "bf16", "fp32"):
            raise ValueError(f"latent layout {self.kind!r}: expected fp8_flashmla, bf16 or fp32")
        if self.kind == "fp8_flashmla" and self.kv_lora_rank % FP8_TILE:
            raise ValueError(f"fp8_flashmla needs kv_lora_rank divisible by {FP8_TILE}, got "
                             f"{self.kv_lora_rank}; use the bf16 layout")

    @property
    def dim(self) -> int:
        return self.kv_lora_rank + self.rope_dim

    @property
    def row_bytes(self) -> int:
        if self.kind == "fp8_flashmla":
            return self.kv_lora_rank + 4 * (self.kv_lora_rank // FP8_TILE) + 2 * self.rope_dim
        return self.dim * (2 if self.kind == "bf16" else 4)

    def encode(self, latent: torch.Tensor) -> torch.Tensor:
        """latent float [n, dim] -> uint8 [n, row_bytes] (same device)."""
        if latent.dim() != 2 or latent.shape[1] != self.dim:
            raise ValueError(f"encode: expected [n, {self.dim}], got {list(latent.shape)}")
        if self.kind == "fp32":
            return latent.float().contiguous().view(torch.uint8)
        if self.kind == "bf16":
            return latent.to(torch.bfloat16).contiguous().view(torch.uint8)
        n = latent.shape[0]
        # SGLang's writer (dsa_quant_k_cache): bf16 input, scale = amax / 448 in fp32, values
        # multiplied by the scale's reciprocal, clamped, cast round-to-nearest-even. An all-zero
        # tile has amax 0: SGLang then writes 0 * inf = NaN codes and scale 0 (NaN on read);
        # we write zero codes and scale 1 (reads back as zeros) - the one deliberate difference.
        nope = latent[:, :self.kv_lora_rank].to(torch.bfloat16).float().reshape(n, -1, FP8_TILE)
        amax = nope.abs().amax(dim=2)
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        q = (nope * (1.0 / scale).unsqueeze(2)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(n, -1)
        rope = latent[:, self.kv_lora_rank:].to(torch.bfloat16).contiguous()
        return torch.cat([q.view(torch.uint8), scale.contiguous().view(torch.uint8),
                          rope.view(torch.uint8)], dim=1)

    def decode(self, rows: torch.Tensor) -> torch.Tensor:
        """uint8 [..., row_bytes] -> float32 [..., dim]."""
        if rows.dtype != torch.uint8 or rows.shape[-1] != self.row_bytes:
            raise ValueError(f"decode: expected uint8 [..., {self.row_bytes}], got "
                             f"{rows.dtype} {list(rows.shape)}")
        lead = rows.shape[:-1]
        flat = rows.reshape(-1, self.row_bytes).contiguous()
        if self.kind == "fp32":
            out = flat.view(torch.float32)
        elif self.kind == "bf16":
            out = flat.view(torch.bfloat16).float()
        else:
            r, t = self.kv_lora_rank, self.kv_lora_rank // FP8_TILE
            q = flat[:, :r].contiguous().view(torch.float8_e4m3fn).float().reshape(-1, t, FP8_TILE)
            scale = flat[:, r:r + 4 * t].contiguous().view(torch.float32)
            rope = flat[:, r + 4 * t:].contiguous().view(torch.bfloat16).float()
            out = torch.cat([(q * scale.unsqueeze(2)).reshape(-1, r), rope], dim=1)
        return out.reshape(*lead, self.dim)
