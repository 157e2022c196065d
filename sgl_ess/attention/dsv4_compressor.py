"""DeepSeek-V4's KV compressor in plain torch: how one C4 / C128 entry is pooled from its tokens.

Written from the model's definition as SGLang 0.5.23 runs it (``Compressor`` in
srt/layers/attention/dsv4/compressor.py:37, its CUDA kernels kernels/jit/csrc/deepseek_v4/c4_v2.cuh
``c4_forward`` and c128_v2.cuh). A compressed layer of ratio ``r`` projects every token x_t with one
linear map ``wkv_gate`` into ``coff`` KV halves and ``coff`` score halves (``coff`` = 2 for r = 4, the
overlapping C4; 1 for r = 128), row layout ``| kv_a | kv_b | score_a | score_b |`` (c4_v2.cuh:1-8;
C128 has ``| kv | score |``). Block n covers tokens n*r .. n*r + r - 1 and is finished when its last
token arrives (SGLang compresses when seq_len % r == 0, metadata_kernel.py:100,111). Its entry is a
per-channel softmax-weighted sum:

  C128:  entry[c] = sum_j softmax_j(score[j, c] + ape[j % r, c]) * kv[j, c]     j in block n
  C4:    the same over 8 candidates: the previous block's tokens with (kv_a, score_a + ape[:, :d]) and
         block n's tokens with (kv_b, score_b + ape[:, d:]); block 0 has only its own 4 (the kernel's
         ``need_overlap = seq_len > 4``: kv 0, score -inf for the missing half).

``ape`` is the checkpoint's [r, coff * d] position bias (SGLang reshapes it to [coff * r, d] at load,
``_apply_ape_hotfix``, compressor.py:117; the kernel's rows 0..r-1 are ape[:, :d]). The pooled entry
is then RMS-normed and its last rope_dim channels rotated at the block's first position n * r
(``dsv4_rope.finish_entry``).

``CompressorState`` is the running state of one request: the raw rows of the current partial block
(and, for C4, the previous full block), what SGLang keeps in its per-request ring
(``get_compress_state_ring_size``: 8 rows for C4, 128 for C128, deepseek_v4_memory_pool.py:60).
Tensors are float (CPU). No state outside the objects; ``CompressorState`` owns its rows.
"""
from __future__ import annotations

import torch


def coff_of(ratio: int) -> int:
    """KV halves per token: 2 for the overlapping C4, 1 for C128 (compressor.py:59-61)."""
    if ratio not in (4, 128):
        raise ValueError(f"compress ratio {ratio}: DeepSeek-V4's compressed layers have ratio 4 or 128")
    return 2 if ratio == 4 else 1


def _split(kv_score: torch.Tensor, ratio: int, head_dim: int):
    """kv_score [..., 2 * coff * d] -> (kv_a, kv_b, score_a, score_b), each [..., d]; a = None for C128."""
    coff = coff_of(ratio)
    if kv_score.shape[-1] != 2 * coff * head_dim:
        raise ValueError(f"kv_score rows have {kv_score.shape[-1]} values; ratio {ratio} with head_dim "
                         f"{head_dim} needs 2 * {coff} * {head_dim} = {2 * coff * head_dim}")
    if coff == 1:
        return None, kv_score[..., :head_dim], None, kv_score[..., head_dim:]
    d = head_dim
    return kv_score[..., :d], kv_score[..., d:2 * d], kv_score[..., 2 * d:3 * d], kv_score[..., 3 * d:]


def pool_block(prev_block: torch.Tensor | None, block: torch.Tensor, ape: torch.Tensor, ratio: int,
               head_dim: int) -> torch.Tensor:
    """One finished block's pooled entry (before norm and rope).

    prev_block float [r, 2*coff*d] or None (C4: the previous block's raw rows; None for block 0;
    ignored for C128); block float [r, 2*coff*d]; ape float [r, coff*d] (checkpoint layout).
    Returns float32 [d]."""
    d = head_dim
    if block.shape[0] != ratio:
        raise ValueError(f"a block of ratio {ratio} has {ratio} rows, got {block.shape[0]}")
    _, kv_b, _, s_b = _split(block.float(), ratio, d)
    kv, score = [kv_b], [s_b + ape[:, -d:].float()]
    if ratio == 4 and prev_block is not None:
        kv_a, _, s_a, _ = _split(prev_block.float(), ratio, d)
        kv.insert(0, kv_a)
        score.insert(0, s_a + ape[:, :d].float())
    kv, score = torch.cat(kv), torch.cat(score)                # [m, d], m = r or 2r
    weights = torch.softmax(score, dim=0)                      # per channel, over the block's tokens
    return (weights * kv).sum(0)


def compress_prefix(kv_score: torch.Tensor, ape: torch.Tensor, ratio: int, head_dim: int) -> torch.Tensor:
    """Every finished block of a sequence that starts at position 0, in one pass (vectorised; shares
    no code with ``pool_block``). kv_score float [n, 2*coff*d]. Returns float32 [n // r, d]."""
    d, n_blocks = head_dim, kv_score.shape[0] // ratio
    _split(kv_score, ratio, d)                                 # validates the row width
    if n_blocks == 0:
        return kv_score.new_zeros(0, d, dtype=torch.float32)
    rows = kv_score[: n_blocks * ratio].float().view(n_blocks, ratio, -1)
    coff = coff_of(ratio)
    kv_b = rows[..., (coff - 1) * d: coff * d]
    s_b = rows[..., (2 * coff - 1) * d:] + ape[:, -d:].float()
    if coff == 1:
        return (torch.softmax(s_b, dim=1) * kv_b).sum(1)
    # C4: block n also weighs block n-1's "a" half; block 0's is absent (score -inf, weight 0)
    kv_a = torch.zeros_like(kv_b)
    s_a = torch.full_like(s_b, float("-inf"))
    kv_a[1:] = rows[:-1, :, :d]
    s_a[1:] = rows[:-1, :, 2 * d:3 * d] + ape[:, :d].float()
    kv = torch.cat([kv_a, kv_b], dim=1)
    score = torch.cat([s_a, s_b], dim=1)
    return (torch.softmax(score, dim=1) * kv).sum(1)


class CompressorState:
    """One request's running compressor state for one compressed layer.

    ``append`` takes the next tokens' kv_score rows (prefill chunk or one decode token) and returns the
    entries of the blocks they finish. Holds at most 2r - 1 rows for C4 (the previous full block and the
    current partial one) and r - 1 for C128 between calls."""

    def __init__(self, ratio: int, head_dim: int, ape: torch.Tensor):
        coff = coff_of(ratio)
        if tuple(ape.shape) != (ratio, coff * head_dim):
            raise ValueError(f"ape has shape {tuple(ape.shape)}; ratio {ratio} with head_dim {head_dim} "
                             f"needs ({ratio}, {coff * head_dim}) (the checkpoint layout)")
        self.ratio, self.head_dim, self.ape = ratio, head_dim, ape
        self.num_tokens = 0                          # tokens seen: the next token's position
        self._prev_block: torch.Tensor | None = None  # C4 only: the last finished block's raw rows
        self._partial: list[torch.Tensor] = []        # raw rows of the unfinished block

    @property
    def held_rows(self) -> int:
        """Raw rows kept between calls (what SGLang's state ring must hold)."""
        return len(self._partial) + (0 if self._prev_block is None else self._prev_block.shape[0])

    def append(self, kv_score: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """kv_score float [m, 2*coff*d], the next m tokens. Returns [(block index n, entry float32 [d])]
        for every block these tokens finish, in order; block n's rope position is n * r."""
        out = []
        for row in kv_score:
            self._partial.append(row)
            self.num_tokens += 1
            if len(self._partial) < self.ratio:
                continue
            block = torch.stack(self._partial)
            n = self.num_tokens // self.ratio - 1
            out.append((n, pool_block(self._prev_block, block, self.ape, self.ratio, self.head_dim)))
            self._partial = []
            self._prev_block = block if self.ratio == 4 else None
        return out
