"""Exact pure-torch DSA lightning indexer: the CPU path of SGLang's ``Indexer.forward_native``.

SGLang 0.5.23 raises ``NotImplementedError`` there; CUDA keeps ``forward_cuda`` (DeepGEMM
kernels) untouched. The math mirrors ``forward_cuda`` with its non-fused fallback:

  q = wq_b(q_lora) -> [T, H, D];  k = k_norm(wk(x)) -> [T, D]
  rope on the first ``rope_head_dim`` dims (q per head, k shared); Hadamard rotation of both
  q, k -> FP8 e4m3 with one fp32 scale per 128 values (``act_quant``; power-of-two scale when
  ``scale_fmt`` is set). k is stored in SGLang's index-key pool (same 132-byte page layout).
  w = weights_proj(x) * H^-0.5 * q_scale * D^-0.5               -> [T, H]
  logits[t, s] = sum_h w[t, h] * relu(q8[t, h] . k8[s] * k_scale[s])   for s <= pos(t)
  top-k over s, -1 padding where fewer than k positions exist.

Output: int32 ``[T, index_topk]`` of token POSITIONS inside each request (0..seq_len-1), the
form the ``ess`` backend consumes (it maps positions through ``req_to_token``).
Memory: reads/writes only SGLang's index-key pool; allocates per-call temporaries.
"""

from __future__ import annotations

import functools
import math

import torch

from sgl_ess.kernels.latent_layout import FP8_MAX

from .padding import real_rows

FP8_DTYPE = torch.float8_e4m3fn
QUANT_BLOCK = 128
SCALE_BYTES = 4


@functools.lru_cache(maxsize=8)
def _hadamard(n: int, device_str: str) -> torch.Tensor:
    """Sylvester Hadamard matrix [n, n] float32, scaled by n^-0.5 (orthonormal)."""
    assert n & (n - 1) == 0, f"Hadamard size must be a power of 2, got {n}"
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h * n ** -0.5).to(device_str)


def hadamard_rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (any float dtype) -> x @ H_D / sqrt(D), same dtype. Matches SGLang's rotate_activation."""
    d = x.shape[-1]
    return (x.float() @ _hadamard(d, str(x.device))).to(x.dtype)


def act_quant(x: torch.Tensor, scale_fmt: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block FP8 quantization, torch version of SGLang's ``act_quant`` (block 128).

    x: [..., N] float; returns (fp8 [..., N], fp32 scales [..., N // 128]).
    """
    shape = x.shape
    xb = x.float().reshape(*shape[:-1], shape[-1] // QUANT_BLOCK, QUANT_BLOCK)
    amax = xb.abs().amax(dim=-1).clamp_min(1e-4)
    scale = amax / FP8_MAX
    if scale_fmt is not None:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    y = (xb / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return y.reshape(shape), scale


class IndexKeyPages:
    """Reads/writes SGLang's DSA index-key pool from torch, in its page layout.

    One layer's buffer is uint8 ``[num_pages, page * (D + 4)]``: first ``page * D`` bytes are the
    FP8 keys of the page's tokens, then ``page`` fp32 scales.
    """

    def __init__(self, pool, head_dim: int):
        self.pool = pool
        self.page = pool.index_page_size
        self.head_dim = head_dim

    def _views(self, layer_id: int):
        buf = self.pool.get_index_k_with_scale_buffer(layer_id=layer_id)
        n = buf.shape[0]
        keys = buf[:, : self.page * self.head_dim].view(n, self.page, self.head_dim)
        scales = buf[:, self.page * self.head_dim:].view(n, self.page, SCALE_BYTES)
        return keys, scales

    def write(self, layer_id: int, loc: torch.Tensor, k_fp8: torch.Tensor, k_scale: torch.Tensor) -> None:
        """loc int [n]; k_fp8 [n, D] fp8; k_scale [n, 1] fp32."""
        keys, scales = self._views(layer_id)
        loc = loc.long()
        page, off = loc // self.page, loc % self.page
        keys[page, off] = k_fp8.view(torch.uint8)
        scales[page, off] = k_scale.reshape(-1, 1).contiguous().view(torch.uint8).view(-1, SCALE_BYTES)

    def read(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        """loc int [s] -> dequantization pair as float32 keys [s, D] (fp8 values) and scales [s]."""
        keys, scales = self._views(layer_id)
        loc = loc.long()
        page, off = loc // self.page, loc % self.page
        k = keys[page, off].view(FP8_DTYPE).float()
        s = scales[page, off].contiguous().view(torch.float32).reshape(-1)
        return k, s


def _per_request_spans(forward_batch):
    """Yield (request row i, first token index in the batch, #query tokens, kv length): the
    query tokens of request i sit at positions kv_len - n_q .. kv_len - 1 (query_layout.query_layout:
    decode, extend, mixed, TARGET_VERIFY, DRAFT_EXTEND_V2)."""
    from .query_layout import query_layout

    lay = query_layout(forward_batch)
    start = 0
    for i, (n, s) in enumerate(zip(lay.n_q, lay.kv_lens)):
        yield i, start, n, s
        start += n


def indexer_forward_native(self, x, q_lora, positions, forward_batch, layer_id, return_indices=True, **_):
    """Replacement for ``Indexer.forward_native`` (see module docstring). Returns int32 [T, topk] or None."""
    from sglang.srt.model_executor.forward_context import get_req_to_token_pool, get_token_to_kv_pool

    if isinstance(x, tuple):
        x = x[-1]
    n_tokens = x.shape[0]
    topk = self.index_topk
    out = torch.full((n_tokens, topk), -1, dtype=torch.int32, device=x.device)
    if n_tokens == 0:
        return out if return_indices else None

    query, _ = self.wq_b(q_lora)
    query = query.view(n_tokens, self.n_heads, self.head_dim)
    key, _ = self.wk(x)
    key = self.k_norm(key)
    r = self.rope_head_dim
    # SGLang's CPU rope wants per-head shapes for both inputs: q [T, H, r], k [T, 1, r].
    q_rope, k_rope = self.rotary_emb(positions, query[..., :r].contiguous(), key[:, None, :r].contiguous())
    query = torch.cat([q_rope.view(n_tokens, self.n_heads, r).to(query.dtype), query[..., r:]], dim=-1)
    key = torch.cat([k_rope.view(n_tokens, r).to(key.dtype), key[..., r:]], dim=-1)
    query, key = hadamard_rotate(query), hadamard_rotate(key)

    q8, q_scale = act_quant(query, self.scale_fmt)          # [T, H, D], [T, H, 1]
    k8, k_scale = act_quant(key, self.scale_fmt)            # [T, D], [T, 1]
    pool = get_token_to_kv_pool()
    pages = IndexKeyPages(pool, self.head_dim)
    pages.write(layer_id, forward_batch.out_cache_loc, k8, k_scale)
    if not return_indices:
        return None

    w, _ = self.weights_proj(x)
    w = w.float() * self.n_heads ** -0.5 * q_scale.squeeze(-1) * self.softmax_scale   # [T, H]
    req_to_token = get_req_to_token_pool().req_to_token
    rows = forward_batch.req_pool_indices.tolist()
    qf = q8.float()
    handoff = _EarlyHandoff(forward_batch, layer_id, out, req_to_token)
    n_real = real_rows(forward_batch).n_req             # SGLang's padding rows keep top-k -1
    for i, t0, n_q, kv_len in _per_request_spans(forward_batch):
        if i >= n_real:
            break
        if n_q == 0 or kv_len == 0:
            continue
        locs = req_to_token[rows[i], :kv_len]
        kf, ks = pages.read(layer_id, locs)                      # [S, D], [S]
        scores = torch.einsum("thd,sd->ths", qf[t0:t0 + n_q], kf) * ks   # [n_q, H, S]
        logits = (scores.relu() * w[t0:t0 + n_q, :, None]).sum(dim=1)     # [n_q, S]
        q_pos = torch.arange(kv_len - n_q, kv_len, device=x.device)
        causal = torch.arange(kv_len, device=x.device)[None, :] <= q_pos[:, None]
        logits = logits.masked_fill(~causal, -math.inf)
        k_eff = min(topk, kv_len)
        vals, idx = logits.topk(k_eff, dim=-1)
        idx = idx.to(torch.int32).masked_fill(vals == -math.inf, -1)
        out[t0:t0 + n_q, :k_eff] = idx
        handoff.row_done(i)
    return out


class _EarlyHandoff:
    """Hands each finished slice of a decode batch's top-k to the ESS store (if the forward's
    attention backend has one: with Two-Batch Overlap, the micro-batch's own child backend), so
    the misses' fetch starts while the indexer still runs."""

    def __init__(self, forward_batch, layer_id, out, req_to_token):
        from sglang.srt.model_executor.forward_context import get_attn_backend

        self.parts = []
        backend = get_attn_backend()
        ess = getattr(backend, "ess", None)
        mode = forward_batch.forward_mode
        if ess is None or not mode.is_decode() or not getattr(backend, "accepts_early_plans", True):
            return
        self.ess, self.fb, self.layer, self.out, self.r2t = ess, forward_batch, layer_id, out, req_to_token
        self.parts = ess.early_parts(layer_id, real_rows(forward_batch).n_req)   # padding rows never planned
        self.base = getattr(backend, "micro_batch_base", 0)    # a TBO child's own ring groups

    def row_done(self, i: int) -> None:
        for p, part in enumerate(self.parts):
            if part.stop == i + 1:
                fb = self.fb
                self.ess.early_plan(id(fb), self.layer, fb.req_pool_indices[part].long(), fb.seq_lens[part],
                                    self.out[part], self.r2t, self.base + p)
