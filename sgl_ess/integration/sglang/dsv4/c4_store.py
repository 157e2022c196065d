"""ESS for DeepSeek-V4 on the CPU dsv4 arm: the C4 layers' compressed entries in ESS's host store.

Memory ownership (one object per model runner, ESS on):
  host   LatentStore.host  uint8 [C, R * E, B]      every finished C4 entry of every request row, one row
                                                    per entry: B = 584, SGLang's V4 FP8 row
                                                    (attention/dsv4_kv_rows.py; ``fp8_rows``), or 4 * d,
                                                    float32 [d] (test layers whose head is not V4's 512);
                                                    C = the model's C4 layers in layer order
  slots  LatentStore.slots                          per request row a hot buffer of N entries per C4 layer,
                                                    with ESS's exact LRU (store/hot_buffer.py)
  table  req_to_host int64 [R, E]                   entry j of request row r lives at host row r * E + j
R = SGLang's request rows, E = max context tokens // 4 (a request's entries). The store is ESS's
LatentStore itself, keyed by C4 entry index where the DSA path keys by token position: its "tokens" are
a request's C4 entries, its sequence length the number of finished entries.

Not here: window rows, C128 entries, the C4 indexer's keys and the compressor projections stay in the
CPU arm's SideRows (the device side of docs/dsv4.md's plan).

Per request row: ``open`` on its first extend; ``write`` appends the entries whose blocks just finished
(host, D2H counted); an extend reads its top-k from the host rows (``host_entries``) and warm-starts the
LRU from the top-k of its last W query positions (``warm``); a decode step fetches its top-k through the
hot buffer (``plan``, ``step_rows``, ``land``, ``commit``: misses host -> slot, LRU eviction; with the
worker engine the misses' fetch runs in the prefetch process while attention reads the resident entries:
DA / DBA, ``mode``);
``close`` (SGLang frees the row: finish, abort, retract) zeroes its host rows and hot buffer.
"""

from __future__ import annotations

import torch

from sgl_ess.attention.overlap import layer_mode, plan_layer
from sgl_ess.attention.dsv4_kv_rows import HEAD_DIM, ROW_BYTES, dequantize_rows, quantize_rows
from sgl_ess.store import StoreConfig
from sgl_ess.store.latent_store import LatentStore

C4_RATIO = 4


def entry_bytes(head_dim: int, fp8_rows: bool) -> int:
    """A host row: SGLang's V4 FP8 row (584 B), or float32 [head_dim]."""
    return ROW_BYTES if fp8_rows else 4 * head_dim


class C4EntryStore:
    def __init__(self, c4_layers: list[int], head_dim: int, index_topk: int, request_rows: int,
                 max_context_tokens: int, hot_slots_per_request: int, warmup_queries: int = 32,
                 engine: str = "inline", fp8_rows: bool = True, overlap: str = "none", profile=None):
        if hot_slots_per_request < index_topk + 1:
            raise ValueError(f"DeepSeek-V4 with ESS: {hot_slots_per_request} hot entries per request and C4 layer; "
                             f"index_topk={index_topk} needs >= {index_topk + 1} (--ess-hot-slots-per-request)")
        if fp8_rows and head_dim != HEAD_DIM:
            raise ValueError(f"DeepSeek-V4's FP8 rows hold head_dim {HEAD_DIM}, got {head_dim} (fp8_rows=False keeps "
                             "float32 rows)")
        self.layers = {lid: i for i, lid in enumerate(c4_layers)}
        self.head_dim = head_dim
        self.fp8_rows = fp8_rows
        self.max_entries = max(1, max_context_tokens // C4_RATIO)
        self.cfg = StoreConfig(num_layers=len(c4_layers), row_bytes=entry_bytes(head_dim, fp8_rows),
                               host_capacity_tokens=request_rows * self.max_entries,
                               hot_slots_per_request=hot_slots_per_request, max_requests=request_rows,
                               topk=index_topk, max_context_tokens=self.max_entries, device="cpu",
                               warmup_window=warmup_queries)
        self.store = LatentStore(self.cfg, engine=engine)
        self.overlap, self.profile = overlap, profile
        self.steps = {"single": 0, "dual": 0}     # decode steps attended in one part / as DA's two parts
        self.num_model_layers = max(c4_layers) + 1 if c4_layers else 1
        self.req_to_host = torch.arange(request_rows * self.max_entries, dtype=torch.int64).view(
            request_rows, self.max_entries)
        self.written = torch.zeros(len(c4_layers), request_rows, dtype=torch.int64)   # entries on host
        self.opens = 0
        self.warm_rows = 0

    # --- request lifetime ------------------------------------------------------------------
    def begin_extend(self, req: int, prefix_tokens: int) -> None:
        """An extend of request row `req` whose first new token sits at `prefix_tokens`: a row that is not
        open, or one that starts from position 0 (a new request on a row whose close did not run), opens."""
        if self.store.is_open(req) and prefix_tokens > 0:
            return
        self.close(req)
        self.store.open(req)
        self.opens += 1

    def close(self, req: int) -> None:
        n = int(self.written[:, req].max()) if self.written.numel() else 0
        if n:
            self.store.clear_host(self.req_to_host[req, :n])
            self.store.fence_host()
        self.written[:, req] = 0
        self.store.close(req)

    def close_rows(self, rows: list[int]) -> None:
        for r in rows:
            if 0 <= r < self.cfg.max_requests:
                self.close(r)

    # --- host rows ---------------------------------------------------------------------------
    def write(self, layer_id: int, req: int, first: int, entries: torch.Tensor) -> None:
        """entries float32 [n, d]: request `req`'s C4 entries first .. first + n - 1, just finished; the host
        must hold exactly the entries before `first` (each entry is written once, in order)."""
        li = self.layers[layer_id]
        have, n = int(self.written[li, req]), int(entries.shape[0])
        if first != have:
            raise RuntimeError(f"C4 layer {layer_id}, request row {req}: entries from {first} written, the host "
                               f"holds {have} (a request must extend from position 0 on an opened row: serve "
                               "DeepSeek-V4 with ESS on with --disable-radix-cache)")
        if first + n > self.max_entries:
            raise ValueError(f"request row {req}: {first + n} C4 entries, the store holds {self.max_entries} per "
                             "request (--context-length sizes it)")
        if n == 0:
            return
        self.store.write_host(li, self.req_to_host[req, first:first + n], self._encode(entries))
        self.written[li, req] = first + n

    def host_entries(self, layer_id: int, req: int, n: int) -> torch.Tensor:
        """float32 [n, d]: request `req`'s first n entries, read from the host rows (an extend's read)."""
        li = self.layers[layer_id]
        if n > int(self.written[li, req]):
            raise RuntimeError(f"C4 layer {layer_id}, request row {req}: {n} entries read, "
                               f"{int(self.written[li, req])} on host")
        return self._decode(self.store.host.rows[li][self.req_to_host[req, :n]])

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
        live = int(self.written.max(dim=0).values.sum())
        u = dict(self.store.usage(host_tokens_used=live))
        snap = self.store.counters.snapshot()
        u.update(host_tokens_live=live, host_row_unit="C4 entry", c4_layers=sorted(self.layers),
                 hit_rate=snap["hit_rate"], rows_h2d=sum(snap["rows_h2d"]), rows_d2h=sum(snap["rows_d2h"]),
                 warmup_rows=sum(snap["warmup_rows"]), refetch_rows=sum(snap["refetch_rows"]),
                 misses_per_layer=snap["layer_misses"], hits_per_layer=snap["layer_hits"],
                 hot_slots_per_request=self.cfg.hot_slots_per_request, request_rows=self.cfg.max_requests,
                 hot_buffers=self.cfg.groups, opens=self.opens, bytes_h2d=snap["bytes_h2d"],
                 bytes_d2h=snap["bytes_d2h"], engine=self.store.engine.name, overlap_level=self.overlap,
                 single_steps=self.steps["single"], dual_steps=self.steps["dual"])
        return u

    def shutdown(self) -> None:
        self.store.shutdown()
