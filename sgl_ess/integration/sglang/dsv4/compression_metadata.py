"""DeepSeek-V4 on CPU: torch ``init_compression_metadata`` (the backend's Triton kernel
``_init_compressed_attn_metadata_kernel``, kernels/ops/attention/dsv4/metadata_kernel.py:68-147).

Per metadata row b (seq_len s, position p, raw write location l for the first ``len(raw_out_loc)``
rows) and ratio r in (4, 128): out_loc = l // r when s % r == 0 else 0; position p & ~(r-1);
length s // r and max(s // r, 1); for C128 with page indices, entry j < max_pages * (page_size/128)
of row b is page_table[b, j // (page_size/128)] * (page_size/128) + j % (page_size/128) when
j < s // 128, else -1. Installed for the backend's call site only, for CPU tensors only.
"""

from __future__ import annotations

from typing import Optional

import torch


def _ratio(seq_lens, positions, raw_out_loc, r: int):
    n = raw_out_loc.shape[0]
    s = seq_lens.to(torch.int64)
    out_loc = torch.where(s[:n] % r == 0, raw_out_loc.to(torch.int64) // r, torch.zeros_like(s[:n]))
    pos = (positions.to(torch.int64) & ~(r - 1)).to(torch.int32)
    raw = (s // r).to(torch.int32)
    return out_loc, pos, raw, raw.clamp(min=1)


def init_compression_metadata_torch(seq_lens: torch.Tensor, positions: torch.Tensor, raw_out_loc: torch.Tensor,
                                    page_table: Optional[torch.Tensor] = None, page_size: int = 0,
                                    compute_page_indices: bool = True):
    assert raw_out_loc.shape[0] <= seq_lens.shape[0]
    c4 = _ratio(seq_lens, positions, raw_out_loc, 4)
    c128 = _ratio(seq_lens, positions, raw_out_loc, 128)
    pages = None
    if compute_page_indices:
        assert page_table is not None and page_size >= 128 and page_size % 128 == 0
        per_page = page_size // 128
        j = torch.arange(per_page * page_table.shape[1], device=seq_lens.device)
        vals = page_table.to(torch.int64)[:, j // per_page] * per_page + j % per_page
        pages = torch.where(j[None, :] < c128[2].to(torch.int64)[:, None], vals, -1).to(torch.int32)
    return (*c4, *c128, pages)


def around_init_compression_metadata(original_fn, seq_lens, *args, **kwargs):
    if seq_lens.device.type == "cpu":
        return init_compression_metadata_torch(seq_lens, *args, **kwargs)
    return original_fn(seq_lens, *args, **kwargs)
