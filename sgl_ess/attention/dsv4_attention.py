"""DeepSeek-V4's attention of one layer in plain torch: the sliding window plus compressed entries,
one softmax with the per-head sink.

Written from SGLang 0.5.23's ``DeepseekV4AttnBackend._forward_attention``
(srt/layers/attention/deepseek_v4_backend.py:4143): every layer attends, for query position p, to the
window of its own uncompressed KV rows, positions p, p-1, ..., p-window+1 that exist
(``build_causal_swa_page_indices``, kernels/ops/attention/dsv4/attn_metadata_kernels.py:528; window
128, ``DeepSeekV4Config.window_size``); a compressed layer adds its entries (``extra_indices``) in the
same softmax (one FlashMLA call with ``indices`` and ``extra_indices_in_kvcache``,
deepseek_v4_backend.py:4384-4401):

  ratio 0    window only
  ratio 4    window + the C4 entries the indexer chose (top index_topk of j < (p + 1) // 4)
  ratio 128  window + every finished C128 entry j < (p + 1) // 128 (metadata_kernel.py:114)

The attention is MQA with one KV head of head_dim D (512 in V4) whose rows are both keys and values
(``assert k is v``, deepseek_v4_backend.py:4162; head_dim_v = D), scale D**-0.5, and the learnable
sink per head (``attn_sink``, deepseek_v4.py:1092) in the denominator:

  out[h] = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m)),  m = max(max_j s_j, sink_h)

Queries and rows carry RoPE on their last rope_dim channels already (``dsv4_rope``); the caller
rotates the output back. Stateless; tensors float (CPU).
"""
from __future__ import annotations

import torch

WINDOW_TOKENS = 128          # DeepSeekV4Config.window_size (srt/configs/deepseek_v4.py)


def window_positions(positions: torch.Tensor, window: int = WINDOW_TOKENS) -> torch.Tensor:
    """positions int [T] -> int64 [T, window]: p, p-1, ..., p-window+1, -1 where below 0 (SGLang's
    order)."""
    offs = positions.long()[:, None] - torch.arange(window)[None, :]
    return offs.masked_fill(offs < 0, -1)


def visible_entries(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """positions int [T] -> how many of the layer's compressed entries each query sees."""
    return (positions.long() + 1) // ratio


def sink_attention(q: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor, sink: torch.Tensor,
                   sm_scale: float) -> torch.Tensor:
    """q float [T, H, D]; rows float [T, K, D] (keys = values); keep bool [T, K]; sink float [H]
    (-inf: no sink). Returns float32 [T, H, D]; 0 where a query keeps no row and has no finite sink."""
    s = torch.einsum("thd,tkd->thk", q.float(), rows.float()) * sm_scale
    s = s.masked_fill(~keep[:, None, :], float("-inf"))
    sink_col = sink.float()[None, :, None].expand(s.shape[0], -1, 1)
    logits = torch.cat([s, sink_col], dim=-1)                      # the sink is one more logit...
    m = logits.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(logits - m)
    denom = e.sum(-1, keepdim=True)
    p = e[..., :-1] / torch.where(denom > 0, denom, torch.ones_like(denom))
    return torch.einsum("thk,tkd->thd", p, rows.float())          # ...with no value


def partial_attention(q: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor,
                      sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention of q float [T, H, D] over a part of its rows (float [T, K, D], keep bool [T, K]) without
    the sink: (out float32 [T, H, D], lse float32 [T, H]; 0 and -inf where a query keeps no row). Parts over
    disjoint rows merge by log-sum-exp (reference.merge_lse) and the sink is counted once after the merge
    (reference.with_sink): the same softmax as ``sink_attention`` over all the rows (ESS's DA / DBA split)."""
    s = torch.einsum("thd,tkd->thk", q.float(), rows.float()) * sm_scale
    s = s.masked_fill(~keep[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    return torch.einsum("thk,tkd->thd", p, rows.float()), lse


def window_rows(positions: torch.Tensor, swa_rows: torch.Tensor,
                window: int = WINDOW_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows float [T, window, D], keep bool [T, window]): each query's window of swa_rows [n, D] by position."""
    win = window_positions(positions, window)
    if int(positions.max()) >= swa_rows.shape[0]:
        raise ValueError(f"query position {int(positions.max())} has no row in swa_rows ({swa_rows.shape[0]})")
    return swa_rows[win.clamp(min=0)], win >= 0


def layer_attention(q: torch.Tensor, positions: torch.Tensor, swa_rows: torch.Tensor, sink: torch.Tensor,
                    sm_scale: float, compressed: torch.Tensor | None = None,
                    chosen: torch.Tensor | None = None, window: int = WINDOW_TOKENS) -> torch.Tensor:
    """One request's attention for one layer.

    q float [T, H, D] (queries at `positions` int [T]); swa_rows float [n, D], the layer's uncompressed
    rows by position (n > max position); compressed float [N, D] or None (window-only layer), by entry
    index; chosen int [T, k] entry indices per query, -1 padding (C4: the indexer's top-k; C128: every
    visible entry, e.g. ``torch.arange`` masked by ``visible_entries``). Returns float32 [T, H, D]."""
    rows, keep = window_rows(positions, swa_rows, window)
    if compressed is not None:
        if chosen is None:
            raise ValueError("a compressed layer needs `chosen`, the entries each query attends to")
        rows = torch.cat([rows, compressed[chosen.clamp(min=0)]], dim=1)
        keep = torch.cat([keep, chosen >= 0], dim=1)
    return sink_attention(q, rows, keep, sink, sm_scale)
