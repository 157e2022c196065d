"""The ``ess`` attention backend: absorbed sparse MLA over each query's top-k latent rows.

Selected with ``--attention-backend ess`` (registered in SGLang's ``ATTENTION_BACKENDS``).
Inputs per layer (DeepSeek absorbed-MLA path, see cpu_fixes): q ``[T, H*(R+P)]`` (latent
query: R = kv_lora_rank, P = rope dims), k ``[T, 1, R+P]`` (the step's new latent rows),
v ``[T, 1, R]``, and ``topk_indices`` int32 ``[T, k]`` of token positions from the indexer
(-1 padded). Output ``[T, H*R]``.

Where rows are read from:
  ESS off  SGLang's own device pool (``DSATokenToKVPool.kv_buffer``), via ``req_to_token``.
  ESS on   extend: the host pool (full history); decode: hits from the request's hot buffer,
           misses from the staging ring they are fetched into (``EssPoolAdapter.decode``: the
           fetch was submitted right after the indexer and hides behind compute per
           ``prefetch_overlap_level``).
The math is the same gather + softmax on the same bytes in the same order (float64
accumulation, so DA's log-sum-exp merge rounds to the same bf16 output), so ESS on and off
produce identical outputs.

Torch path (CPU). On CUDA this backend is not used with ESS off (SGLang's ``dsa`` backend
and kernels serve).
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from sgl_ess.attention.reference import attend

from .pool_adapter import EssPoolAdapter
from .speculative import ROLE_DRAFT_DECODE, ROLE_TARGET, QueryLayout, num_draft_tokens, query_layout


ACC_DTYPE = torch.float64


def sparse_mla(q: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, v_dim: int, scaling: float) -> torch.Tensor:
    """Absorbed MLA over gathered latent rows (sgl_ess.attention.reference.attend, float64).

    q:     [T, H, D] latent query (D = R + P), any float dtype
    rows:  [T, k, D] gathered latent rows (same dtype as the cache)
    valid: [T, k] bool, False for -1 padding
    returns [T, H, v_dim] in q's dtype.
    """
    out, _ = attend(q, rows, valid, v_dim, scaling, ACC_DTYPE)
    return out.to(q.dtype)


def dense_topk_positions(seq_lens: list[int], n_q: list[int], device) -> torch.Tensor:
    """Fallback top-k when a layer gives none: every causal position (used only if k >= seq).

    Query j of a request with seq_len s and n queries sits at position s - n + j and sees
    positions 0..s-n+j; returns int32 [sum(n_q), max(seq_lens)], -1 padded."""
    width = max(seq_lens) if seq_lens else 0
    s = torch.tensor(seq_lens, dtype=torch.int64)
    n = torch.tensor(n_q, dtype=torch.int64)
    first = torch.repeat_interleave(s - n, n)                       # position of each request's first query
    offset = torch.arange(int(n.sum())) - torch.repeat_interleave(torch.cumsum(n, 0) - n, n)
    query_pos = (first + offset).to(device)
    pos = torch.arange(width, device=device)
    return torch.where(pos[None, :] <= query_pos[:, None], pos[None, :], -1).to(torch.int32)


def check_write_positions(loc: torch.Tensor, reqs: torch.Tensor, first_pos: torch.Tensor, n: int,
                          req_to_token: torch.Tensor, what: str) -> None:
    """The rows a forward writes (out_cache_loc, [b*n]) must be the locations of positions
    first_pos .. first_pos + n - 1 of each request: otherwise the tokens being computed and the
    cache indices the store reads are out of step (host sync: run once per forward)."""
    pos = first_pos.to(torch.int64).reshape(-1, 1) + torch.arange(n, device=first_pos.device)
    expect = req_to_token[reqs.reshape(-1, 1), pos.clamp(min=0)].reshape(-1).to(torch.int64)
    got = loc.reshape(-1).to(torch.int64)
    if got.shape != expect.shape or not torch.equal(got, expect):
        raise RuntimeError(
            f"ESS {what}: the forward writes token locations {got.tolist()[:8]} but positions "
            f"{pos.reshape(-1).tolist()[:8]} of requests {reqs.tolist()[:8]} map to {expect.tolist()[:8]}: the "
            "speculative tokens and the cache indices are out of step; refusing to read the wrong rows")


class EssSparseAttnBackend(AttentionBackend):
    # Set by the EAGLE draft factory (speculative.py) on draft-runner backends.
    spec_role = ROLE_TARGET
    speculative_step_id = 0

    def __init__(self, model_runner, store: Optional[EssPoolAdapter]):
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        cfg = model_runner.model_config
        self.kv_lora_rank = cfg.kv_lora_rank
        self.rope_dim = cfg.qk_rope_head_dim
        self.store = store
        self.forward_metadata = None
        self.micro_batch_base = 0        # 2 x the Two-Batch-Overlap child index (own ring groups)

    @property
    def accepts_early_plans(self) -> bool:
        """The indexer may hand over a decode top-k early only where decode admits the newest
        row: not in an EAGLE draft step, whose newest row is speculative."""
        return self.spec_role != ROLE_DRAFT_DECODE

    # --- SGLang backend protocol -------------------------------------------------------
    def init_forward_metadata(self, forward_batch):
        self.forward_metadata = None
        rng = getattr(forward_batch, "tbo_parent_token_range", None)
        if rng is not None:             # a Two-Batch-Overlap child: child 0 holds the first tokens
            self.micro_batch_base = 0 if rng[0] == 0 else 2

    def get_indexer_metadata(self, layer_id, forward_batch):
        return None

    def support_triton(self):
        return False

    def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):
        return None                     # no tree mask or position buffers (chain drafts, topk 1)

    def _layout(self, forward_batch) -> QueryLayout:
        meta = self.forward_metadata
        if meta is None or meta[0] is not forward_batch:
            meta = (forward_batch, query_layout(forward_batch))
            self.forward_metadata = meta
        return meta[1]

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, topk_indices=None, **kwargs):
        loc = forward_batch.out_cache_loc
        if self.store is not None:
            self.store.fence_host()
        if save_kv_cache and k is not None:
            self._save(layer, loc, k, v)
        lay = self._layout(forward_batch)
        if topk_indices is None:
            topk_indices = dense_topk_positions(lay.kv_lens, lay.n_q, q.device)
        mode = forward_batch.forward_mode
        if self.store is not None and (mode.is_target_verify() or mode.is_draft_extend_v2()):
            return self._speculative(q, layer, forward_batch, topk_indices, lay)
        if self.store is not None and any(self._riding(forward_batch, lay)):
            return self._mixed(q, layer, forward_batch, topk_indices, lay)
        req_rows = forward_batch.req_pool_indices
        tok_req = torch.repeat_interleave(req_rows.long(), torch.tensor(lay.n_q, device=req_rows.device))
        out = self._attend(q, layer, topk_indices, tok_req, self._cache_rows(layer))
        if self.store is not None:
            self._after_prefill(layer, req_rows.tolist(), lay.kv_lens, lay.n_q, topk_indices)
        return out

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, topk_indices=None, **kwargs):
        loc = forward_batch.out_cache_loc
        if self.store is not None:
            self.store.fence_host()           # released rows are zeroed before anything rewrites them
        if save_kv_cache and k is not None:
            self._save(layer, loc, k, v)
        seq_lens = forward_batch.seq_lens
        if topk_indices is None:
            sl = seq_lens.tolist()
            topk_indices = dense_topk_positions(sl, [1] * len(sl), q.device)
        req_rows = forward_batch.req_pool_indices.long()
        if self.store is None:
            return self._attend(q, layer, topk_indices, req_rows, self._cache_rows(layer))
        d = self.kv_lora_rank + self.rope_dim
        q3 = q.reshape(-1, layer.tp_q_head_num, d)
        attend = lambda qq, rows, slots: self._attend_rows(qq, layer, rows, slots)  # noqa: E731
        if self.spec_role == ROLE_DRAFT_DECODE:
            if layer.layer_id == 0:     # step i writes its (speculative) row at position seq_len + i
                check_write_positions(loc, req_rows, seq_lens + self.speculative_step_id, 1,
                                      self.req_to_token_pool.req_to_token, "EAGLE draft decode step")
            out = self.store.decode_committed(layer.layer_id, q3, req_rows, seq_lens, topk_indices,
                                              self.req_to_token_pool.req_to_token, attend,
                                              max_admit=num_draft_tokens(forward_batch),
                                              micro_batch_base=self.micro_batch_base)
            return out.to(q.dtype).reshape(q3.shape[0], layer.tp_q_head_num * self.kv_lora_rank)
        if layer.layer_id == 0:         # the newest row decode admits is the one just written
            check_write_positions(loc, req_rows, seq_lens - 1, 1, self.req_to_token_pool.req_to_token, "decode")
        if self.micro_batch_base and not self.store.early_parts(layer.layer_id, req_rows.numel()):
            # a TBO child at level none (no indexer hand-off): plan now, in this child's ring groups
            self.store.early_plan(id(forward_batch), layer.layer_id, req_rows, seq_lens, topk_indices,
                                  self.req_to_token_pool.req_to_token, self.micro_batch_base)
        # the newest row: exactly the bytes SGLang just stored in the host pool
        newest = self._cache_rows(layer)[loc.long()]
        out = self.store.decode(id(forward_batch), layer.layer_id, q3, req_rows, seq_lens, topk_indices, newest,
                                self.req_to_token_pool.req_to_token, attend)
        return out.to(q.dtype).reshape(q3.shape[0], layer.tp_q_head_num * self.kv_lora_rank)

    # --- ESS on: speculative forwards, mixed batches, prefill bookkeeping ---------------------
    def _speculative(self, q, layer, forward_batch, topk, lay: QueryLayout):
        """TARGET_VERIFY / DRAFT_EXTEND_V2: each request's n query tokens sit at committed ..
        committed + n - 1 (their rows were just written); one union set per request."""
        n = lay.n_q[0] if lay.n_q else 0
        if any(x != n for x in lay.n_q):
            raise ValueError(f"{forward_batch.forward_mode.name}: expected the same number of query tokens per "
                             f"request (num_draft_tokens), got {lay.n_q}")
        reqs = forward_batch.req_pool_indices.long()
        committed = torch.tensor(lay.committed, dtype=torch.int64, device=reqs.device)
        r2t = self.req_to_token_pool.req_to_token
        if layer.layer_id == 0:
            check_write_positions(forward_batch.out_cache_loc, reqs, committed, n, r2t,
                                  forward_batch.forward_mode.name)
        topk3 = topk.reshape(reqs.numel(), n, topk.shape[-1])
        return self.store.verify(layer.layer_id, reqs, committed, topk3, r2t,
                                 lambda rows, valid: self._mla(q, layer, rows, valid),
                                 micro_batch=self.micro_batch_base)

    def _riding(self, forward_batch, lay: QueryLayout) -> list[bool]:
        """Per request of an extend batch: a running request riding in a mixed chunked-prefill
        batch (one query token, hot buffer open). SGLang hands such batches to the backend as
        EXTEND (or MIXED) with the running requests after the prefill rows."""
        if forward_batch.forward_mode.is_target_verify() or forward_batch.forward_mode.is_draft_extend_v2():
            return []
        rows = forward_batch.req_pool_indices.tolist()
        return [n == 1 and self.store.is_open(r) for n, r in zip(lay.n_q, rows)]

    def _mixed(self, q, layer, forward_batch, topk, lay: QueryLayout):
        """A mixed chunked-prefill batch: prefill rows read the host pool and (re)open their hot
        buffers; running requests riding along take the decode path, so their hot buffers and hit
        rate are those of a pure decode step. (A last prefill chunk of one token also takes it:
        exact as well, it just keeps the previous chunk's warm-up.)"""
        rows = forward_batch.req_pool_indices.tolist()
        dec = self._riding(forward_batch, lay)
        first = [sum(lay.n_q[:i]) for i in range(len(rows))]
        tok_req = torch.repeat_interleave(forward_batch.req_pool_indices.long(), torch.tensor(lay.n_q))
        out = q.new_empty(q.shape[0], layer.tp_q_head_num * self.kv_lora_rank)
        pre_tok = torch.tensor([t for i, f in enumerate(first) if not dec[i] for t in range(f, f + lay.n_q[i])],
                               dtype=torch.int64)
        dec_idx = [i for i in range(len(rows)) if dec[i]]
        if pre_tok.numel():
            out[pre_tok] = self._attend(q[pre_tok], layer, topk[pre_tok], tok_req[pre_tok], self._cache_rows(layer))
        if dec_idx:
            if layer.layer_id == 0:
                self.store.note_mixed_decode(len(dec_idx))
            tok = torch.tensor([first[i] for i in dec_idx], dtype=torch.int64)
            reqs = torch.tensor([rows[i] for i in dec_idx], dtype=torch.int64)
            seq_lens = torch.tensor([lay.kv_lens[i] for i in dec_idx], dtype=torch.int64)
            loc = forward_batch.out_cache_loc[tok]
            if layer.layer_id == 0:
                check_write_positions(loc, reqs, seq_lens - 1, 1, self.req_to_token_pool.req_to_token, "mixed decode")
            d = self.kv_lora_rank + self.rope_dim
            q3 = q[tok].reshape(-1, layer.tp_q_head_num, d)
            newest = self._cache_rows(layer)[loc.long()]
            o = self.store.decode(id(forward_batch), layer.layer_id, q3, reqs, seq_lens, topk[tok], newest,
                                  self.req_to_token_pool.req_to_token,
                                  lambda qq, r, s: self._attend_rows(qq, layer, r, s))
            out[tok] = o.to(q.dtype).reshape(q3.shape[0], -1)
        pre = [i for i in range(len(rows)) if not dec[i]]
        if pre:
            keep = torch.cat([torch.arange(first[i], first[i] + lay.n_q[i]) for i in pre])
            self._after_prefill(layer, [rows[i] for i in pre], [lay.kv_lens[i] for i in pre],
                                [lay.n_q[i] for i in pre], topk[keep])
        return out

    def _after_prefill(self, layer, rows, seq_lens, n_q, topk):
        self.store.after_extend(layer.layer_id, rows, seq_lens, n_q, topk, self.req_to_token_pool.req_to_token)
        self.store.spec_reset(layer.layer_id, rows, seq_lens)

    # --- internals ---------------------------------------------------------------------
    def _save(self, layer, loc, k, v):
        # The DSA pool holds one packed latent row per token (nope ++ rope); k is that row.
        # With ESS on, the pool's latent buffers ARE the store's host pool (pool_adapter.py).
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(loc, None), k, v)

    def _cache_rows(self, layer) -> torch.Tensor:
        """[tokens, R+P] view of this layer's latent rows (device pool, or host pool with ESS on)."""
        buf = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        return buf.view(buf.shape[0], -1)

    def _attend(self, q, layer, topk_pos, tok_req, cache_rows):
        """topk_pos int [T, k] positions -> locations through req_to_token -> rows."""
        req_to_token = self.req_to_token_pool.req_to_token
        valid = topk_pos >= 0
        locs = req_to_token[tok_req[:, None], topk_pos.long().clamp(min=0)].long()
        rows = cache_rows[locs]
        return self._mla(q, layer, rows, valid)

    def _attend_rows(self, q3, layer, slot_rows, slots):
        """q3 [b, H, D]; slot_rows uint8 [S, row_bytes] (the store's slot space); slots int32 [b, k]
        (-1 excluded) -> (out, lse) in float64."""
        rows = self.store.as_latent(slot_rows)[slots.long().clamp(min=0)]
        return attend(q3, rows, slots >= 0, self.kv_lora_rank, layer.scaling, ACC_DTYPE)

    def _mla(self, q, layer, rows, valid):
        d = self.kv_lora_rank + self.rope_dim
        q3 = q.reshape(-1, layer.tp_q_head_num, d)
        out = sparse_mla(q3, rows, valid, self.kv_lora_rank, layer.scaling)
        return out.reshape(q3.shape[0], layer.tp_q_head_num * self.kv_lora_rank)
