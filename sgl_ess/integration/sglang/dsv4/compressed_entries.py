"""The CPU dsv4 arm's compressed entries of one request, from its tokens' compressor projections.

``entries(compressor, kv_score)``: kv_score float [n, 2*coff*d], the projections of positions 0..n-1;
returns float32 [n // r, d], every finished block pooled (sgl_ess/attention/dsv4_compressor.compress_prefix),
RMS-normed with the compressor's norm and roped at the block's first position with its table
(dsv4_rope.finish_entry). SGLang's loader rearranges a C4 compressor's ``ape`` once loaded
(``Compressor._apply_ape_hotfix``, dsv4/compressor.py:117: [r, 2d] -> chunks -> [2r, d] viewed as
[r, 2d]); ``checkpoint_ape`` undoes it for the reference, which takes the checkpoint layout.
"""

from __future__ import annotations

import torch

from sgl_ess.attention.dsv4_compressor import compress_prefix
from sgl_ess.attention.dsv4_rope import finish_entry


def checkpoint_ape(compressor) -> torch.Tensor:
    ape = compressor.ape.data.float()
    if not (getattr(compressor, "ape_converted", False) and compressor.overlap):
        return ape
    r, d = compressor.ratio, compressor.head_dim
    a = ape.reshape(2 * r, d)
    return torch.cat([a[:r], a[r:]], dim=-1)


def first_row(compressor, first_block: int) -> int:
    """The first position whose projection ``finished_entries`` needs for blocks from `first_block`."""
    back = 1 if compressor.overlap and first_block > 0 else 0
    return compressor.ratio * (first_block - back)


def finished_entries(compressor, kv_score: torch.Tensor, first_block: int) -> torch.Tensor:
    """The entries of blocks first_block, first_block + 1, ...: kv_score float [m, 2*coff*d] holds the
    projections of positions first_row(compressor, first_block) onwards (a C4 block also weighs its
    predecessor).
    Each entry is computed once, when its block finishes, from the same rows whatever else the batch holds
    (a batch-size-dependent recomputation rounds differently), as SGLang's pool stores it once."""
    r, d = compressor.ratio, compressor.head_dim
    pooled = compress_prefix(kv_score, checkpoint_ape(compressor), r, d)
    if first_block > 0 and compressor.overlap:
        pooled = pooled[1:]
    if pooled.shape[0] == 0:
        return pooled
    blocks = torch.arange(first_block, first_block + pooled.shape[0])
    return finish_entry(pooled, blocks, r, compressor.norm.weight.data, compressor.norm.variance_epsilon,
                        compressor.freqs_cis, compressor.rope_head_dim)


def entries(compressor, kv_score: torch.Tensor) -> torch.Tensor:
    r, d = compressor.ratio, compressor.head_dim
    pooled = compress_prefix(kv_score, checkpoint_ape(compressor), r, d)
    if pooled.shape[0] == 0:
        return pooled
    blocks = torch.arange(pooled.shape[0])
    return finish_entry(pooled, blocks, r, compressor.norm.weight.data, compressor.norm.variance_epsilon,
                        compressor.freqs_cis, compressor.rope_head_dim)
