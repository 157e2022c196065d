"""Shared memory of the Triton sparse-MLA decode (sparse_mla_triton.py) and the pipelining depth
that fits a device. Plain arithmetic from the kernel's tile shapes: no torch, no Triton, no device.

Why: the kernel's default launch (Triton's CUDA default, 3 software-pipeline stages) over
DeepSeek-V3.2's FP8 rows (kv_lora_rank 512, rope 64, BLOCK_H 16, BLOCK_KV 16) compiles to
172,288 B (168.25 KiB) of shared memory per block: more than an A100's opt-in limit (164 KiB) and
an L40S's (99 KiB), so the launch fails there. The depth is the kernel's only free tile knob
(BLOCK_H and BLOCK_KV are already tl.dot's minimum, 16), and it changes no arithmetic: the
pipeliner only multi-buffers the loads.

Where the bytes go, per program (the kernel's own tiles; R_PAD / ROPE_PAD its padded widths):
  * tl.dot staging, not pipelined: q_nope [BLOCK_H, R_PAD], q_rope [BLOCK_H, ROPE_PAD],
    kv [BLOCK_KV, R_PAD], kr [BLOCK_KV, ROPE_PAD], all fp32 (input_precision "ieee");
  * with 2+ stages, one buffer per stage of each loop load the pipeliner copies with cp.async
    (4-byte elements): 16 B per entry of the [BLOCK_KV] slot block (int64 slots are 8 B; the
    compiled bf16 kernels show 16 B per entry per stage) and the [BLOCK_KV, R_PAD] fp32 gather: fp8 rows' per-element scales, fp32 rows'
    values (bf16 and fp8 bytes are not copied asynchronously);
  * layout-conversion and reduction scratch: the scores tile [BLOCK_H, BLOCK_KV] fp32 + 256 B.
`tests/unit/kernels/test_sparse_mla_smem.py` compiles the kernel for sm_80 and sm_90 targets on
the CPU (Triton's own compiler and ptxas, no GPU) and checks this figure is an upper bound of
the compiled one for every depth and several tiles, and that it picks the same depth as the
compiled figures for A100, L40S and H200.
"""
from __future__ import annotations

DEFAULT_STAGES = 3          # Triton's CUDA default num_stages: what the kernel compiled with before
_FP32 = 4
_SLOT_ENTRY_BYTES = 16      # per selected entry per stage (slot index and its mask)
_SCRATCH_BYTES = 256


def _pow2_at_least_16(n: int) -> int:
    p = 16
    while p < n:
        p *= 2
    return p


def padded_dims(kv_lora_rank: int, rope_dim: int) -> tuple[int, int]:
    """(R_PAD, ROPE_PAD): the kernel's padded widths of the latent's two parts."""
    return _pow2_at_least_16(kv_lora_rank), _pow2_at_least_16(rope_dim)


def decode_shared_memory_bytes(kind: str, kv_lora_rank: int, rope_dim: int, block_h: int,
                               block_kv: int, num_stages: int) -> int:
    """Upper bound of the decode kernel's shared memory per block, in bytes (module docstring)."""
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    r_pad, rope_pad = padded_dims(kv_lora_rank, rope_dim)
    dot_staging = (block_h + block_kv) * (r_pad + rope_pad) * _FP32
    per_stage = block_kv * _SLOT_ENTRY_BYTES
    if kind in ("fp8_flashmla", "fp32"):
        per_stage += block_kv * r_pad * _FP32
    buffers = num_stages * per_stage if num_stages > 1 else 0
    scratch = block_h * block_kv * _FP32 + _SCRATCH_BYTES
    return dot_staging + buffers + scratch


def pick_decode_stages(kind: str, kv_lora_rank: int, rope_dim: int, block_h: int, block_kv: int,
                       smem_optin_bytes: int, device_name: str = "this GPU") -> int:
    """The deepest pipelining (DEFAULT_STAGES down to 1) whose shared memory fits
    `smem_optin_bytes` (the device's opt-in limit per block: torch's
    get_device_properties(...).shared_memory_per_block_optin). Raises ValueError when even one
    stage does not fit, naming the limit, the need and the flags that avoid this kernel."""
    for stages in range(DEFAULT_STAGES, 0, -1):
        if decode_shared_memory_bytes(kind, kv_lora_rank, rope_dim, block_h, block_kv, stages) <= smem_optin_bytes:
            return stages
    need = decode_shared_memory_bytes(kind, kv_lora_rank, rope_dim, block_h, block_kv, 1)
    raise ValueError(
        f"the Triton sparse-MLA decode needs {need} B of shared memory per block at its smallest "
        f"tiles ({kind} rows, kv_lora_rank {kv_lora_rank}, rope {rope_dim}, BLOCK_H {block_h}, "
        f"BLOCK_KV {block_kv}, 1 pipeline stage), but {device_name} allows {smem_optin_bytes} B "
        "(shared_memory_per_block_optin). Pick SGLang's FlashMLA decode instead "
        "(--dsa-decode-backend flashmla_kv for FP8 rows or flashmla_sparse, sm_90 and newer) and "
        "leave --enable-mixed-chunk off (a mixed batch's riding decode rows take this kernel)")
