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

Learnable attention sinks (Hunyuan V4): SGLang's MLA forward hands ``attn_sink`` only to its
absorbed-core backends, never to this one, so the backend takes each layer's sink from the model
(``HYV4Attention.learnable_sink_param``, by its attention layer id) when it is built, and uses an
``attn_sink`` keyword when one is passed. Every path counts it: prefill and MTP verify in the one
attention, decode once after the DA / DBA merge (store_forward.StoreForward.attend_slots). Other
attention keyword arguments it does not implement raise (attention_kwargs.py).

Torch path (CPU). On CUDA this backend is not used with ESS off (SGLang's ``dsa`` backend
and kernels serve). With ESS on, the request lifecycle (open, warm, reserve, plan, land, commit,
verify) is store_forward.StoreForward, shared with the CUDA backend; this class supplies only
its torch kernels (``prefill``, ``slots``, ``gathered``, ``newest``).
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from sgl_ess.attention.reference import attend, with_sink

from ..pools.pool_adapter import EssPoolAdapter
from .attention_kwargs import ATTN_SINK, SINKS_IMPLEMENTED, refuse_unimplemented
from .query_layout import ROLE_TARGET, accepts_early_plans
from .store_forward import StoreForward, check_write_positions  # noqa: F401 - re-exported for tests


ACC_DTYPE = torch.float64


def sparse_mla(q: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, v_dim: int, scaling: float,
               sink: torch.Tensor | None = None) -> torch.Tensor:
    """Absorbed MLA over gathered latent rows (sgl_ess.attention.reference.attend, float64).

    q:     [T, H, D] latent query (D = R + P), any float dtype
    rows:  [T, k, D] gathered latent rows (same dtype as the cache)
    valid: [T, k] bool, False for -1 padding
    sink:  [H] learnable sink logits (Hunyuan V4) or None
    returns [T, H, v_dim] in q's dtype.
    """
    out, lse = attend(q, rows, valid, v_dim, scaling, ACC_DTYPE)
    out, _ = with_sink(out, lse, sink)
    return out.to(q.dtype)


def layer_sinks(model) -> dict:
    """{attention layer id: learnable sink parameter [H]} of every attention module of `model` that has
    one (SGLang's HYV4Attention.learnable_sink_param; its RadixAttention ``attn_mqa`` names the layer).
    Empty for models without sinks. A sink whose layer cannot be named raises: never dropped."""
    sinks = {}
    for name, mod in model.named_modules():
        sink = getattr(mod, "learnable_sink_param", None)
        if sink is None:
            continue
        layer_id = getattr(getattr(mod, "attn_mqa", None), "layer_id", None)
        if layer_id is None:
            raise NotImplementedError(f"{name} ({type(mod).__name__}) has learnable attention sinks but no attn_mqa "
                                      "layer id: the ess backend cannot tell which layer they belong to")
        sinks[int(layer_id)] = sink
    return sinks


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


class EssSparseAttnBackend(AttentionBackend):
    # Set by the EAGLE draft factory (eagle.py) on draft-runner backends.
    spec_role = ROLE_TARGET
    speculative_step_id = 0

    def __init__(self, model_runner, ess: Optional[EssPoolAdapter]):
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        cfg = model_runner.model_config
        self.kv_lora_rank = cfg.kv_lora_rank
        self.rope_dim = cfg.qk_rope_head_dim
        self.ess = ess
        self.forward_metadata = None
        self.micro_batch_base = 0        # 2 x the Two-Batch-Overlap child index (own ring groups)
        self._store_forward: Optional[StoreForward] = None
        model = getattr(model_runner, "model", None)
        # SGLang hands attn_sink only to absorbed-core backends, never to this one: read them from the model
        self.sinks = layer_sinks(model) if model is not None else {}

    @property
    def accepts_early_plans(self) -> bool:
        return accepts_early_plans(self)        # query_layout.py: not in an EAGLE draft step

    # --- SGLang backend protocol -------------------------------------------------------
    def init_forward_metadata(self, forward_batch):
        self.forward_metadata = None
        if self.ess is not None:
            self._forward.begin(forward_batch)
        rng = getattr(forward_batch, "tbo_parent_token_range", None)
        if rng is not None:             # a Two-Batch-Overlap child: child 0 holds the first tokens
            self.micro_batch_base = 0 if rng[0] == 0 else 2

    def get_indexer_metadata(self, layer_id, forward_batch):
        return None

    def get_cpu_graph_seq_len_fill_value(self):
        return 1                        # SGLang's padding rows (DP attention, TBO) get seq_len 1

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def support_triton(self):
        return False

    def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):
        return None                     # no tree mask or position buffers (chain drafts, topk 1)

    @property
    def _forward(self) -> StoreForward:
        if self._store_forward is None:
            self._store_forward = StoreForward(self.ess, self.req_to_token_pool, self, self,
                                               self.kv_lora_rank, self.rope_dim)
        return self._store_forward

    def sink(self, layer, kwargs: dict):
        """The layer's learnable sink logits [H] (an attn_sink argument, else the model's), or None."""
        sink = kwargs.get(ATTN_SINK)
        if sink is None and self.sinks:
            sink = self.sinks.get(layer.layer_id)
            if sink is None:
                raise NotImplementedError(f"ess backend: the model has learnable attention sinks on layers "
                                          f"{sorted(self.sinks)} but none for layer {layer.layer_id}")
        return sink

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, topk_indices=None, **kwargs):
        refuse_unimplemented(kwargs, "ess", SINKS_IMPLEMENTED)   # attention_kwargs.py: others raise, never dropped
        sink = self.sink(layer, kwargs)
        loc = forward_batch.out_cache_loc
        if self.ess is not None:
            self.ess.fence_host(layer.layer_id)    # released rows are zeroed before anything rewrites them
        if save_kv_cache and k is not None:
            self._save(layer, forward_batch, loc, k, v)
        if topk_indices is None:
            lay = self._forward.layout(forward_batch)
            topk_indices = dense_topk_positions(lay.kv_lens, lay.n_q, q.device)
            if topk_indices.shape[0] < q.shape[0]:      # DP padding tokens: nothing to attend
                pad = topk_indices.new_full((q.shape[0] - topk_indices.shape[0], topk_indices.shape[1]), -1)
                topk_indices = torch.cat([topk_indices, pad])
        if self.ess is not None:
            return self._forward.extend(q, layer, forward_batch, topk_indices, sink)
        lay = self._forward.layout(forward_batch)
        req_rows = forward_batch.req_pool_indices
        tok_req = torch.repeat_interleave(req_rows.long(), torch.tensor(lay.n_q, device=req_rows.device))
        if tok_req.numel() < q.shape[0]:    # DP padding tokens after the last request: read as row 0
            tok_req = torch.cat([tok_req, tok_req.new_zeros(q.shape[0] - tok_req.numel())])
        return self.prefill(q, layer, forward_batch, topk_indices, tok_req, None, sink)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, topk_indices=None, **kwargs):
        refuse_unimplemented(kwargs, "ess", SINKS_IMPLEMENTED)
        sink = self.sink(layer, kwargs)
        loc = forward_batch.out_cache_loc
        if self.ess is not None:
            self.ess.fence_host(layer.layer_id)
        if save_kv_cache and k is not None:
            self._save(layer, forward_batch, loc, k, v)
        if topk_indices is None:
            sl = forward_batch.seq_lens.tolist()
            topk_indices = dense_topk_positions(sl, [1] * len(sl), q.device)
        if self.ess is None:
            return self.prefill(q, layer, forward_batch, topk_indices, forward_batch.req_pool_indices.long(), None,
                                sink)
        return self._forward.decode(q, layer, forward_batch, topk_indices, sink)

    # --- kernels (store_forward.AttentionKernels): the torch path -----------------------------
    single_call = False

    def prefill(self, q, layer, forward_batch, topk_pos, tok_req, token_idx, sink=None):
        return self._attend(q, layer, topk_pos, tok_req, self._cache_rows(layer), sink)

    def slots(self, q3, layer, slot_rows, slots, sink=None):
        out, lse = self._attend_rows(q3, layer, slot_rows, slots)
        return with_sink(out, lse, sink)

    def gathered(self, q, layer, rows, valid, sink=None):
        return self._mla(q, layer, rows, valid, sink)

    def newest(self, layer, loc):
        """The newest row: exactly the bytes SGLang just stored in the host pool."""
        return self._cache_rows(layer)[loc.long()]

    # --- internals ---------------------------------------------------------------------
    def _save(self, layer, forward_batch, loc, k, v):
        # The DSA pool holds one packed latent row per token (nope ++ rope); k is that row.
        # With ESS on, the pool's latent buffers ARE the store's host pool (pool_adapter.py).
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        write = lambda: self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(loc, None), k, v)  # noqa: E731
        if self.ess is None:
            write()
        else:
            self._forward.save(layer, forward_batch, write)

    def _cache_rows(self, layer) -> torch.Tensor:
        """[tokens, R+P] view of this layer's latent rows (device pool, or host pool with ESS on)."""
        buf = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        return buf.view(buf.shape[0], -1)

    def _attend(self, q, layer, topk_pos, tok_req, cache_rows, sink=None):
        """topk_pos int [T, k] positions -> locations through req_to_token -> rows."""
        req_to_token = self.req_to_token_pool.req_to_token
        valid = topk_pos >= 0
        locs = req_to_token[tok_req[:, None], topk_pos.long().clamp(min=0)].long()
        rows = cache_rows[locs]
        return self._mla(q, layer, rows, valid, sink)

    def _attend_rows(self, q3, layer, slot_rows, slots):
        """q3 [b, H, D]; slot_rows uint8 [S, row_bytes] (the store's slot space); slots int32 [b, k]
        (-1 excluded) -> (out, lse) in float64."""
        rows = self.ess.as_latent(slot_rows)[slots.long().clamp(min=0)]
        return attend(q3, rows, slots >= 0, self.kv_lora_rank, layer.scaling, ACC_DTYPE)

    def _mla(self, q, layer, rows, valid, sink=None):
        d = self.kv_lora_rank + self.rope_dim
        q3 = q.reshape(-1, layer.tp_q_head_num, d)
        out = sparse_mla(q3, rows, valid, self.kv_lora_rank, layer.scaling, sink)
        return out.reshape(q3.shape[0], layer.tp_q_head_num * self.kv_lora_rank)
