"""DeepSeek-V4's C4 lightning indexer in plain torch: scores over the C4 index keys and the top-k.

Written from SGLang 0.5.23's ``C4Indexer`` (srt/layers/attention/dsv4/indexer.py:1154): its own ratio-4
compressor builds one index key per 4 tokens (index_head_dim 128, ``rotate=True``), the query is
``wq_b(q_lora)`` per index head, and the score of C4 entry j for query t is

    score[t, j] = sum_h w[t, h] * relu(q[t, h] . k[j])

with w = weights_proj(x) * index_head_dim**-0.5 * index_n_heads**-0.5 (``weight_scale``,
indexer.py:1216, ``compute_weights`` indexer.py:1246); SGLang's torch form is
``fp8_paged_mqa_logits_torch`` (indexer.py:82). SGLang applies a Hadamard rotation to both q and k
before quantizing them; it is orthogonal, so in exact arithmetic it leaves q . k unchanged and this
reference leaves it out. A query at position p sees the C4 entries of finished blocks only,
j < (p + 1) // 4 (metadata_kernel.py:103 ``c4_seq_lens_raw = seq_len // 4``), and attends to the top
``index_topk`` (512 in V4) of them, or to all of them when there are at most index_topk
(``_topk_transform_vectorized``, indexer.py:275, its ``needs_sequential`` arm). Stateless.
"""
from __future__ import annotations

import torch


def index_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q float [T, H, d]; weights float [T, H] (already scaled); keys float [N, d] (one request's C4
    index keys). Returns float32 [T, N] (no visibility mask; see ``select_topk``)."""
    dots = torch.einsum("thd,nd->thn", q.float(), keys.float())
    return (torch.relu(dots) * weights.float()[:, :, None]).sum(1)


def visible_c4_entries(positions: torch.Tensor, ratio: int = 4) -> torch.Tensor:
    """positions int [T] -> the number of finished blocks each query sees, (p + 1) // ratio."""
    return (positions.long() + 1) // ratio


def select_topk(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> torch.Tensor:
    """scores float [T, N]; visible int [T] (entries 0..visible-1 are candidates). Returns int64
    [T, topk]: each query's chosen entry indices in ascending order, -1 padding after them. All
    visible entries when visible <= topk."""
    t, n = scores.shape
    out = torch.full((t, topk), -1, dtype=torch.long)
    for i in range(t):
        v = int(visible[i])
        if v > n:
            raise ValueError(f"query {i} sees {v} entries but only {n} scores were given")
        if v <= topk:
            chosen = torch.arange(v)
        else:
            chosen = torch.topk(scores[i, :v].float(), topk).indices.sort().values
        out[i, : chosen.numel()] = chosen
    return out
