"""ESS for DeepSeek-V4 on the CPU dsv4 arm: the C4 layers' compressed entries in ESS's host store.

Memory ownership (one object per model runner, ESS on):
  host   LatentStore.host  uint8 [C, P / 4, B]      one row per C4 location of SGLang's KV pool (P token
                                                    locations; a C4 block's entry lives at its last token's
                                                    location // 4, SGLang's own mapping), per C4 layer:
                                                    B = 584, SGLang's V4 FP8 row (attention/dsv4_kv_rows.py;
                                                    ``fp8_rows``), or 4 * d, float32 [d] (test layers whose
                                                    head is not V4's 512); C = the C4 layers in layer order
  slots  LatentStore.slots                          per request row a hot buffer of N entries per C4 layer,
                                                    with ESS's exact LRU (store/hot_buffer.py)
  table  req_to_host int64 [R, E]                   entry j of request row r: its C4 location (valid for
                                                    j < known[r]; re-read from req_to_token before each
                                                    forward, ``refresh``); present bool [C, P / 4]: rows
                                                    written
R = SGLang's request rows, E = max context tokens // 4 (a request's entries). The store is ESS's
LatentStore itself, keyed by C4 entry index where the DSA path keys by token position: its "tokens" are
a request's C4 entries, its sequence length the number of finished entries. Keying host rows by location
makes SGLang's radix cache work: a request that starts after a cached prefix finds that prefix's entries
where the request that computed them wrote them.

Not here: window rows, C128 entries, the C4 indexer's keys and the compressor projections stay in the
CPU arm's SideRows (the device side of docs/dsv4.md's plan).

Per request row: ``begin_extend`` opens the hot buffer on its first extend (and fills its table for a
cached prefix); ``write`` stores the entries whose blocks just finished (host, D2H counted); an extend reads
its top-k from the host rows (``host_entries``) and warm-starts the LRU from the top-k of its last W query
positions (``warm``); a decode step fetches its top-k through the hot buffer (``plan``, ``step_rows``,
``land``, ``commit``: misses host -> slot, LRU eviction; with the worker engine the misses' fetch runs in
the prefetch process while attention reads the resident entries: DA / DBA, ``mode``); ``close`` (SGLang
frees the row: finish, abort, retract) closes its hot buffer. ``clear_locs`` (SGLang frees pages: a request
without the radix cache, an evicted prefix, a flush) zeroes the host rows of the blocks those pages end.
"""

from __future__ import annotations

import torch

from sgl_ess.attention.overlap import layer_mode, plan_layer
from sgl_ess.attention.dsv4_kv_rows import HEAD_DIM, ROW_BYTES, dequantize_rows, quantize_rows
from ..launcher.v4_plan import store_config
from sgl_ess.store.latent_store import LatentStore

C4_RATIO = 4


def entry_bytes(head_dim: int, fp8_rows: bool) -> int:
    """A host row: SGLang's V4 FP8 row (584 B), or float32 [head_dim]."""
    return ROW_BYTES if fp8_rows else 4 * head_dim


class C4EntryStore:
    def __init__(self, c4_layers: list[int], head_dim: int, index_topk: int, req_to_token: torch.Tensor,
                 pool_tokens: int, hot_slots_per_request: int, warmup_queries: int = 32, engine: str = "inline",
                 fp8_rows: bool = True, overlap: str = "none", profile=None):
        """req_to_token: SGLang's int [R, T] request-row -> token-location table (read, never written);
        pool_tokens: the full KV pool's locations (a multiple of 4; SGLang's V4 pages are 256 tokens)."""
        if hot_slots_per_request < index_topk + 1:
            raise ValueError(f"DeepSeek-V4 with ESS: {hot_slots_per_request} hot entries per request and C4 layer; "
                             f"index_topk={index_topk} needs >= {index_topk + 1} (--ess-hot-slots-per-request)")
        if fp8_rows and head_dim != HEAD_DIM:
            raise ValueError(f"DeepSeek-V4's FP8 rows hold head_dim {HEAD_DIM}, got {head_dim} (fp8_rows=False keeps "
                             "float32 rows)")
        if pool_tokens % C4_RATIO:
            raise ValueError(f"DeepSeek-V4 with ESS: a KV pool of {pool_tokens} locations is not whole C4 blocks")
        request_rows, max_context_tokens = int(req_to_token.shape[0]), int(req_to_token.shape[1])
        self.req_to_token = req_to_token
        self.layers = {lid: i for i, lid in enumerate(c4_layers)}
        self.head_dim = head_dim
        self.fp8_rows = fp8_rows
        self.max_entries = max(1, max_context_tokens // C4_RATIO)
        self.cfg = store_config(len(c4_layers), entry_bytes(head_dim, fp8_rows), index_topk, request_rows,
                                self.max_entries, pool_tokens, hot_slots_per_request, warmup_queries)
        self.store = LatentStore(self.cfg, engine=engine)
        self.overlap, self.profile = overlap, profile
        # decode steps attended in one part / as DA's two parts; MTP verify steps (per C4 layer)
        self.steps = {"single": 0, "dual": 0, "verify": 0, "verify_dual": 0}
        self.num_model_layers = max(c4_layers) + 1 if c4_layers else 1
        # entry j of request row r: host row req_to_host[r, j] (its C4 location), valid for j < known[r]
        self.req_to_host = torch.zeros(request_rows, self.max_entries, dtype=torch.int64)
        self.known = torch.zeros(request_rows, dtype=torch.int64)
        self.present = torch.zeros(len(c4_layers), self.cfg.host_capacity_tokens, dtype=torch.bool)
        self.opens = 0
        self.warm_rows = 0
        self.reused_entries = 0                   # prefix entries a request found on host (the radix cache)
        self.verify_overflow_entries = 0          # MTP verify: entries past the hot buffer, read from host rows
        self.finalized_entries = 0                # MTP: entries written once a verify's acceptance was known

    # --- request lifetime ------------------------------------------------------------------
    def c4_locations(self, req: int, first: int, last: int) -> torch.Tensor:
        """int64 [last - first]: the C4 locations (host rows) of request row `req`'s entries first .. last - 1,
        SGLang's mapping (mem_cache/deepseek_v4_memory_pool.py, translate_loc_from_full_to_compressed): the
        block's last token's location // 4, that location being the last of an aligned group of 4."""
        locs = self.req_to_token[req, C4_RATIO * first + C4_RATIO - 1:C4_RATIO * last:C4_RATIO].to(torch.int64)
        if locs.numel() and bool(((locs + 1) % C4_RATIO != 0).any()):
            raise RuntimeError(f"request row {req}: a C4 block's tokens are not an aligned group of 4 locations "
                               "(SGLang's DeepSeek-V4 pages are 256 tokens; this page layout is not implemented)")
        c4 = locs // C4_RATIO
        if c4.numel() and int(c4.max()) >= self.cfg.host_capacity_tokens:
            raise RuntimeError(f"request row {req}: C4 location {int(c4.max())} beyond the host store's "
                               f"{self.cfg.host_capacity_tokens} rows (sized from the KV pool)")
        return c4

    def begin_extend(self, req: int, prefix_tokens: int) -> None:
        """An extend of request row `req` whose first new token sits at `prefix_tokens`. A row that is not
        open, or one that starts from position 0 (a new request on a row whose close did not run), opens; a
        request that starts after a cached prefix (SGLang's radix cache) finds that prefix's finished
        entries on host, written by the request that computed them: its table is filled from their
        locations (every one must be on host)."""
        if self.store.is_open(req) and prefix_tokens > 0:
            return
        self.close(req)
        self.store.open(req)
        self.opens += 1
        n = prefix_tokens // C4_RATIO
        if n:
            c4 = self.c4_locations(req, 0, n)
            missing = ~self.present[:, c4]
            if bool(missing.any()):
                raise RuntimeError(f"request row {req}: {int(missing.sum())} of its cached prefix's C4 entries are not "
                                   "on host (a prefix SGLang kept whose entries ESS zeroed)")
            self.req_to_host[req, :n] = c4
            self.known[req] = n
            self.reused_entries += n

    def refresh(self, reqs: list[int]) -> None:
        """Before a forward: re-read each request's table from SGLang's req_to_token. SGLang's radix cache
        may have re-pointed a running request's tokens at another request's identical cached pages and freed
        its own (RadixCache's checkpoint after a prefill chunk or a finished prefill, _insert_cache dedup:
        radix_cache.py), whose host rows the page hook then zeroed; the entries to read are the ones at the
        new locations."""
        for r in reqs:
            k = int(self.known[r])
            if k:
                self.req_to_host[r, :k] = self.c4_locations(r, 0, k)

    def close(self, req: int) -> None:
        """Request row `req` is freed: its hot buffer closes. Its entries' host rows belong to their token
        locations and are zeroed when SGLang frees those (``clear_locs``; the radix cache may keep them)."""
        self.known[req] = 0
        self.store.close(req)

    def close_rows(self, rows: list[int]) -> None:
        for r in rows:
            if 0 <= r < self.cfg.max_requests:
                self.close(r)

    def clear_locs(self, locs: torch.Tensor) -> None:
        """SGLang freed token locations `locs` (int [n]: a request's pages without the radix cache, an
        evicted prefix with it, every location at a flush): the entries stored at the C4 locations of the
        blocks those end are zeroed on host."""
        locs = locs.to(torch.int64)
        c4 = locs[(locs + 1) % C4_RATIO == 0] // C4_RATIO
        self._clear(c4[c4 < self.cfg.host_capacity_tokens])

    def clear_all(self) -> None:
        """SGLang cleared its allocator (a flush): every entry on host is zeroed."""
        self._clear(torch.arange(self.cfg.host_capacity_tokens))

    def _clear(self, c4: torch.Tensor) -> None:
        """Zero the host rows of C4 locations `c4` that hold an entry."""
        c4 = c4[self.present[:, c4].any(dim=0)] if c4.numel() else c4
        if c4.numel():
            self.store.clear_host(c4)
            self.store.fence_host()
            self.present[:, c4] = False

    # --- host rows ---------------------------------------------------------------------------
    def write(self, layer_id: int, req: int, first: int, entries: torch.Tensor) -> None:
        """entries float [n, d]: request `req`'s C4 entries first .. first + n - 1, just finished, to the host
        rows of their C4 locations; the request's table must know exactly the entries before `first`."""
        li, n = self.layers[layer_id], int(entries.shape[0])
        have = int(self.known[req])
        if first > have or (li == 0 and first != have):
            raise RuntimeError(f"C4 layer {layer_id}, request row {req}: entries from {first} written, its table "
                               f"holds {have} (an extend must start at a cached prefix or continue its chunks)")
        if first + n > self.max_entries:
            raise ValueError(f"request row {req}: {first + n} C4 entries, the store holds {self.max_entries} per "
                             "request (--context-length sizes it)")
        if n == 0:
            return
        c4 = self.c4_locations(req, first, first + n)
        self.store.write_host(li, c4, self._encode(entries))
        self.present[li, c4] = True
        self.req_to_host[req, first:first + n] = c4
        self.known[req] = max(have, first + n)

    def host_entries(self, layer_id: int, req: int, n: int) -> torch.Tensor:
        """float32 [n, d]: request `req`'s first n entries, read from the host rows (an extend's read)."""
        li = self.layers[layer_id]
        rows = self.req_to_host[req, :n]
        if n > int(self.known[req]) or not bool(self.present[li, rows].all()):
            raise RuntimeError(f"C4 layer {layer_id}, request row {req}: {n} entries read, {int(self.known[req])} "
                               "known, not all on host")
        return self._decode(self.store.host.rows[li][rows])

    # --- the hot buffer ------------------------------------------------------------------------
    def warm(self, layer_id: int, req: int, n: int, topk_last: torch.Tensor) -> None:
        """LRU warm-up from an extend's last W query positions' top-k, int [W, k] entry indices (-1 pad)."""
        if n == 0:
            return
        w = self.cfg.warmup_window
        ids = topk_last[-w:].to(torch.int64).unsqueeze(0)
        # LatentStore.warmup returns a 0-d device tensor (no sync on CUDA); this CPU store keeps a Python int
        self.warm_rows += int(self.store.warmup(self.layers[layer_id], torch.tensor([req]), torch.tensor([n]), ids,
                                                self.req_to_host))

    def mode(self, layer_id: int) -> str:
        """The overlap mode of C4 layer `layer_id` (--ess-prefetch-overlap-level; 'none' on a synchronous
        engine: the inline engine's fetch is done when it is submitted, so there is nothing to hide)."""
        return layer_mode(self.overlap, layer_id, self.profile, self.num_model_layers,
                          synchronous=self.store.engine.synchronous)

    def plan(self, layer_id: int, reqs: list[int], entries: list[int], topk: torch.Tensor, mode: str) -> list:
        """One decode step of one C4 layer, planned as overlap mode `mode` wants (attention/overlap.py's
        plan_layer: one StepPlan, or one per DBA half in its own ring group): the requests' top-k (int [b, k]
        entry indices, -1 pad) resolved against their hot buffers and the misses' fetch submitted. Read
        each step's rows with ``step_rows``, then ``land`` (the misses arrived) and ``commit`` (ring rows
        move to their LRU slots) it."""
        return plan_layer(self.store, mode, self.layers[layer_id], torch.tensor(reqs, dtype=torch.int64),
                          torch.tensor(entries, dtype=torch.int64), topk.to(torch.int64), self.req_to_host)

    def plan_verify(self, layer_id: int, reqs: list[int], committed: list[int], topk: torch.Tensor,
                    micro_batch: int = 0):
        """An MTP verify of one C4 layer: each request's n top-k sets (int [b, n, k] entry indices below its
        `committed` finished entries, -1 pad) resolved as ONE union against its hot buffer (store/verify.py's
        plan_union: the misses' fetch submitted once; entries past the hot buffer's capacity read from the
        host rows for this step only, never entered into the LRU), in ring group `micro_batch` (DBA's halves).
        Land ``plan.step``, read ``verify_rows``, then commit ``plan.step``; before landing, the entries
        ``verify_staged`` marks are still in flight."""
        from sgl_ess.store.verify import plan_union

        plan = plan_union(self.store, self.layers[layer_id], torch.tensor(reqs, dtype=torch.int64),
                          torch.tensor(committed, dtype=torch.int64), topk.to(torch.int64), self.req_to_host,
                          micro_batch=micro_batch)
        self.verify_overflow_entries += int(plan.overflow.sum())
        return plan

    def verify_rows(self, layer_id: int, plan) -> torch.Tensor:
        """float32 [b * n, k, d]: the entries a landed verify plan reads (hot slots and ring rows from the slot
        space, overflow entries from the host rows); any row where the top-k is -1."""
        from sgl_ess.store.verify import gather_rows

        got, _ = gather_rows(self.store, plan, self.layers[layer_id])
        return self._decode(got.reshape(-1, got.shape[-1])).view(*got.shape[:2], self.head_dim)

    def verify_staged(self, plan) -> torch.Tensor:
        """bool [b * n, k]: the entries of a verify plan read from a row its fetch fills (wait before reading)."""
        staged = plan.step.staged.to(torch.bool).gather(1, plan.union_col.clamp(min=0)) & (plan.union_col >= 0)
        return staged.view(plan.read_slots.shape)

    def step_rows(self, slots: torch.Tensor) -> torch.Tensor:
        """float32 [..., d]: the entries in slot rows `slots` (int [...], -1: padding, any row). A miss's row
        is valid once its step has landed."""
        rows = self.store.slot_rows[slots.long().clamp(min=0).reshape(-1)]
        return self._decode(rows).view(*slots.shape, self.head_dim)

    def land(self, step) -> None:
        self.store.land(step)

    def commit(self, step) -> None:
        self.store.commit(step)

    # --- the row layout ------------------------------------------------------------------------
    def _encode(self, entries: torch.Tensor) -> torch.Tensor:
        """float [n, d] -> uint8 [n, row_bytes]."""
        if self.fp8_rows:
            return quantize_rows(entries)
        return entries.float().contiguous().view(torch.uint8).reshape(entries.shape[0], -1)

    def _decode(self, rows: torch.Tensor) -> torch.Tensor:
        """uint8 [n, row_bytes] -> float32 [n, d]."""
        if self.fp8_rows:
            return dequantize_rows(rows)
        return rows.contiguous().view(torch.float32).reshape(rows.shape[0], self.head_dim)

    # --- observability -------------------------------------------------------------------------
    def usage(self) -> dict:
        """The store's counters; host rows in C4 entries: used (on host), live (in the table of a request
        holding a row), cached (used, not live: a prefix SGLang's radix cache keeps)."""
        used = int(self.present.any(dim=0).sum())
        held = [self.req_to_host[r, :k] for r, k in enumerate(self.known.tolist()) if k]
        held = torch.unique(torch.cat(held)) if held else torch.zeros(0, dtype=torch.int64)
        live = int(self.present[:, held].any(dim=0).sum()) if held.numel() else 0
        u = dict(self.store.usage(host_tokens_used=used))
        snap = self.store.counters.snapshot()
        u.update(host_tokens_live=live, host_tokens_cached=used - live, host_row_unit="C4 entry", c4_layers=sorted(self.layers),
                 hit_rate=snap["hit_rate"], rows_h2d=sum(snap["rows_h2d"]), rows_d2h=sum(snap["rows_d2h"]),
                 warmup_rows=sum(snap["warmup_rows"]), refetch_rows=sum(snap["refetch_rows"]),
                 misses_per_layer=snap["layer_misses"], hits_per_layer=snap["layer_hits"],
                 hot_slots_per_request=self.cfg.hot_slots_per_request, request_rows=self.cfg.max_requests,
                 hot_buffers=self.cfg.groups, opens=self.opens, bytes_h2d=snap["bytes_h2d"],
                 bytes_d2h=snap["bytes_d2h"], engine=self.store.engine.name, overlap_level=self.overlap,
                 single_steps=self.steps["single"], dual_steps=self.steps["dual"], verify_steps=self.steps["verify"] + self.steps["verify_dual"],
                 verify_dual_steps=self.steps["verify_dual"],
                 mtp_overflow_entries=self.verify_overflow_entries, mtp_finalized_entries=self.finalized_entries,
                 reused_entries=self.reused_entries)
        return u

    def shutdown(self) -> None:
        self.store.shutdown()
