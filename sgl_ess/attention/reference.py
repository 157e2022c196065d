"""Absorbed MLA sparse decode attention in plain torch (the CPU path and the reference).

Decode attention in DeepSeek-V3.2 is MQA over the latent: every head's query q
[kv_lora_rank + rope_dim] scores each selected latent row; values are the row's first
kv_lora_rank columns.

  q:      float [b, heads, dim]         absorbed queries
  rows:   uint8 [S, row_bytes]          a slot buffer (e.g. LatentStore.layer_rows(layer))
  slots:  int   [b, k]                  row indices into `rows`, -1 = padding (ignored)
  returns out float32 [b, heads, kv_lora_rank], lse float32 [b, heads] (natural log;
          -inf and out = 0 where a request selected nothing)

Learnable attention sinks (Hunyuan V4): `with_sink` adds them to a finished attention's (out, lse);
the model's own definition, written without our path, is sgl_ess.attention.sink_reference.
"""
from __future__ import annotations

import torch

from sgl_ess.kernels.latent_layout import LatentLayout


def sparse_mla_decode(q: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
                      layout: LatentLayout, sm_scale: float, mask: torch.Tensor | None = None):
    """Attention of each request over its selected rows; `mask` bool [b, k] keeps a subset."""
    keep = slots >= 0 if mask is None else (slots >= 0) & mask
    kv = layout.decode(rows[slots.clamp(min=0).long()])            # [b, k, dim]
    return attend(q, kv, keep, layout.kv_lora_rank, sm_scale)


def attend(q: torch.Tensor, kv: torch.Tensor, keep: torch.Tensor, kv_lora_rank: int,
           sm_scale: float, acc_dtype: torch.dtype = torch.float32):
    """q [b, h, dim], kv float [b, k, dim], keep bool [b, k] -> (out [b, h, r], lse [b, h]) in
    `acc_dtype`. float64 makes a split attention merged by log-sum-exp (DA) round to the same
    bf16 output as the unsplit one except with negligible probability (~1e-16 vs bf16's 4e-3 ulp)."""
    scores = torch.bmm(q.to(acc_dtype), kv.to(acc_dtype).transpose(1, 2)) * sm_scale   # [b, h, k]
    scores = scores.masked_fill(~keep.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=2)
    p = torch.exp(scores - lse.unsqueeze(2)).nan_to_num(0.0)
    out = torch.bmm(p, kv[..., :kv_lora_rank].to(acc_dtype))                  # [b, h, r]
    return out, lse


def merge_lse(o0: torch.Tensor, lse0: torch.Tensor, o1: torch.Tensor, lse1: torch.Tensor):
    """Exactly combine two partial attentions over disjoint key sets."""
    lse = torch.logaddexp(lse0, lse1)
    w0 = torch.exp(lse0 - lse).nan_to_num(0.0).unsqueeze(-1)
    w1 = torch.exp(lse1 - lse).nan_to_num(0.0).unsqueeze(-1)
    return o0 * w0 + o1 * w1, lse


def with_sink(out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor | None):
    """Count a learnable per-head sink logit (Hunyuan V4's ``learnable_sink_param``) in the softmax
    denominator of an attention given as (out [b, h, r], lse [b, h]) over its whole key set:
    out * e^lse / (e^lse + e^sink), lse -> log(e^lse + e^sink). sink float [h] (None: unchanged). Apply
    it exactly once, after any log-sum-exp merge of partial attentions (a sink counted in each part
    would be counted twice). A request that selected nothing keeps out = 0 and lse = -inf."""
    if sink is None:
        return out, lse
    s = sink.to(device=lse.device, dtype=lse.dtype).reshape(1, -1).expand_as(lse)
    total = torch.logaddexp(lse, s)
    w = torch.exp(lse - total)                       # 0 where lse = -inf
    # the weight stays in lse's precision: one rounding of the product to out's dtype, not a BF16 weight too
    return (out * w.unsqueeze(-1)).to(out.dtype), torch.where(torch.isneginf(lse), lse, total)


def split_sparse_mla_decode(q, rows, slots, hit, layout: LatentLayout, sm_scale: float):
    """ESS dual attention: Attn0 over the entries that were resident (hit, bool [b, k]) - it
    can run while the misses are still in flight - and Attn1 over the fetched misses, merged by
    log-sum-exp. Equal to `sparse_mla_decode` over all entries."""
    o0, l0 = sparse_mla_decode(q, rows, slots, layout, sm_scale, mask=hit)
    o1, l1 = sparse_mla_decode(q, rows, slots, layout, sm_scale, mask=~hit)
    return merge_lse(o0, l0, o1, l1)


def dense_topk_reference(q: torch.Tensor, latents: list[torch.Tensor], topk: torch.Tensor,
                         kv_lora_rank: int, sm_scale: float):
    """All-resident reference: request i attends over latents[i][topk[i]] (float [T_i, dim])."""
    outs, lses = [], []
    for i, lat in enumerate(latents):
        sel = topk[i][topk[i] >= 0].long()
        kv = lat[sel].float().unsqueeze(0)
        keep = torch.ones((1, sel.numel()), dtype=torch.bool, device=kv.device)
        o, l = attend(q[i:i + 1], kv, keep, kv_lora_rank, sm_scale)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)
