"""One request lifecycle through the ESS store, for every forward mode, on every device.

Both SGLang backends that serve ESS call this one class from the same seams: the CPU ``ess``
backend (ess_backend.py) and the CUDA subclass of SGLang's DSA backend (cuda_backend.py). What
differs by device is only the ``AttentionKernels`` they hand in (torch gathers on CPU; SGLang's
FlashMLA / our Triton decode on CUDA); opening, warming, reserving, planning, landing, committing,
verifying and closing hot buffers happen here, once.

  extend (prefill chunk)   attention over the full history (kernels.prefill), then the request's
                           hot buffers are (re)opened at layer 0 and warmed from the chunk's last
                           W top-k sets (``EssPoolAdapter.after_extend``), MTP admission state reset
  mixed chunked prefill    prefill rows as above; running requests riding along (one query, hot
                           buffer open) take the decode path, so their hot buffers stay
  target verify /          one union set per request through the hot buffer and ring
  draft extend v2          (``EssPoolAdapter.verify``)
  decode                   reserve the newest row, plan, land, attend over the slot space, commit
                           (``EssPoolAdapter.decode``); an EAGLE draft step reads committed rows only
SGLang's padding rows (DP attention, TBO children, an idle DP rank's fabricated extend: padding.py)
never reach the store: they are cut off before it is called and their outputs are zero. A graph's
batch (--ess-cuda-graph, cuda_graph.py: target decode and MTP TARGET_VERIFY, each also per TBO child, EAGLE
draft decode steps) is
not cut on the host: its padding rows go to the store as request row -1, found on the device, and
touch nothing.
Learnable attention sinks (Hunyuan V4, `sink` float [H] per layer, None for other models) reach every
path: the prefill and MTP kernels get them (``sink=``); a decode's partial attentions (DA / DBA) run
without them and the sink is added once after their log-sum-exp merge (``overlap.SinkAttend``), unless the
kernel is single-call (FlashMLA: it takes the sink itself).
The store's own fence (``fence_host``) runs before any forward writes a row. Memory: none of its
own; tensors belong to SGLang's pools and the store. No sglang import: forward batches are read
through their attributes.
"""

from __future__ import annotations

from typing import Protocol

import torch

from sgl_ess.attention.overlap import SinkAttend

from .cuda_graph import GraphBatches, graph_draft, graph_rows, graph_verify
from .padding import real_rows
from .query_layout import ROLE_DRAFT_DECODE, ROLE_TARGET, QueryLayout, num_draft_tokens, query_layout


class AttentionKernels(Protocol):
    """The device part of a backend. Shapes: T query tokens, H heads, D = R + P latent width."""

    single_call: bool   # `slots` must see the whole batch in one call and returns no log-sum-exp

    def prefill(self, q, layer, forward_batch, topk_pos: torch.Tensor, tok_req: torch.Tensor,
                token_idx: torch.Tensor | None, sink: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of prefill queries over the full history. q [T', H*D] (the rows `token_idx`
        of the batch, None = all); topk_pos int [T', k] positions (-1 padded); tok_req int64 [T']
        request rows; sink float [H] learnable sink logits or None. Returns [T', H*R]."""

    def slots(self, q3, layer, slot_rows: torch.Tensor, slots: torch.Tensor, sink: torch.Tensor | None = None):
        """q3 [b, H, D]; slot_rows uint8 [S, row_bytes]; slots int32 [b, k] (-1 excluded) ->
        (out [b, H, R], lse [b, H] or None). `sink` (given only to a single-call kernel): out includes it."""

    def gathered(self, q, layer, rows: torch.Tensor, valid: torch.Tensor,
                 sink: torch.Tensor | None = None) -> torch.Tensor:
        """MLA over gathered latent rows: rows [T, k, D], valid [T, k], sink as in prefill -> [T, H*R].
        Kernels that have ``verify_slots(q, layer, slot_rows, slots int32 [T, k], sink=None) -> [T, H*R]``
        instead (a sparse kernel over the slot space: CUDA) get the union as a slot table
        (store/verify_slots.py) and no gathered rows."""

    def newest(self, layer, loc: torch.Tensor) -> torch.Tensor:
        """The latent rows SGLang just stored at locations `loc` [b] -> [b, D] (cache dtype)."""


def check_write_positions(loc: torch.Tensor, reqs: torch.Tensor, first_pos: torch.Tensor, n: int,
                          req_to_token: torch.Tensor, what: str, sync: bool = True, padded: bool = False) -> None:
    """The rows a forward writes (out_cache_loc, [b*n]) must be the locations of positions
    first_pos .. first_pos + n - 1 of each request: otherwise the tokens being computed and the
    cache indices the store reads are out of step. `sync` (the CPU, once per forward): read back and
    raise with the values; else (CUDA) a device-side assertion, so the host never waits for it (a
    failure ends the process with a CUDA device-side assert naming this check). `padded`: requests
    -1 (padding rows) are not checked."""
    pos = first_pos.to(torch.int64).reshape(-1, 1) + torch.arange(n, device=first_pos.device)
    rows = reqs.reshape(-1, 1).clamp(min=0) if padded else reqs.reshape(-1, 1)
    expect = req_to_token[rows, pos.clamp(min=0)].reshape(-1).to(torch.int64)
    got = loc.reshape(-1).to(torch.int64)
    if got.shape != expect.shape:
        raise RuntimeError(f"ESS {what}: the forward writes {got.numel()} token locations for {reqs.numel()} "
                           f"requests x {n} positions; refusing to read the wrong rows")
    same = got == expect
    if padded:
        same = same | (reqs.reshape(-1, 1) < 0).expand(-1, n).reshape(-1)
    if not sync:
        torch._assert_async(torch.all(same), f"ESS {what}: the tokens being computed and the cache "
                            "indices the store reads are out of step; refusing to read the wrong rows")
        return
    if not bool(same.all()):
        raise RuntimeError(
            f"ESS {what}: the forward writes token locations {got.tolist()[:8]} but positions "
            f"{pos.reshape(-1).tolist()[:8]} of requests {reqs.tolist()[:8]} map to {expect.tolist()[:8]}: the "
            "speculative tokens and the cache indices are out of step; refusing to read the wrong rows")


class StoreForward:
    """The lifecycle of one backend instance. `backend` carries the per-instance roles SGLang's
    factories set after construction: ``spec_role``, ``speculative_step_id``, ``micro_batch_base``."""

    def __init__(self, ess, req_to_token_pool, kernels: AttentionKernels, backend, kv_lora_rank: int,
                 rope_dim: int):
        self.ess = ess
        self.req_to_token_pool = req_to_token_pool
        self.kernels = kernels
        self.backend = backend
        self.kv_lora_rank = kv_lora_rank
        self.rope_dim = rope_dim
        self._layout_of = None
        self._riding_of = None
        self._rows_of = None                    # (forward batch, its request rows as a host list)
        self._tok_req_of = None                 # (forward batch, a prefill's request row per token)
        self.graph_batches = GraphBatches()     # SGLang's decode-graph capture batches (cuda_graph.py)

    @property
    def r2t(self) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token

    def begin(self, forward_batch) -> None:
        """A new forward batch (both backends' init_forward_metadata): drop the per-batch caches and
        open the hot buffers of rows that start running in it (a PD decode node's transferred
        requests, pool_adapter.open_pending)."""
        self._layout_of = self._riding_of = self._rows_of = self._tok_req_of = None
        self.ess.end_capture()                   # an eager forward: a decode graph's capture is over
        if self.ess.has_pending():
            n = real_rows(forward_batch).n_req
            self.ess.open_pending(self.host_rows(forward_batch)[:n])

    def save(self, layer, forward_batch, write) -> None:
        """SGLang's KV write of this forward's latent rows (`write()`: the backend's own call into
        the pool), the same on every device. With a host pool the node's attention-TP ranks share
        (pools/shared_host_pool.py, ``ess_share`` on the pool) only its owner writes; a reader waits
        until the owner's rows of this layer are there. Every rank folds what the forward writes into
        its lockstep digest at layer 0. The caller has fenced the layer (``fence_host``) first."""
        share = getattr(self.backend.token_to_kv_pool, "ess_share", None)
        if share is not None:
            if layer.layer_id == 0:
                share.check_lockstep(forward_batch.out_cache_loc, forward_batch.req_pool_indices,
                                     forward_batch.seq_lens)
            if not share.writer:
                share.before_read(layer.layer_id)
                return
        write()
        if share is not None:
            share.after_write(layer.layer_id)
        if forward_batch not in self.graph_batches:     # a graph's writes are counted per replay
            self.ess.note_host_write(layer.layer_id, real_rows(forward_batch).n_tok)   # padding rows not counted

    def layout(self, forward_batch) -> QueryLayout:
        cached = self._layout_of
        if cached is None or cached[0] is not forward_batch:
            cached = (forward_batch, query_layout(forward_batch))
            self._layout_of = cached
        return cached[1]

    def host_rows(self, forward_batch) -> list[int]:
        """The batch's request rows (``req_pool_indices``, padding rows included) as a host list: one
        device read per forward batch (the eager extend paths), reused by every layer."""
        cached = self._rows_of
        if cached is None or cached[0] is not forward_batch:
            cached = (forward_batch, forward_batch.req_pool_indices.tolist())
            self._rows_of = cached
        return cached[1]

    def tok_req(self, forward_batch, lay: QueryLayout, n_tokens: int) -> torch.Tensor:
        """int64 [n_tokens] on the batch's device: each prefill token's request row (DP padding tokens after
        the last request read as row 0). Built once per forward batch, with its size known on the host (no
        read-back of repeat_interleave's output size), reused by every layer; the kernels only read it."""
        cached = self._tok_req_of
        if cached is not None and cached[0] is forward_batch:
            return cached[1]
        reqs = forward_batch.req_pool_indices
        tok_req = torch.repeat_interleave(reqs.long(), torch.tensor(lay.n_q, device=reqs.device),
                                          output_size=sum(lay.n_q))
        if tok_req.numel() < n_tokens:    # DP padding tokens after the last request: read as row 0
            tok_req = torch.cat([tok_req, tok_req.new_zeros(n_tokens - tok_req.numel())])
        self._tok_req_of = (forward_batch, tok_req)
        return tok_req

    # --- extend ------------------------------------------------------------------------------
    def attend_slots(self, layer, sink):
        """The decode `attend(q3, slot_rows, slots)` of `layer` over the slot space: a single-call kernel
        takes the sink itself; otherwise the partial attentions run without it and the overlap schedule adds
        it once after their merge (SinkAttend)."""
        k = self.kernels
        if sink is None:
            return lambda qq, rows, slots: k.slots(qq, layer, rows, slots)
        if k.single_call:
            return lambda qq, rows, slots: k.slots(qq, layer, rows, slots, sink=sink)
        return SinkAttend(lambda qq, rows, slots: k.slots(qq, layer, rows, slots), sink)

    def extend(self, q, layer, forward_batch, topk: torch.Tensor, sink: torch.Tensor | None = None) -> torch.Tensor:
        """Any EXTEND-family forward. q [T, H*D]; topk int [T, k] positions; sink float [H] (the layer's
        learnable sink logits) or None. Returns [T, H*R]."""
        if forward_batch in self.graph_batches:      # before any host read: a capture would refuse it
            return self._extend_graph(q, layer, forward_batch, topk, sink)
        lay = self.layout(forward_batch)
        real = real_rows(forward_batch)
        mode = forward_batch.forward_mode
        if mode.is_target_verify() or mode.is_draft_extend_v2():
            return self.verify(q, layer, forward_batch, topk, lay, sink)
        if any(self.riding(forward_batch, lay)):
            return self.mixed(q, layer, forward_batch, topk, lay, sink)
        tok_req = self.tok_req(forward_batch, lay, q.shape[0])
        out = self.kernels.prefill(q, layer, forward_batch, topk, tok_req, None, **_sink(sink))
        if real.padded:
            out[real.n_tok:] = 0
        n = real.n_req
        if n:
            self.after_prefill(layer, self.host_rows(forward_batch)[:n], lay.kv_lens[:n], lay.n_q[:n],
                               topk[:real.n_tok])
        return out

    def _extend_graph(self, q, layer, forward_batch, topk, sink=None) -> torch.Tensor:
        """An EXTEND-family step SGLang captures in a CUDA graph: only the target's TARGET_VERIFY (SGLang's
        decode graph runner in capture mode TARGET_VERIFY) is held, by cuda_graph.graph_verify: the whole
        padded batch, or a Two-Batch-Overlap child's micro-batch (its requests' rows of the padded batch and
        their draft tokens, SGLang's split at bs // 2 requests), planned in the child's ring groups."""
        mode = forward_batch.forward_mode
        b = self.backend
        if mode.is_target_verify() and b.spec_role == ROLE_TARGET:
            return graph_verify(self, q, layer, forward_batch, topk, sink)
        raise RuntimeError(f"ESS CUDA graphs: SGLang captures a {mode.name} step of the {b.spec_role} "
                           f"backend{' (a TBO child)' if getattr(b, 'tbo_child', False) else ''}, which ESS does not "
                           "hold (captured: target decode and MTP TARGET_VERIFY, with or without TBO, EAGLE draft "
                           "decode steps; not the draft extend); drop --ess-cuda-graph to run eager")

    def verify(self, q, layer, forward_batch, topk, lay: QueryLayout, sink=None):
        """TARGET_VERIFY / DRAFT_EXTEND_V2: each request's n query tokens sit at committed ..
        committed + n - 1 (their rows were just written); one union set per request."""
        n = lay.n_q[0] if lay.n_q else 0
        if any(x != n for x in lay.n_q):
            raise ValueError(f"{forward_batch.forward_mode.name}: expected the same number of query tokens per "
                             f"request (num_draft_tokens), got {lay.n_q}")
        real = real_rows(forward_batch)
        b = real.n_req
        reqs = forward_batch.req_pool_indices.long()[:b]
        committed = torch.tensor(lay.committed[:b], dtype=torch.int64, device=reqs.device)
        if layer.layer_id == 0:
            check_write_positions(forward_batch.out_cache_loc[:b * n], reqs, committed, n, self.r2t,
                                  forward_batch.forward_mode.name, sync=self.ess.validate)
        if not real.padded:
            return self._verify(q, layer, reqs, committed, topk.reshape(b, n, topk.shape[-1]), sink)
        out = q.new_zeros(q.shape[0], layer.tp_q_head_num * self.kv_lora_rank)
        if b:
            out[:b * n] = self._verify(q[:b * n], layer, reqs, committed, topk[:b * n].reshape(b, n, -1), sink)
        return out

    def _verify(self, q, layer, reqs, committed, topk3, sink):
        """The store's verify with the kernels' attention: by slot over the slot space when they have
        one (``verify_slots``: CUDA, SGLang's sparse kernels), else over gathered rows (CPU)."""
        by_slot = getattr(self.kernels, "verify_slots", None)
        if by_slot is not None:
            return self.ess.verify(layer.layer_id, reqs, committed, topk3, self.r2t, None,
                                   micro_batch=self.backend.micro_batch_base,
                                   attend_slots=lambda rows, slots: by_slot(q, layer, rows, slots, **_sink(sink)))
        return self.ess.verify(layer.layer_id, reqs, committed, topk3, self.r2t,
                               lambda rows, valid: self.kernels.gathered(q, layer, rows, valid, **_sink(sink)),
                               micro_batch=self.backend.micro_batch_base)

    def riding(self, forward_batch, lay: QueryLayout) -> list[bool]:
        """Per request of an extend batch: a running request riding in a mixed chunked-prefill
        batch (one query token, hot buffer open). SGLang hands such batches to the backend as
        EXTEND (or MIXED) with the running requests after the prefill rows. Decided once per
        forward batch (a host read of its request rows), reused by every layer."""
        if forward_batch.forward_mode.is_target_verify() or forward_batch.forward_mode.is_draft_extend_v2():
            return []
        cached = self._riding_of
        if cached is not None and cached[0] is forward_batch:
            return cached[1]
        rows = self.host_rows(forward_batch)
        n_real = real_rows(forward_batch).n_req      # a padding row points at row 0, maybe a live request's
        out = [i < n_real and n == 1 and self.ess.is_open(r) for i, (n, r) in enumerate(zip(lay.n_q, rows))]
        self._riding_of = (forward_batch, out)
        return out

    def mixed(self, q, layer, forward_batch, topk, lay: QueryLayout, sink=None):
        """A mixed chunked-prefill batch: prefill rows read the full history and (re)open their hot
        buffers; running requests riding along take the decode path, so their hot buffers and hit
        rate are those of a pure decode step."""
        rows = self.host_rows(forward_batch)
        dec = self.riding(forward_batch, lay)
        first = [sum(lay.n_q[:i]) for i in range(len(rows))]
        tok_req = self.tok_req(forward_batch, lay, q.shape[0])
        out = q.new_zeros(q.shape[0], layer.tp_q_head_num * self.kv_lora_rank)
        pre_tok = torch.tensor([t for i, f in enumerate(first) if not dec[i] for t in range(f, f + lay.n_q[i])],
                               dtype=torch.int64)
        dec_idx = [i for i in range(len(rows)) if dec[i]]
        if pre_tok.numel():
            out[pre_tok] = self.kernels.prefill(q[pre_tok], layer, forward_batch, topk[pre_tok], tok_req[pre_tok],
                                                pre_tok, **_sink(sink))
        if dec_idx:
            if layer.layer_id == 0:
                self.ess.note_mixed_decode(len(dec_idx))
            tok = torch.tensor([first[i] for i in dec_idx], dtype=torch.int64)
            reqs = torch.tensor([rows[i] for i in dec_idx], dtype=torch.int64)
            seq_lens = torch.tensor([lay.kv_lens[i] for i in dec_idx], dtype=torch.int64)
            loc = forward_batch.out_cache_loc[tok]
            if layer.layer_id == 0:
                check_write_positions(loc, reqs, seq_lens - 1, 1, self.r2t, "mixed decode", sync=self.ess.validate)
            q3 = q[tok].reshape(-1, layer.tp_q_head_num, self.kv_lora_rank + self.rope_dim)
            o = self.ess.decode(id(forward_batch), layer.layer_id, q3, reqs, seq_lens, topk[tok],
                                self.kernels.newest(layer, loc), self.r2t, self.attend_slots(layer, sink),
                                single_call=self.kernels.single_call)
            out[tok] = o.to(q.dtype).reshape(q3.shape[0], -1)
        pre = [i for i in range(real_rows(forward_batch).n_req) if not dec[i]]
        if pre:
            keep = torch.cat([torch.arange(first[i], first[i] + lay.n_q[i]) for i in pre])
            self.after_prefill(layer, [rows[i] for i in pre], [lay.kv_lens[i] for i in pre],
                               [lay.n_q[i] for i in pre], topk[keep])
        return out

    def after_prefill(self, layer, rows, seq_lens, n_q, topk):
        self.ess.after_extend(layer.layer_id, rows, seq_lens, n_q, topk, self.r2t)
        self.ess.mtp_reset(layer.layer_id, rows, seq_lens)

    # --- decode ------------------------------------------------------------------------------
    def decode(self, q, layer, forward_batch, topk: torch.Tensor, sink: torch.Tensor | None = None) -> torch.Tensor:
        """A DECODE forward (also an EAGLE draft step). q [b, H*D]; topk int [b, k]; sink as in extend.
        Returns [b, H*R] in q's dtype (zero for SGLang's padding rows)."""
        if forward_batch in self.graph_batches:
            return self._decode_graph(q, layer, forward_batch, topk, sink)
        real = real_rows(forward_batch)
        if not real.padded:
            return self._decode(q, layer, forward_batch, topk, q.shape[0], sink=sink)
        out = q.new_zeros(q.shape[0], layer.tp_q_head_num * self.kv_lora_rank)
        if real.n_req:
            out[:real.n_req] = self._decode(q[:real.n_req], layer, forward_batch, topk[:real.n_req], real.n_req,
                                            sink=sink)
        return out

    def _decode_graph(self, q, layer, forward_batch, topk, sink=None) -> torch.Tensor:
        """A decode step SGLang captures in a CUDA graph: the whole padded batch, padding rows -1
        (found on the device), the same launches whatever the batch holds; their outputs zero. A
        Two-Batch-Overlap child's batch is its micro-batch's rows of the padded batch (SGLang's slices
        of the graph's static buffers), planned in the child's own ring groups (``micro_batch_base``).
        An EAGLE draft step (SGLang's draft graph runner: every step of the multi-step draft forward in
        one graph) goes through cuda_graph.graph_draft."""
        b = self.backend
        if b.spec_role == ROLE_DRAFT_DECODE:
            return graph_draft(self, q, layer, forward_batch, topk, sink)
        if b.spec_role != ROLE_TARGET:
            raise RuntimeError(f"ESS decode CUDA graphs: a decode step of the {b.spec_role} backend is not captured "
                               "(captured: the target model's decode, its TBO children, the EAGLE draft steps)")
        reqs = graph_rows(forward_batch)
        out = self._decode(q, layer, forward_batch, topk, reqs.shape[0], graph_reqs=reqs, sink=sink)
        return out.masked_fill((reqs < 0).unsqueeze(1), 0)

    def _decode(self, q, layer, forward_batch, topk, b_real: int, graph_reqs: torch.Tensor | None = None,
                sink: torch.Tensor | None = None) -> torch.Tensor:
        """The first `b_real` rows of a decode batch; `graph_reqs` (a decode graph's batch): its request
        rows, padding rows -1 (cuda_graph.graph_rows), handed to the store as they are."""
        padded = graph_reqs is not None
        reqs = graph_reqs if padded else forward_batch.req_pool_indices[:b_real].long()
        loc = forward_batch.out_cache_loc[:b_real]
        seq_lens = forward_batch.seq_lens[:b_real]
        q3 = q.reshape(-1, layer.tp_q_head_num, self.kv_lora_rank + self.rope_dim)
        attend = self.attend_slots(layer, sink)
        b = self.backend
        if b.spec_role == ROLE_DRAFT_DECODE:
            if layer.layer_id == 0:     # step i writes its (speculative) row at position seq_len + i
                check_write_positions(loc, reqs, seq_lens + b.speculative_step_id, 1, self.r2t,
                                      "EAGLE draft decode step", sync=self.ess.validate)
            out = self.ess.decode_committed(id(forward_batch), layer.layer_id, q3, reqs, seq_lens, topk, self.r2t, attend,
                                            max_admit=num_draft_tokens(forward_batch),
                                            micro_batch_base=b.micro_batch_base,
                                            single_call=self.kernels.single_call)
            return out.to(q.dtype).reshape(q3.shape[0], layer.tp_q_head_num * self.kv_lora_rank)
        if layer.layer_id == 0:         # the newest row decode admits is the one just written
            check_write_positions(loc, reqs, seq_lens - 1, 1, self.r2t, "decode", sync=self.ess.validate,
                                  padded=padded)
        if b.micro_batch_base and not self.ess.early_parts(layer.layer_id, reqs.numel()):
            # a TBO child at level none (no indexer hand-off): plan now, in this child's ring groups
            self.ess.early_plan(id(forward_batch), layer.layer_id, reqs, seq_lens, topk, self.r2t,
                                b.micro_batch_base, padded=padded)
        out = self.ess.decode(id(forward_batch), layer.layer_id, q3, reqs, seq_lens, topk,
                              self.kernels.newest(layer, loc), self.r2t, attend,
                              single_call=self.kernels.single_call, padded=padded)
        return out.to(q.dtype).reshape(q3.shape[0], layer.tp_q_head_num * self.kv_lora_rank)


def _sink(sink) -> dict:
    """The kernels' `sink=` keyword, only for a model with sinks (others see the call they always saw)."""
    return {} if sink is None else {"sink": sink}
