"""Sparse MLA decode with a learnable attention sink, written from the model's definition.

Hunyuan V4 (SGLang's ``HYV4Attention``: ``learnable_sink_param``, one float32 logit per head, handed to
FlashMLA as ``attn_sink``) adds a per-head sink to the softmax over the selected rows: for query t, head h,
with scores s_j = sm_scale * q_{t,h} . k_j over the rows j the indexer selected,

    m   = max(max_j s_j, sink_h)
    out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m))

The sink takes probability mass and contributes no value. This is the reference the ESS paths
(``reference.with_sink`` after the DA/DBA merge, the Triton decode's sink, the backends) are checked
against; it is a direct dense transcription of the formula, in float64, sharing no code with them.
"""
from __future__ import annotations

import torch


def sink_attention(q: torch.Tensor, kv: torch.Tensor, keep: torch.Tensor, sink: torch.Tensor,
                   kv_lora_rank: int, sm_scale: float) -> torch.Tensor:
    """q float [T, h, D]; kv float [T, k, D] (the selected latent rows; values are the first
    kv_lora_rank columns); keep bool [T, k] (False: not selected); sink float [h].
    Returns out float64 [T, h, kv_lora_rank] (0 where a query selected nothing)."""
    q64, kv64 = q.double(), kv.double()
    t, h, _ = q64.shape
    out = torch.zeros(t, h, kv_lora_rank, dtype=torch.float64)
    for i in range(t):
        rows = kv64[i][keep[i]]                              # [n, D] the selected rows only
        if rows.shape[0] == 0:
            continue
        values = rows[:, :kv_lora_rank]
        for j in range(h):
            s = (rows @ q64[i, j]) * sm_scale                # [n]
            sink_h = sink[j].double()
            m = torch.maximum(s.max(), sink_h)
            e = torch.exp(s - m)
            out[i, j] = (e[:, None] * values).sum(0) / (e.sum() + torch.exp(sink_h - m))
    return out
