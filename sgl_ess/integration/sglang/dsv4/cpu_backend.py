"""The CPU arm of SGLang's ``dsv4`` attention backend (DeepSeek-V4 without CUDA, ESS off), in torch.

What the model calls on its backend (models/deepseek_v4.py, MQALayer with
SGLANG_DSV4_USE_BF16_KV_QUANT_SOURCE=1): ``store_cache`` (the normed, roped window row of each new
token), ``forward_core_compressor`` (a C4/C128 layer's compressor), ``forward_c4_indexer`` (a C4 layer's
indexer: its compressor, query, scores and top-k) and ``forward`` (attention). Rows live in SideRows by
token location; C4 entries are computed once when their block finishes and kept by the location of the
block's last token, C128 entries and index keys are pooled from the stored projections when read;
the math is sgl_ess/attention/dsv4_*.py (window 128 + compressed entries + sink in one softmax).
Every window row, C4 entry and C128 entry is rounded as SGLang's V4 pool stores it on a GPU (FP8 NoPE with
power-of-two scales per 64 channels, BF16 RoPE: the 584-byte row of sgl_ess/attention/dsv4_kv_rows.py)
when it is written (``fp8_rows``); the C4 indexer's keys stay float32.
With ESS on (``self.ess``, a C4EntryStore, c4_store.py) the C4 layers' entries live in ESS's host store
as those 584-byte rows: an extend reads its top-k from the host rows and warm-starts the request's LRU,
a decode step reads its top-k through the request's hot buffer, an MTP verify its draft tokens' top-k sets
as one union; window rows and C128 entries stay here.
EAGLE / MTP with chain drafts: target verify, draft extend and draft decode steps (``batch_of``).
Not implemented (refused): CUDA graphs, draft trees, V4.1's ratio 1/2 layers, FP4 indexer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_ess.attention.dsv4_attention import layer_attention, partial_attention, window_rows
from sgl_ess.attention.overlap import split_halves
from sgl_ess.attention.dsv4_indexer import index_scores, select_topk, visible_c4_entries
from sgl_ess.attention.dsv4_kv_rows import HEAD_DIM, ROPE, round_rows
from sgl_ess.attention.dsv4_rope import apply_rope_tail
from sgl_ess.attention.reference import merge_lse, with_sink

from .compressed_entries import entries, finished_entries, first_row
from .side_rows import SideRows

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend


@dataclass
class CpuBatch:
    """One forward batch, per token: its request's index in the batch, position and location.
    seq_lens[i]: the tokens request i's last query sees (its last position + 1); new_tokens[i]: its query
    tokens; committed[i]: its leading tokens whose rows are final (an MTP verify's drafts are not)."""
    req_pool_indices: list[int]
    seq_lens: list[int]
    tok_req: torch.Tensor          # int64 [T]
    positions: torch.Tensor        # int64 [T]
    out_loc: torch.Tensor          # int64 [T]
    decode: bool = False
    new_tokens: list[int] | None = None
    verify: bool = False
    committed: list[int] | None = None
    window_positions: torch.Tensor | None = None   # a draft decode step: the window ends at seq_lens - 1


def batch_of(forward_batch, draft_step: tuple[int, int] | None = None) -> CpuBatch:
    """Extend, decode, and EAGLE's modes (chain drafts, --speculative-eagle-topk 1): a target verify (n draft
    tokens per request at L .. L+n-1, seq_lens = L), a draft extend (v2: seq_lens already L+n) and a draft
    decode step (one token per request at its position; SGLang keeps seq_lens at L for every step). Each
    query attends by its position (window and entries up to it), so the tokens a request's queries see are
    taken from its positions, whatever seq_lens holds in that mode.
    draft_step (i, num_steps): step i's backend of the multi-step draft decode container, whose metadata is
    set once for every step (SGLang's V4 backends do the same): the EAGLE worker writes step i at its slice of
    the shared out_cache_loc (eagle_utils.per_step_draft_out_cache_loc, topk 1: column i of [bs, num_steps])
    and moves positions by one after each step, so step i's queries sit at the first step's positions + i.
    Their attention sees what SGLang's V4 decode metadata gives a draft step, the committed tokens
    0 .. seq_lens - 1 (make_forward_metadata_from_raw_decode: seq_lens_casual = seq_lens, which the worker
    keeps at the committed length for every step), not the earlier steps' rows: ``window_positions``."""
    mode = forward_batch.forward_mode
    verify = bool(mode.is_target_verify())
    if not (mode.is_decode() or mode.is_extend_without_speculative() or verify or mode.is_draft_extend_v2()):
        raise NotImplementedError(f"DeepSeek-V4 on CPU: forward mode {mode} is not implemented (extend, decode "
                                  "and EAGLE's target verify / draft extend v2 / draft decode)")
    if verify and int(getattr(forward_batch.spec_info, "topk", 1) or 1) != 1:
        raise NotImplementedError("DeepSeek-V4 on CPU: speculative trees are not implemented (chain drafts only: "
                                  "--speculative-eagle-topk 1)")
    n_req = int(forward_batch.req_pool_indices.numel())
    if mode.is_decode():
        counts = [1] * n_req
    elif verify:
        from ..backends.query_layout import num_draft_tokens

        counts = [num_draft_tokens(forward_batch)] * n_req
    else:
        ext = forward_batch.extend_seq_lens_cpu
        counts = [int(n) for n in (ext if ext is not None else forward_batch.extend_seq_lens.tolist())]
    tok_req = torch.repeat_interleave(torch.arange(n_req), torch.tensor(counts, dtype=torch.long))
    positions = forward_batch.positions.long().clone()      # the EAGLE worker moves positions in place
    out_loc = forward_batch.out_cache_loc.long()
    window_positions = None
    if draft_step is not None and mode.is_decode():
        step, steps = draft_step
        positions = positions + step
        out_loc = out_loc.view(n_req, steps)[:, step].clone()
        window_positions = forward_batch.seq_lens.long().clone() - 1
    last = torch.full((n_req,), -1, dtype=torch.long).scatter_reduce(
        0, tok_req, positions if window_positions is None else window_positions, "amax")
    seen = [int(p) + 1 for p in last.tolist()]
    committed = [s - c for s, c in zip(seen, counts)]
    return CpuBatch([int(i) for i in forward_batch.req_pool_indices.tolist()], seen, tok_req, positions,
                    out_loc, bool(mode.is_decode()), counts, verify, committed, window_positions)


_runner_state: dict[int, tuple[SideRows, dict]] = {}   # id(model runner) -> (rows, compressors by layer)
_verify_finalizers: dict[int, "DeepseekV4CpuAttnBackend"] = {}   # id(V4 pool) -> the ESS-on backend of its runner


def finalizer_of(pool) -> "DeepseekV4CpuAttnBackend | None":
    """The ESS-on backend whose entries follow an MTP verify's acceptance on `pool` (SGLang's V4 pool)."""
    return _verify_finalizers.get(id(pool))


class DeepseekV4CpuAttnBackend(AttentionBackend):
    events: list | None = None        # a test's log of a decode's C4 steps ("attn0", "wait", "attn1", ...)
    draft_step: tuple[int, int] | None = None   # (step, num_steps): one step of EAGLE's draft decode container

    def __init__(self, model_runner):
        super().__init__()
        hf = model_runner.model_config.hf_config
        if any(r in (1, 2) for r in getattr(hf, "compress_ratios", [])):
            raise NotImplementedError("DeepSeek-V4 on CPU: V4.1's ratio 1 / 2 layers are not implemented")
        dims = (int(hf.head_dim), int(hf.qk_rope_head_dim))
        if dims != (HEAD_DIM, ROPE):
            raise NotImplementedError(f"DeepSeek-V4 on CPU: head_dim {dims[0]} with {dims[1]} RoPE channels; SGLang's "
                                      f"V4 KV layout (584-byte FP8 rows) needs head_dim {HEAD_DIM}, {ROPE} RoPE")
        self.fp8_rows = True          # rows rounded as the V4 pool's 584-byte layout (test doubles: False)
        self.device = model_runner.device
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.window = int(getattr(hf, "window_size", None) or hf.sliding_window)
        self.index_topk = int(hf.index_topk)
        # one runner's rows and compressors, shared by every backend SGLang builds for it (an EAGLE draft
        # runner has its main backend, the draft extend's and one per draft decode step)
        self.rows, self.compressors = _runner_state.setdefault(id(model_runner), (SideRows(), {}))
        self.chosen: dict[int, torch.Tensor] = {}    # C4 layer -> [T, topk] entries per token, this batch
        self.forward_metadata = None
        from .ess_setup import c4_store_for

        self.ess = c4_store_for(model_runner, hf, self.req_to_token)   # None with ESS off
        if self.ess is not None:
            _verify_finalizers[id(model_runner.token_to_kv_pool)] = self

    # -- SGLang's backend interface -------------------------------------------------------------
    def init_forward_metadata(self, forward_batch):
        self.forward_metadata = b = batch_of(forward_batch, self.draft_step)
        self.chosen = {}
        if self.ess is not None:
            if not (b.decode or b.verify):
                for req, n, new in zip(b.req_pool_indices, b.seq_lens, b.new_tokens):
                    self.ess.begin_extend(req, n - new)
            self.ess.refresh(b.req_pool_indices)     # SGLang may have moved a request's tokens (radix dedup)
            if b.verify:            # entries of accepted tokens the post-verify call did not write (normally none)
                self.finalize_verify(b.req_pool_indices, b.committed)

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        raise NotImplementedError("DeepSeek-V4 on CPU: no CUDA graphs (run with --disable-cuda-graph)")

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def _locs(self, b: CpuBatch, i: int, n: int) -> torch.Tensor:
        return self.req_to_token[b.req_pool_indices[i], :n].long()

    def store_cache(self, layer_id, swa_k, forward_batch, **kwargs):
        b = self.forward_metadata
        self.rows.write(layer_id, "swa", b.out_loc, self._round(swa_k[: b.out_loc.numel()]))

    def forward_core_compressor(self, x, forward_batch, layer_id, compressor, **kwargs):
        b = self.forward_metadata
        self.compressors[layer_id] = compressor
        kv_score, _ = compressor.wkv_gate(x)
        self.rows.write(layer_id, "core", b.out_loc, kv_score[: b.out_loc.numel()])

    def forward_c4_indexer(self, x, q_lora, forward_batch, c4_indexer, q_lora_quant=None, skip_compressor=False,
                           **kwargs):
        if getattr(c4_indexer, "use_fp4_indexer", False):
            raise NotImplementedError("DeepSeek-V4 on CPU: the FP4 indexer is not implemented")
        b, layer = self.forward_metadata, c4_indexer.layer_id
        if not skip_compressor:
            kv_score, _ = c4_indexer.compressor.wkv_gate(x)
            self.rows.write(layer, "index", b.out_loc, kv_score[: b.out_loc.numel()])
        q, _ = c4_indexer.wq_b(q_lora)
        q = q.view(-1, c4_indexer.n_local_heads, c4_indexer.head_dim)
        f = c4_indexer.freqs_cis[b.positions][:, None, :]
        q = apply_rope_tail(q, f, c4_indexer.rope_head_dim)
        w = c4_indexer.compute_weights(x).float()
        chosen = torch.full((q.shape[0], self.index_topk), -1, dtype=torch.long)
        for i, n in enumerate(b.seq_lens):
            toks = (b.tok_req == i).nonzero().flatten()
            keys = entries(c4_indexer.compressor, self.rows.read(layer, "index", self._locs(b, i, n)))
            scores = index_scores(q[toks], w[toks], keys)
            chosen[toks] = select_topk(scores, visible_c4_entries(b.positions[toks]), self.index_topk)
        self.chosen[layer] = chosen

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, compress_ratio=0, attn_sink=None,
                **kwargs):
        if kwargs.get("inv_rope") is not None:
            raise NotImplementedError("DeepSeek-V4 on CPU: an inverse RoPE fused into attention is not implemented")
        b, layer_id = self.forward_metadata, layer.layer_id
        heads = q.shape[1]
        sink = attn_sink.float() if attn_sink is not None else torch.full((heads,), float("-inf"))
        if self.ess is not None and compress_ratio == 4 and b.decode:
            return self._c4_decode_ess(q, layer, b, sink[:heads]).to(q.dtype)
        if self.ess is not None and compress_ratio == 4 and b.verify:
            return self._c4_verify_ess(q, layer, b, sink[:heads]).to(q.dtype)
        out = torch.zeros(q.shape[0], heads, layer.v_head_dim)
        for i, n in enumerate(b.seq_lens):
            toks = (b.tok_req == i).nonzero().flatten()
            locs = self._locs(b, i, n)
            swa = self.rows.read(layer_id, "swa", locs)
            pos = (b.positions if b.window_positions is None else b.window_positions)[toks]
            compressed = chosen = None
            if compress_ratio == 4:
                compressed, chosen = self._c4_entries(layer_id, b, i, n, toks)
            elif compress_ratio == 128:
                compressed = self._round(entries(self._compressor(layer_id), self.rows.read(layer_id, "core", locs)))
                visible = (pos + 1) // 128
                j = torch.arange(max(int(compressed.shape[0]), 1))
                chosen = torch.where(j[None, :] < visible[:, None], j[None, :], -1)
                if compressed.shape[0] == 0:
                    compressed = chosen = None
            out[toks] = layer_attention(q[toks], pos, swa, sink[:heads], layer.scaling, compressed, chosen,
                                        self.window)
        return out.to(q.dtype)

    # -- C4 entries: each computed once, when its block finishes; ESS off: here, by the location of the
    # block's last token (as SGLang's pool stores it); ESS on: in the host store (c4_store.py) ------------
    def _c4_finish(self, layer_id: int, b: CpuBatch, i: int, n: int) -> int:
        """Compute and store request i's C4 entries whose blocks finished in this batch; returns how many
        entries the request has finished (the (n)//4 its last token sees)."""
        done, total = (n - b.new_tokens[i]) // 4, n // 4
        if total > done:
            got = self._c4_range(layer_id, b.req_pool_indices[i], done, total)
            if self.ess is not None:
                self.ess.write(layer_id, b.req_pool_indices[i], done, got)
            else:
                last = self.req_to_token[b.req_pool_indices[i], torch.arange(done, total) * 4 + 3].long()
                self.rows.write(layer_id, "c4", last, self._round(got))
        return total

    def _c4_range(self, layer_id: int, req: int, first: int, last: int) -> torch.Tensor:
        """float [last - first, d]: request row `req`'s C4 entries first .. last - 1 from the stored projections."""
        compressor = self._compressor(layer_id)
        lo = first_row(compressor, first)
        proj = self.rows.read(layer_id, "core", self.req_to_token[req, lo:last * 4].long())
        return finished_entries(compressor, proj, first)

    def finalize_verify(self, reqs: list[int], committed: list[int]) -> None:
        """After an MTP verify, its acceptance known (SGLang's post-verify call, pool_check.py): write the
        entries the accepted tokens finished (each request's known .. committed // 4) to the host rows, every
        C4 layer, from the projections at their locations, so the host store holds a request's every final
        entry after each step: a finished request's prefix, kept by the radix cache (its output included),
        is then whole on host for the request that starts after it (multi-turn). The next verify finds
        nothing left to write."""
        for req, n in zip(reqs, committed):
            first, c = int(self.ess.known[req]), int(n) // 4
            if c > first:
                for layer_id in sorted(self.ess.layers):
                    self.ess.write(layer_id, req, first, self._c4_range(layer_id, req, first, c))
                self.ess.finalized_entries += c - first

    def _c4_verify_ess(self, q, layer, b: CpuBatch, sink: torch.Tensor) -> torch.Tensor:
        """ESS on, an MTP verify of a C4 layer (n draft tokens per request at L .. L+n-1, L committed): the
        entries the last accepted tokens finished (known .. L // 4) are on host (``finalize_verify``, after the
        last verify, or at this batch's init_forward_metadata if that call did not run); the entries the
        draft tokens finish (L // 4 .. (L + n) // 4) are this forward's own, computed here and never stored
        (a rejected draft's entry must not outlive the step); each request's n top-k sets resolve as ONE
        union against its hot buffer (store/verify.py's plan_union: the misses fetched once, entries past
        the hot buffer read from the host rows for this step only), one plan, or one per DBA half with both
        halves' fetches submitted before either attends. Per plan, as the decode step:
          none / landed  land, then window + chosen entries (top-k order) + sink in one softmax, as ESS off;
          da / dba       the window, the resident, overflow and own entries attended while the misses are in
                         flight (Attn0), land, the misses (Attn1), merged by log-sum-exp, the sink once.
        Returns float32 [T, H, D]."""
        layer_id, heads, ess = layer.layer_id, q.shape[1], self.ess
        n = b.new_tokens[0]
        final, own = [], []
        for i, s in enumerate(b.seq_lens):
            req, c = b.req_pool_indices[i], b.committed[i] // 4
            final.append(c)
            own.append(self._round(self._c4_range(layer_id, req, c, s // 4)) if s // 4 > c else None)
        chosen = self.chosen[layer_id].view(len(final), n, -1)
        k = chosen.shape[2]
        committed = torch.where(chosen < torch.tensor(final)[:, None, None], chosen, -1)
        mode = ess.mode(layer_id)
        parts = split_halves(len(final)) if mode == "dba" else [slice(0, len(final))]
        plans = [ess.plan_verify(layer_id, b.req_pool_indices[p], final[p], committed[p], micro_batch=m)
                 for m, p in enumerate(parts)]
        note = (lambda what, m: self.events.append((what, layer_id, m))) if self.events is not None \
            else (lambda what, m: None)
        for m in range(len(plans)):
            note("plan", m)
        out = torch.zeros(q.shape[0], heads, layer.v_head_dim)
        idx = torch.arange(n * k).view(n, k)
        for m, (part, plan) in enumerate(zip(parts, plans)):
            dual = not (mode == "none" or plan.step.landed)
            ess.steps["verify_dual" if dual else "verify"] += 1
            if not dual:
                note("wait", m)
                ess.land(plan.step)
            note("attn0" if dual else "attn", m)
            rows = ess.verify_rows(layer_id, plan).view(-1, n, k, self.ess.head_dim)
            staged = ess.verify_staged(plan).view(-1, n, k)
            parts0 = []
            for j, i in enumerate(range(len(final))[part]):
                toks = (b.tok_req == i).nonzero().flatten()
                r = rows[j].clone()
                if own[i] is not None:
                    mine = chosen[i] >= final[i]
                    r[mine] = own[i][chosen[i][mine] - final[i]]
                swa = self.rows.read(layer_id, "swa", self._locs(b, i, b.seq_lens[i]))
                if not dual:
                    out[toks] = layer_attention(q[toks], b.positions[toks], swa, sink, layer.scaling,
                                                r.view(n * k, -1), torch.where(chosen[i] >= 0, idx, -1), self.window)
                    continue
                wrows, wkeep = window_rows(b.positions[toks], swa, self.window)
                keep = (chosen[i] >= 0) & ~staged[j]
                parts0.append((toks, partial_attention(q[toks], torch.cat([wrows, r], 1), torch.cat([wkeep, keep], 1),
                                                       layer.scaling)))
            if dual:
                note("wait", m)
                ess.land(plan.step)
                note("attn1", m)
                slots = plan.read_slots.view(-1, n, k)          # the misses' rows, now landed in the slot space
                for j, (toks, (o0, l0)) in enumerate(parts0):
                    o1, l1 = partial_attention(q[toks], ess.step_rows(torch.where(staged[j], slots[j], -1)), staged[j],
                                               layer.scaling)
                    o, lse = merge_lse(o0, l0, o1, l1)
                    out[toks] = with_sink(o, lse, sink)[0]
            ess.commit(plan.step)
            note("commit", m)
        return out

    def _c4_decode_ess(self, q, layer, b: CpuBatch, sink: torch.Tensor) -> torch.Tensor:
        """ESS on, one decode step of a C4 layer (token i is request i's one query): every request's top-k
        planned through its hot buffer at once (one plan, or one per DBA half), then per step
          none / a step whose misses already landed: land, attend to window + top-k in one softmax with
                 the sink (the same computation as ESS off, bit for bit);
          da / dba: attend to the window and the resident entries while the misses are in flight (Attn0),
                 land, attend to the misses (Attn1), merge by log-sum-exp, count the sink once;
        and commit. Returns float32 [b, H, D]. ``self.events`` (a list, or None) logs what ran when."""
        layer_id, heads = layer.layer_id, q.shape[1]
        out = torch.zeros(q.shape[0], heads, layer.v_head_dim)
        live = []
        for i, n in enumerate(b.seq_lens):
            m = self._c4_finish(layer_id, b, i, n)
            if m > 0:
                live.append((i, m))
            else:                                                          # no finished entry: the window only
                swa = self.rows.read(layer_id, "swa", self._locs(b, i, n))
                out[i:i + 1] = layer_attention(q[i:i + 1], b.positions[i:i + 1], swa, sink, layer.scaling,
                                               window=self.window)
        if not live:
            return out
        idx = [i for i, _ in live]
        mode = self.ess.mode(layer_id)
        steps = self.ess.plan(layer_id, [b.req_pool_indices[i] for i in idx], [m for _, m in live],
                              self.chosen[layer_id][idx], mode)
        note = (lambda what, step: self.events.append((what, layer_id, step.micro_batch))) \
            if self.events is not None else (lambda what, step: None)
        for step in steps:
            note("plan", step)
        start = 0
        for step in steps:
            part = idx[start:start + step.reqs.numel()]
            slots = step.read_slots
            start += len(part)
            dual = not (mode == "none" or step.landed)
            self.ess.steps["dual" if dual else "single"] += 1
            if not dual:
                note("wait", step)
                self.ess.land(step)
                note("attn", step)
                rows = self.ess.step_rows(slots)
                for j, i in enumerate(part):
                    swa = self.rows.read(layer_id, "swa", self._locs(b, i, b.seq_lens[i]))
                    col = torch.arange(slots.shape[1])
                    chosen = torch.where(slots[j:j + 1] >= 0, col[None, :], -1)
                    out[i:i + 1] = layer_attention(q[i:i + 1], b.positions[i:i + 1], swa, sink, layer.scaling,
                                                   rows[j], chosen, self.window)
            else:
                note("attn0", step)
                parts0 = []
                for j, i in enumerate(part):             # the window and the resident entries, misses in flight
                    swa = self.rows.read(layer_id, "swa", self._locs(b, i, b.seq_lens[i]))
                    wrows, wkeep = window_rows(b.positions[i:i + 1], swa, self.window)
                    hit = (slots[j:j + 1] >= 0) & ~step.staged[j:j + 1]
                    hrows = self.ess.step_rows(torch.where(hit, slots[j:j + 1], -1))
                    parts0.append(partial_attention(q[i:i + 1], torch.cat([wrows, hrows], 1),
                                                    torch.cat([wkeep, hit], 1), layer.scaling))
                note("wait", step)
                self.ess.land(step)
                note("attn1", step)
                for j, i in enumerate(part):
                    miss = (slots[j:j + 1] >= 0) & step.staged[j:j + 1]
                    o1, l1 = partial_attention(q[i:i + 1], self.ess.step_rows(torch.where(miss, slots[j:j + 1], -1)),
                                               miss, layer.scaling)
                    o, lse = merge_lse(*parts0[j], o1, l1)
                    out[i:i + 1] = with_sink(o, lse, sink)[0]
            self.ess.commit(step)
            note("commit", step)
        return out

    def _c4_entries(self, layer_id: int, b: CpuBatch, i: int, n: int, toks: torch.Tensor):
        """(compressed [m, d], chosen [t, k]) of request i for layer_attention, or (None, None) (not the
        decode of ESS on: _c4_decode_ess)."""
        chosen = self.chosen[layer_id][toks]
        m = self._c4_finish(layer_id, b, i, n)
        if m == 0:
            return None, None
        req = b.req_pool_indices[i]
        if self.ess is None:
            return self.rows.read(layer_id, "c4", self.req_to_token[req, torch.arange(m) * 4 + 3].long()), chosen
        self.ess.warm(layer_id, req, m, chosen)   # every extend chunk; the last one wins
        return self.ess.host_entries(layer_id, req, m), chosen

    def _round(self, rows: torch.Tensor) -> torch.Tensor:
        """rows float [..., d] as the V4 pool gives them back, float32 (ESS's host store rounds C4 entries itself)."""
        if not self.fp8_rows or rows.numel() == 0:
            return rows
        return round_rows(rows.reshape(-1, rows.shape[-1])).view(rows.shape)

    def _compressor(self, layer_id):
        c = self.compressors.get(layer_id)
        if c is None:
            raise RuntimeError(f"dsv4 CPU arm: layer {layer_id}'s compressor never ran before its attention")
        return c
