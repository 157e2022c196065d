"""FlashTrans: move many small latent rows between the host pool and device slots in one call.

`copy_rows(src, src_idx, dst, dst_idx)` copies `src[src_idx[i]] -> dst[dst_idx[i]]` for every
i where both indices are >= 0 (entries of -1 are skipped, so a caller can pass a whole
`[batch*k]` step without first compacting it: no host sync).

  src:     uint8 [S, row_bytes]   host rows (pinned on CUDA) or device rows
  src_idx: int64 [M]              row indices into src, -1 = skip
  dst:     uint8 [D, row_bytes]   device rows or host rows
  dst_idx: int64 [M]              row indices into dst, -1 = skip

Backends:
  "torch"  - index_select/index_copy on whatever device the tensors are on (the CPU path, and
             the reference the Triton kernel is tested against);
  "triton" - one Triton launch for all rows; each program copies one row as 32-bit words.
             On CUDA a pinned host tensor is passed through its UVA device view, so GPU threads
             read/write host memory directly (zero-copy). On CPU it runs under TRITON_INTERPRET=1
             for tests.
"""
from __future__ import annotations

import os

import torch


def copy_rows(src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor,
              backend: str = "auto") -> None:
    _check(src, src_idx, dst, dst_idx)
    if backend == "auto":
        backend = "triton" if (dst.is_cuda or src.is_cuda) and triton_available() else "torch"
    if backend == "torch":
        copy_rows_torch(src, src_idx, dst, dst_idx)
    elif backend == "triton":
        from sgl_ess.kernels.flashtrans_triton import copy_rows_triton
        copy_rows_triton(src, src_idx, dst, dst_idx)
    else:
        raise ValueError(f"FlashTrans backend {backend!r}: expected 'auto', 'torch' or 'triton'")


def copy_rows_torch(src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor,
                    dst_idx: torch.Tensor) -> None:
    """Reference path: gather the valid rows on src's device, scatter them on dst's device.

    On the CPU the gathered rows pass through a temporary in the ordinary torch heap, not in a
    protected segment (not excluded from core dumps, not mlocked): making it protected would need
    a scratch segment per caller and thread; it is freed when the call returns. See
    sgl_ess/memory/protection.py and launch/OPERATIONS.md "Protected host memory"."""
    keep = (src_idx >= 0) & (dst_idx >= 0)
    s = src_idx[keep].to(src.device)
    d = dst_idx[keep].to(dst.device)
    if s.numel() == 0:
        return
    dst.index_copy_(0, d, src.index_select(0, s).to(dst.device, non_blocking=True))


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def _check(src, src_idx, dst, dst_idx) -> None:
    if src.dtype != torch.uint8 or dst.dtype != torch.uint8 or src.dim() != 2 or dst.dim() != 2:
        raise ValueError(f"copy_rows: src and dst must be uint8 [rows, row_bytes], got "
                         f"{src.dtype}{list(src.shape)} and {dst.dtype}{list(dst.shape)}")
    if src.shape[1] != dst.shape[1]:
        raise ValueError(f"copy_rows: row_bytes differ: src {src.shape[1]}, dst {dst.shape[1]}")
    if src_idx.shape != dst_idx.shape or src_idx.dim() != 1:
        raise ValueError(f"copy_rows: src_idx and dst_idx must be 1-D of one length, got "
                         f"{list(src_idx.shape)} and {list(dst_idx.shape)}")
    if src_idx.dtype not in (torch.int32, torch.int64) or dst_idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"copy_rows: indices must be int32/int64, got {src_idx.dtype}, {dst_idx.dtype}")
