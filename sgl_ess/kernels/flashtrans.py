"""FlashTrans: move many small latent rows between the host pool and device slots in one call.

`copy_rows(src, src_idx, dst, dst_idx)` copies `src[src_idx[i]] -> dst[dst_idx[i]]` for every
i where both indices are >= 0 (entries of -1 are skipped, so a caller can pass a whole
`[batch*k]` step without first compacting it: no host sync). `move_rows(rows, src_idx, dst_idx)`
does the same within one tensor and then zeroes every source row it read (the store's commit:
staged ring rows into hot slots, the ring rows wiped), in one launch. Both add the number of rows
they moved to `count` (int64 0-d on the rows' device) when it is given: the engine's per-tier
accounting without a launch of its own.

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
              backend: str = "auto", count: torch.Tensor | None = None) -> None:
    _check(src, src_idx, dst, dst_idx)
    backend = _backend(backend, src, dst)
    if backend == "torch":
        if count is not None:
            count += ((src_idx >= 0) & (dst_idx >= 0)).sum()
        copy_rows_torch(src, src_idx, dst, dst_idx)
    else:
        from sgl_ess.kernels.flashtrans_triton import copy_rows_triton
        copy_rows_triton(src, src_idx, dst, dst_idx, count)


def move_rows(rows: torch.Tensor, src_idx: torch.Tensor, dst_idx: torch.Tensor, backend: str = "auto",
              count: torch.Tensor | None = None) -> None:
    """rows[dst_idx[i]] = rows[src_idx[i]], then rows[src_idx[i]] = 0, for every i with both >= 0.
    Sources and destinations must be disjoint sets of rows, each source read once (the store's
    ring rows and hot slots)."""
    _check(rows, src_idx, rows, dst_idx)
    backend = _backend(backend, rows, rows)
    if backend == "torch":
        move_rows_torch(rows, src_idx, dst_idx, count)
    else:
        from sgl_ess.kernels.flashtrans_triton import move_rows_triton
        move_rows_triton(rows, src_idx, dst_idx, count)


def move_rows_torch(rows: torch.Tensor, src_idx: torch.Tensor, dst_idx: torch.Tensor,
                    count: torch.Tensor | None = None) -> None:
    """Reference of move_rows: every copy first, then every zeroing."""
    valid = (src_idx >= 0) & (dst_idx >= 0)
    if count is not None:
        count += valid.sum()
    copy_rows_torch(rows, src_idx, rows, dst_idx)
    zero = torch.zeros((1, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    copy_rows_torch(zero, torch.where(valid, 0, -1), rows, torch.where(valid, src_idx, -1))


def _backend(backend: str, src: torch.Tensor, dst: torch.Tensor) -> str:
    if backend == "auto":
        return "triton" if (dst.is_cuda or src.is_cuda) and triton_available() else "torch"
    if backend not in ("torch", "triton"):
        raise ValueError(f"FlashTrans backend {backend!r}: expected 'auto', 'torch' or 'triton'")
    return backend


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
