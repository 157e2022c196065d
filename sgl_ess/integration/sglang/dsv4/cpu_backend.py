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
a decode step reads its top-k through the request's hot buffer; window rows and C128 entries stay here.
Not implemented (refused): CUDA graphs, speculative decoding, V4.1's ratio 1/2 layers, FP4 indexer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_ess.attention.dsv4_attention import layer_attention, partial_attention, window_rows
from sgl_ess.attention.dsv4_indexer import index_scores, select_topk, visible_c4_entries
from sgl_ess.attention.dsv4_kv_rows import HEAD_DIM, ROPE, round_rows
from sgl_ess.attention.dsv4_rope import apply_rope_tail
from sgl_ess.attention.reference import merge_lse, with_sink

from .compressed_entries import entries, finished_entries, first_row
from .side_rows import SideRows

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend


@dataclass
class CpuBatch:
    """One forward batch, per token: its request's index in the batch, position and location."""
    req_pool_indices: list[int]
    seq_lens: list[int]
    tok_req: torch.Tensor          # int64 [T]
    positions: torch.Tensor        # int64 [T]
    out_loc: torch.Tensor          # int64 [T]
    decode: bool = False
    new_tokens: list[int] | None = None


def batch_of(forward_batch) -> CpuBatch:
    mode = forward_batch.forward_mode
    if not (mode.is_decode() or mode.is_extend_without_speculative()):
        raise NotImplementedError(f"DeepSeek-V4 on CPU: forward mode {mode} is not implemented (extend and "
                                  "decode only; no speculative decoding)")
    seq_lens = [int(s) for s in forward_batch.seq_lens.tolist()]
    if mode.is_decode():
        counts = [1] * len(seq_lens)
    else:
        counts = [int(n) for n in forward_batch.extend_seq_lens.tolist()]
    tok_req = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts, dtype=torch.long))
    return CpuBatch([int(i) for i in forward_batch.req_pool_indices.tolist()], seq_lens, tok_req,
                    forward_batch.positions.long(), forward_batch.out_cache_loc.long(), bool(mode.is_decode()),
                    counts)


class DeepseekV4CpuAttnBackend(AttentionBackend):
    events: list | None = None        # a test's log of a decode's C4 steps ("attn0", "wait", "attn1", ...)
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
        self.rows = SideRows()
        self.chosen: dict[int, torch.Tensor] = {}    # C4 layer -> [T, topk] entries per token, this batch
        self.compressors: dict = {}                 # layer -> the model's Compressor (seen by forward_core_compressor)
        self.forward_metadata = None
        from .ess_setup import c4_store_for

        self.ess = c4_store_for(model_runner, hf, self.req_to_token)   # None with ESS off

    # -- SGLang's backend interface -------------------------------------------------------------
    def init_forward_metadata(self, forward_batch):
        self.forward_metadata = b = batch_of(forward_batch)
        self.chosen = {}
        if self.ess is not None:
            if not b.decode:
                for req, n, new in zip(b.req_pool_indices, b.seq_lens, b.new_tokens):
                    self.ess.begin_extend(req, n - new)
            self.ess.refresh(b.req_pool_indices)     # SGLang may have moved a request's tokens (radix dedup)

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
        out = torch.zeros(q.shape[0], heads, layer.v_head_dim)
        for i, n in enumerate(b.seq_lens):
            toks = (b.tok_req == i).nonzero().flatten()
            locs = self._locs(b, i, n)
            swa = self.rows.read(layer_id, "swa", locs)
            pos = b.positions[toks]
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
            compressor = self._compressor(layer_id)
            lo = first_row(compressor, done)
            proj = self.rows.read(layer_id, "core", self.req_to_token[b.req_pool_indices[i], lo:total * 4].long())
            got = finished_entries(compressor, proj, done)
            if self.ess is not None:
                self.ess.write(layer_id, b.req_pool_indices[i], done, got)
            else:
                last = self.req_to_token[b.req_pool_indices[i], torch.arange(done, total) * 4 + 3].long()
                self.rows.write(layer_id, "c4", last, self._round(got))
        return total

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
