"""SGLang's two FlashMLA sparse decodes with their log-sum-exp, so a decode layer can be split into
partial attentions merged by it (DA: the hits' call, then the misses' call once their fetch landed;
DBA: per half batch) - attention/overlap.py's schedule, as the CPU and Triton paths run it.

SGLang's wrappers (``DeepseekSparseAttnBackend._forward_flashmla_kv`` / ``_forward_flashmla_sparse``)
call the same kernels and drop the LSE; these two functions make the same calls (the same head
padding, page view, FP8 flags and arguments) and keep it:

  flashmla_kv      ``flash_mla_with_kvcache`` over FP8 656-byte rows: lse float32 [b, h_pad, s_q],
                   natural log;
  flashmla_sparse  ``flash_mla_sparse_fwd`` over BF16 rows: lse float32 [s_q, h_pad], base 2 (the
                   legacy kernel SGLang's flash_mla_interface calls, ``return_log2_lse``).

Both return lse natural-log [b, h] here. FlashMLA answers a query with no valid index ("lonely")
with output 0 and lse +inf, which a merge would read as all the weight: such rows get -inf (no
weight), so a part with no entries for a row (every hit, or every miss) drops out of the merge.

Static shapes and no host reads: a call of `n` rows that is not SGLang's whole batch (a DBA half, a
padded batch's real rows) uses a FlashMLA tile schedule for `n` rows computed once per `n` and kept
(``schedules``), with every row's cache length the full top-k width (an upper bound on its valid
columns, so the schedule covers every column whatever FlashMLA schedules by), so a CUDA graph
capture sees no new work after its warm-up. Imports SGLang (its kernels' module, looked up per call so the GPU fake's
stand-in is what runs on CPU).
"""

from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)


def _no_weight_for_lonely(lse: torch.Tensor) -> torch.Tensor:
    """FlashMLA's +inf lse of a query with no valid index -> -inf (no weight in a merge)."""
    return lse.masked_fill(lse == float("inf"), float("-inf"))


def _pad_heads(q: torch.Tensor, heads: int) -> torch.Tensor:
    """q [..., h, d] with zero heads appended up to `heads` (FlashMLA's supported head counts), as
    SGLang's wrappers pad."""
    h = q.shape[-2]
    if h == heads:
        return q
    if heads < h:
        raise ValueError(f"FlashMLA: {h} query heads, more than the {heads} the kernel is padded to")
    out = q.new_zeros(*q.shape[:-2], heads, q.shape[-1])
    out[..., :h, :] = q
    return out


def kv_schedule(backend, n: int, schedules: dict):
    """(tile schedule, num_splits, cache_seqlens) for a flashmla_kv call of `n` rows: SGLang's own
    metadata when `n` is its batch, else one computed for `n` rows at the top-k width and kept."""
    md = backend.forward_metadata
    seqlens = md.dsa_cache_seqlens_int32
    if md.flashmla_metadata is not None and seqlens is not None and seqlens.shape[0] == n:
        return md.flashmla_metadata.flashmla_metadata, md.flashmla_metadata.num_splits, seqlens
    got = schedules.get(n)
    if got is None:
        lens = torch.full((n,), int(backend.dsa_index_topk), dtype=torch.int32, device=seqlens.device)
        sched = backend._compute_flashmla_metadata(lens, 1)
        got = (sched.flashmla_metadata, sched.num_splits, lens)
        schedules[n] = got
    return got


def decode_kv(backend, q3: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, layer, schedules: dict):
    """flashmla_kv: q3 [n, H, D]; kv the slot space [S, 1, kv_dim] (cache dtype); slots int32 [n, topk]
    (-1 excluded) -> (out [n, H, R] in q's dtype, lse float32 [n, H] natural log)."""
    from sglang.kernels.ops.attention.flash_mla_interface import flash_mla_with_kvcache
    from sglang.srt.layers.attention import dsa_backend

    b = backend
    n, h, d = q3.shape
    if slots.shape[-1] != b.dsa_index_topk:
        raise ValueError(f"FlashMLA decode: a slot table of width {slots.shape[-1]}; the kernel needs the model's "
                         f"index_topk {b.dsa_index_topk}")
    if b.physical_page_size != 64:
        raise ValueError(f"FlashMLA decode: page size {b.physical_page_size}; the kernel reads pages of 64 rows")
    sched, splits, seqlens = kv_schedule(b, n, schedules)
    q_in = _pad_heads(q3.reshape(n, 1, h, d), b.flashmla_kv_num_q_heads)
    cache = kv.view(-1, b.physical_page_size, 1, b.kv_cache_dim)
    if not b.dsa_kv_cache_store_fp8:
        cache = dsa_backend.quantize_k_cache(cache)     # as SGLang's wrapper: a BF16 pool quantized per call
    o, lse = flash_mla_with_kvcache(
        q=q_in, k_cache=cache, cache_seqlens=seqlens, head_dim_v=layer.v_head_dim,
        tile_scheduler_metadata=sched, num_splits=splits, softmax_scale=layer.scaling,
        indices=slots.unsqueeze(1),
        block_table=torch.empty((n, 0), dtype=torch.int32, device=q3.device),   # unused, required
        is_fp8_kvcache=True, kv_format=b.flashmla_kv_format)
    return o[:, 0, :h, :], _no_weight_for_lonely(lse[:, :h, 0])


def decode_sparse(backend, q3: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, layer):
    """flashmla_sparse: q3 [n, H, D]; kv the slot space [S, 1, D] BF16 rows; slots int32 [n, topk]
    (-1 excluded) -> (out [n, H, R] in q's dtype, lse float32 [n, H] natural log)."""
    from sglang.kernels.ops.attention.flash_mla_interface import flash_mla_sparse_fwd

    b = backend
    if b.dsa_kv_cache_store_fp8:
        raise ValueError("ESS decode with --dsa-decode-backend flashmla_sparse: the latent pool holds FP8 656-byte "
                         "rows (--kv-cache-dtype fp8_e4m3) and FlashMLA's sparse kernel reads BF16 rows. Use "
                         "--dsa-decode-backend flashmla_kv for FP8 rows, or --kv-cache-dtype bfloat16")
    n, h, _ = q3.shape
    heads = 128 if b.device_sm_major >= 10 else 64      # the kernel's head multiple (Blackwell / Hopper)
    if h % heads and heads % h:
        raise ValueError(f"FlashMLA sparse decode: {h} query heads cannot be padded to {heads}")
    q_in = _pad_heads(q3, heads * ((h + heads - 1) // heads))
    seqlens = backend.forward_metadata.dsa_cache_seqlens_int32
    # the per-row bound on valid columns, SGLang's topk_length; rows of a part keep their columns
    # (overlap.only masks in place on a device), so the whole batch's bound holds for DA's parts
    topk_length = seqlens if seqlens is not None and seqlens.shape[0] == n else None
    o, _, lse2 = flash_mla_sparse_fwd(q=q_in, kv=kv, indices=slots.unsqueeze(1), sm_scale=layer.scaling,
                                      d_v=layer.v_head_dim, attn_sink=None, topk_length=topk_length)
    return o[:, :h, :], _no_weight_for_lonely(lse2[:, :h] * LN2)
