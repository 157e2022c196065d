"""DeepSeek-V4's FP8 KV row (SGLang's ``KVLayout.V4``, 584 bytes per token), one row per entry, in torch.

SGLang's V4 pools (mem_cache/deepseek_v4_memory_pool.py, ``DeepSeekV4SingleKVPool``: the window rows,
the C4 and the C128 entries) keep each row as

  448 FP8 e4m3 NoPE values (7 tiles of 64, each scaled by a power of two)   448 B
  64 BF16 RoPE values                                                       128 B
  7 UE8M0 scale bytes (the tile's exponent + 127) and 1 pad byte              8 B   = 584 B

quantized from the row's BF16 values (``quant_to_nope_fp8_rope_bf16_pack_triton``,
test/kernels/deepseek_v4/k_cache_reference.py: scale = 2 ** ceil(log2(max(amax, 1e-8) / 448)), values
clamped to +-448 and cast RTNE) and dequantized to BF16 (``dequantize_k_cache_paged_ref``: FP8 x scale,
scales below 2 ** -126 read as 0). In a GPU pool a page of P tokens stores the P 576-byte NoPE+RoPE
parts first and the P 8-byte scale groups after them, padded to a multiple of 576 bytes
(``page_rows`` / ``write_page_rows`` convert); ESS's host store keeps one contiguous 584-byte row per
entry, so a single entry is addressed and moved by itself.

Stateless; CPU or any device torch runs on. Checked against SGLang's own quantizer (Triton, run by its
interpreter), its torch store and its torch dequantizer in tests/integration/test_dsv4_kv_rows.py.
"""

from __future__ import annotations

import torch

NOPE, ROPE, TILE = 448, 64, 64
TILES = NOPE // TILE                      # 7 scale bytes
NOPE_ROPE_BYTES = NOPE + 2 * ROPE         # 576
SCALE_BYTES = TILES + 1                   # 7 scales + 1 pad
ROW_BYTES = NOPE_ROPE_BYTES + SCALE_BYTES  # 584
HEAD_DIM = NOPE + ROPE                    # 512
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max            # 448
EPS = 1e-8


def _check_width(x: torch.Tensor, width: int, what: str) -> None:
    if x.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"DeepSeek-V4 KV rows: {what} must be [n, {width}], got {tuple(x.shape)} (the V4 layout "
                         f"is {NOPE} NoPE + {ROPE} RoPE channels)")


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """x float [n, 512] (rounded to BF16 first, as SGLang quantizes its BF16 rows) -> uint8 [n, 584]. The pad
    byte is 0 here; SGLang's store leaves a pool's pad byte as it was (zero-initialized), and nothing reads it."""
    _check_width(x, HEAD_DIM, "the rows to quantize")
    xb = x.to(torch.bfloat16)
    tiles = xb[:, :NOPE].float().view(-1, TILES, TILE)
    amax = tiles.abs().amax(dim=-1).clamp(min=EPS)
    exp = torch.ceil(torch.log2(amax / FP8_MAX))                       # float [n, 7], integral
    nope = (tiles * torch.exp2(-exp)[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    out = torch.zeros(x.shape[0], ROW_BYTES, dtype=torch.uint8, device=x.device)
    out[:, :NOPE] = nope.view(-1, NOPE).view(torch.uint8)
    out[:, NOPE:NOPE_ROPE_BYTES] = xb[:, NOPE:].contiguous().view(torch.uint8)
    out[:, NOPE_ROPE_BYTES:NOPE_ROPE_BYTES + TILES] = (exp.to(torch.int32) + 127).to(torch.uint8)
    return out


def dequantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 584] -> float32 [n, 512], each value the BF16 SGLang's dequantizer gives."""
    _check_width(rows, ROW_BYTES, "the rows to dequantize")
    rows = rows.contiguous()
    nope = rows[:, :NOPE].contiguous().view(FP8).float().view(-1, TILES, TILE)
    scale = torch.exp2(rows[:, NOPE_ROPE_BYTES:NOPE_ROPE_BYTES + TILES].to(torch.int32).float() - 127.0)
    scale = torch.where(scale < 2.0 ** -126, torch.zeros_like(scale), scale)
    out = torch.empty(rows.shape[0], HEAD_DIM, dtype=torch.float32, device=rows.device)
    out[:, :NOPE] = (nope * scale[..., None]).view(-1, NOPE).to(torch.bfloat16).float()
    out[:, NOPE:] = rows[:, NOPE:NOPE_ROPE_BYTES].contiguous().view(torch.bfloat16).float()
    return out


def round_rows(x: torch.Tensor) -> torch.Tensor:
    """What a V4 pool gives back for x float [n, 512]: dequantize_rows(quantize_rows(x)), float32."""
    return dequantize_rows(quantize_rows(x))


def page_bytes(page_size: int) -> int:
    """Bytes of one V4 pool page of `page_size` tokens (SGLang's KVLayout.V4.page_bytes)."""
    raw = page_size * ROW_BYTES
    return -(-raw // NOPE_ROPE_BYTES) * NOPE_ROPE_BYTES


def _page_offsets(locs: torch.Tensor, page_size: int, bytes_per_page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte offsets [n, 576] of each token's NoPE+RoPE part and [n, 8] of its scale group in a flat page buffer."""
    loc = locs.long()
    base = (loc // page_size) * bytes_per_page
    slot = loc % page_size
    data = base[:, None] + slot[:, None] * NOPE_ROPE_BYTES + torch.arange(NOPE_ROPE_BYTES, device=loc.device)
    scale = (base + page_size * NOPE_ROPE_BYTES + slot * SCALE_BYTES)[:, None] + torch.arange(
        SCALE_BYTES, device=loc.device)
    return data, scale


def page_rows(pages: torch.Tensor, locs: torch.Tensor, page_size: int) -> torch.Tensor:
    """The 584-byte rows of tokens `locs` (int [n]) read from V4 pool pages uint8 [num_pages, page_bytes]."""
    flat = pages.view(torch.uint8).reshape(-1)
    data, scale = _page_offsets(locs, page_size, pages.view(torch.uint8).shape[-1])
    return torch.cat([flat[data], flat[scale]], dim=1)


def write_page_rows(pages: torch.Tensor, locs: torch.Tensor, rows: torch.Tensor, page_size: int) -> None:
    """Write 584-byte rows uint8 [n, 584] to tokens `locs` of V4 pool pages (in place)."""
    _check_width(rows, ROW_BYTES, "the rows to write")
    flat = pages.view(torch.uint8).reshape(-1)
    data, scale = _page_offsets(locs, page_size, pages.view(torch.uint8).shape[-1])
    flat[data.reshape(-1)] = rows[:, :NOPE_ROPE_BYTES].reshape(-1)
    flat[scale.reshape(-1)] = rows[:, NOPE_ROPE_BYTES:].reshape(-1)
