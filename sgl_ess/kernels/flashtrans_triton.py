"""Triton FlashTrans kernel: one launch copies all rows of a step (see flashtrans.py).

Each program copies one row; rows are moved as 32-bit words when row_bytes % 4 == 0 (656 B
FP8 rows are 164 words), else as bytes. A pinned CPU tensor is turned into a CUDA view of the
same memory (UVA), so the kernel reads/writes host memory directly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_ess.kernels.uva import device_view


@triton.jit
def _copy_rows_kernel(src_ptr, src_idx_ptr, dst_ptr, dst_idx_ptr, count_ptr, words_per_row: tl.constexpr,
                      BLOCK: tl.constexpr, ZERO_SRC: tl.constexpr, COUNT: tl.constexpr):
    i = tl.program_id(0)
    s = tl.load(src_idx_ptr + i).to(tl.int64)
    d = tl.load(dst_idx_ptr + i).to(tl.int64)
    live = (s >= 0) & (d >= 0)          # -1 entries copy nothing (masked, no branch)
    s = tl.maximum(s, 0)
    d = tl.maximum(d, 0)
    for start in range(0, words_per_row, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = (offs < words_per_row) & live
        v = tl.load(src_ptr + s * words_per_row + offs, mask=m)
        tl.store(dst_ptr + d * words_per_row + offs, v, mask=m)
        if ZERO_SRC:                     # move: this program is the row's only reader
            tl.store(src_ptr + s * words_per_row + offs, tl.zeros_like(v), mask=m)
    if COUNT:
        tl.atomic_add(count_ptr, live.to(tl.int64))


def move_rows_triton(rows: torch.Tensor, src_idx: torch.Tensor, dst_idx: torch.Tensor,
                     count: torch.Tensor | None = None) -> None:
    """move_rows in one launch (flashtrans.move_rows): each program copies its row and zeroes the
    source; sources and destinations are disjoint, so no program reads a row another writes."""
    _launch(rows, src_idx, rows, dst_idx, count, zero_src=True)


def copy_rows_triton(src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor,
                     dst_idx: torch.Tensor, count: torch.Tensor | None = None) -> None:
    _launch(src, src_idx, dst, dst_idx, count, zero_src=False)


def _launch(src, src_idx, dst, dst_idx, count, zero_src: bool) -> None:
    m = src_idx.numel()
    if m == 0:
        return
    row_bytes = src.shape[1]
    if not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError("copy_rows_triton: src and dst must be contiguous")
    if count is not None and (count.numel() != 1 or count.dtype != torch.int64):
        raise ValueError(f"copy_rows_triton: count must be one int64 value, got {count.dtype}{list(count.shape)}")
    on_cuda = src.is_cuda or dst.is_cuda
    if on_cuda:
        src = src if src.is_cuda else device_view(src)
        dst = dst if dst.is_cuda else device_view(dst)
        dev = src.device
        src_idx = src_idx.to(dev, non_blocking=True)
        dst_idx = dst_idx.to(dev, non_blocking=True)
    # the kernel reads entry i at idx_ptr + i: a strided view (SplitFetch's grid[rank], a row of a
    # transposed view) would hand it other entries. A copy only when the view is strided.
    src_idx, dst_idx = src_idx.contiguous(), dst_idx.contiguous()
    if row_bytes % 4 == 0 and src.data_ptr() % 4 == 0 and dst.data_ptr() % 4 == 0:
        src_w, dst_w, words = src.view(torch.int32), dst.view(torch.int32), row_bytes // 4
    else:
        src_w, dst_w, words = src, dst, row_bytes
    block = min(256, triton.next_power_of_2(words))
    if zero_src:
        dst_w = src_w                    # one tensor (a separate device view would alias it)
    _copy_rows_kernel[(m,)](src_w, src_idx, dst_w, dst_idx, count if count is not None else src_idx, words,
                            BLOCK=block, ZERO_SRC=zero_src, COUNT=count is not None)
