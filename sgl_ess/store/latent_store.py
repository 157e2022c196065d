"""LatentStore: the engine-facing ESS store (host pool + slot space + LRU state + fetch engine).

Memory ownership (allocated once here, alive as long as this object):
  host   HostLatentPool  uint8 [L, T, B]  every token's latent row (shared segment; registered
                                          for zero-copy access on CUDA); may be handed in by the
                                          engine that allocated it
  slots  SlotSpace       uint8 [S, B]     hot buffers (R x N slots per layer) + staging rings,
                                          one flat space attention indexes; `ring_tags`
  hot    DeviceHotBuffer                  the exact-LRU state of every (layer, request)
  engine FetchEngine                      runs the row moves (inline, or a worker process)
  spec   SpeculativeStager                the speculative tier and its predictor (optional)
  trace  TraceRecorder                    opt-in record of every plan's top-k (--ess-trace-file)
Request indices r in [0, max_requests) are an engine's request-pool indices; the token ->
host-location map (`req_to_host int64 [max_requests, max_context]`) belongs to the caller
(SGLang's req_to_token, or sgl_ess.store.requests.RequestTable), so a radix cache can share
host rows between requests.

Per decode step and layer (see step_plan.py):
  plan(layer, reqs, seq_lens, topk, req_to_host) -> StepPlan   resolve + submit the fetch
  land(plan)                                                   wait for it, verify ring tags
  commit(plan)                                                 ring rows -> LRU slots (background)
`resolve` does all three and returns the hot-slot rows (the synchronous form).
Prefill warm-up (`warmup`, `lru_tokens`, `warm_from_lru_tokens`) comes from the WarmStart mixin
(warm_start.py); which fetch engine `engine="auto"` picks, from engine_choice.py.

Shared-index layers (StoreConfig.layer_anchors: GLM-5.2's indexer_types "shared"): the layers of a
group see their anchor's top-k, so their LRU states would evolve identically. The group keeps ONE
slot table (LRU state) per hot buffer, resolved once per step at the anchor (`reserve_group`,
`plan_group`); the result applies to every layer's own rows (hot_base(layer) + slot), and every
layer's fetch is submitted then, at the anchor (the whole group's lead time). The anchor's misses
go through its staging ring; a later layer's misses go straight to their hot slots (the slot a
miss evicts holds a token no one reads this step), so no ring group is shared by two plans in flight.
`plan` / `reserve` / `admit_from_host` refuse a layer of a multi-layer group (they would advance
the shared table for one layer only).
"""
from __future__ import annotations

import logging

import torch

from sgl_ess.kernels.flashtrans import copy_rows
from sgl_ess.kernels.resolver_numba import available as numba_available, compile_numba
from sgl_ess.obs.counters import StoreCounters
from sgl_ess.prefetch.engine import FetchEngine, InlineEngine, Ticket
from sgl_ess.prefetch.memory import StoreMemory
from sgl_ess.prefetch.plan import CopyPlan
from sgl_ess.store.config import StoreConfig
from sgl_ess.store.engine_choice import WORKER_MIN_CPUS, auto_cpu_engine, index_to_device, rank_cpu_cores
from sgl_ess.store.host_pool import HostLatentPool
from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.resolver import assign
from sgl_ess.store.slot_space import SlotSpace
from sgl_ess.prefetch.predictors import PredictorContext, make_predictor
from sgl_ess.store.speculative import SpeculativeOptions, SpeculativeStager
from sgl_ess.store.step_plan import StepPlan, miss_destinations, plan_epilogue_torch, read_locations
from sgl_ess.store.validate import check_rows, check_topk
from sgl_ess.store.warm_start import WarmStart

logger = logging.getLogger(__name__)


class LatentStore(WarmStart):
    def __init__(self, cfg: StoreConfig, transfer_backend: str = "auto", engine: str = "inline",
                 speculative: str = "off", host_pool: HostLatentPool | None = None,
                 spec_options: SpeculativeOptions | None = None, trace_file: str = "", trace_meta: dict | None = None):
        self.cfg = cfg
        dev = torch.device(cfg.device)
        pin = cfg.pin_host if cfg.pin_host is not None else dev.type == "cuda"
        self.device = dev
        handed_in = host_pool
        if host_pool is None:
            host_pool = HostLatentPool(cfg.num_layers, cfg.host_capacity_tokens, cfg.row_bytes, pin=pin,
                                       lock=cfg.lock_host)
        elif tuple(host_pool.rows.shape) != (cfg.num_layers, cfg.host_capacity_tokens, cfg.row_bytes):
            raise ValueError(f"host pool of shape {list(host_pool.rows.shape)} does not match the store config "
                             f"[{cfg.num_layers}, {cfg.host_capacity_tokens}, {cfg.row_bytes}]")
        elif cfg.lock_host and not host_pool.segment.locked:
            raise ValueError("lock_host=True (--ess-lock-host-memory), but the host pool handed in is not mlocked: "
                             "build it with HostLatentPool(..., lock=True)")
        self.host = host_pool        # an engine may own it (SGLang's DSA pool allocates it, host_pool_class.py)
        self._owns_host = handed_in is None
        self.slots = SlotSpace(cfg.num_layers, cfg.groups, cfg.hot_slots_per_request, cfg.row_bytes,
                               cfg.ring_groups, cfg.ring_slots_per_group, dev, spec_slots=cfg.spec_slots,
                               lock=cfg.lock_host, verify_rows=cfg.max_requests * cfg.verify_rows_per_request)
        # one LRU slot table per anchor layer (= per layer without shared-index layers)
        self._table = [cfg.table_of(layer) for layer in range(cfg.num_layers)]
        self._grouped = cfg.slot_tables != cfg.num_layers
        self.hot = DeviceHotBuffer(cfg.slot_tables, cfg.groups, cfg.hot_slots_per_request, dev,
                                   max_context_tokens=cfg.max_context_tokens)
        self.resolver_calls = 0          # top-k resolutions (plan / plan_group): one per anchor and step
        self.counters = StoreCounters(cfg.num_layers, cfg.groups, cfg.row_bytes, dev)
        # request row -> hot buffer (only with fewer hot buffers than rows; else row r owns buffer r):
        # handed out by open(), given back by close(); -1 for a row without one
        self._indirect = cfg.groups != cfg.max_requests
        self._group_host = list(range(cfg.max_requests)) if not self._indirect else [-1] * cfg.max_requests
        self._free_groups = list(range(cfg.groups - 1, -1, -1))
        # request row -> open (host, bool [max_requests]): the batch check reads it without a device read
        self._row_open = torch.zeros(cfg.max_requests, dtype=torch.bool)
        self.group_of = (torch.full((cfg.max_requests,), -1, dtype=torch.int64, device=dev)
                         if self._indirect else None)
        self.transfer_backend = transfer_backend
        # kernels: the Triton resolver (graph-safe, no host sync) on CUDA; on the CPU the numba
        # resolver (one compiled call) when numba imports, else the torch path
        self.resolver_backend = cfg.resolver_backend if cfg.resolver_backend != "auto" else (
            "triton" if dev.type == "cuda" else "numba" if numba_available() else "torch")
        if self.resolver_backend == "numba":
            have = numba_available()
            if dev.type != "cpu" or not have:
                raise ValueError(f"resolver_backend='numba' runs on the CPU with numba installed (device {dev}, "
                                 f"numba {'found' if have else 'missing'}): pip install numba==0.65.1, "
                                 "or use resolver_backend='auto'")
            compile_numba()              # at start, not inside the first request
        self.memory = StoreMemory(host=self.host.rows, slots=self.slots.rows, ring_tags=self.slots.ring_tags,
                                  ring_base=self.slots.ring_base, host_segment=self.host.segment,
                                  slot_segment=self.slots.segment)
        self.engine = self._make_engine(engine)
        spec_options = spec_options or SpeculativeOptions()
        if speculative != "off" and self._grouped:
            raise ValueError(f"speculative prefetch {speculative!r} with shared-index layers (layer_anchors): the "
                             "speculative tier keeps per-layer predictions, which a group's one slot table does not "
                             "follow; serve with --ess-speculative-prefetch off")
        if speculative != "off" and cfg.spec_slots <= 0:
            raise ValueError(f"speculative prefetch {speculative!r} needs speculative rows: set spec_slots > 0 "
                             "(--ess-spec-slots)")
        predictor = make_predictor(speculative, PredictorContext(cfg.num_layers, cfg.topk, cfg.max_context_tokens,
                                                                 spec_options.checkpoint))
        self.spec = SpeculativeStager(self, predictor, options=spec_options) if predictor is not None else None
        self.trace = None
        if trace_file:
            from sgl_ess.store.trace_recorder import TraceRecorder

            self.trace = TraceRecorder(trace_file, cfg, **(trace_meta or {}))
        self._seq = 0
        self._group_fence: dict[int, Ticket] = {}     # ring group -> commit that must land first
        self._layer_fence: dict[int, list[Ticket]] = {}   # layer -> warmups that must land first
        # plan scratch, allocated here so it is in the device budget (StoreConfig.device_allocation):
        # the Triton plan epilogue's redirect rows, zero between calls, int32 [micro-batches, R, N + 1];
        # write_slots(padded=True)'s source rows 0..R-1, int64 [R]
        self._redirect = torch.zeros((cfg.ring_micro_batches, cfg.max_requests, cfg.hot_slots_per_request + 1),
                                     dtype=torch.int32, device=dev)
        self._iota = torch.arange(cfg.max_requests, dtype=torch.int64, device=dev)
        # zeroing that must land before host writes: each zero plan and the layers already fenced
        self._host_fence: list[tuple[Ticket, set[int]]] = []
        # a writer outside every stream may reuse released host locations (a PD decode node: Mooncake /
        # NIXL write host rows by RDMA): then the release waits for its zeroing on the host (clear_host)
        self.external_host_writer = False

    @property
    def engine(self) -> FetchEngine:
        """The fetch engine (replaceable: an engine wrapped later, e.g. prefetch/split_fetch.SplitFetch)."""
        return self._engine

    @engine.setter
    def engine(self, engine: FetchEngine) -> None:
        """Install `engine`; one that sizes per-step buffers from the store (`size_for_store`: SplitFetch's
        exchange, from the ring's miss budget) is given this store's config."""
        self._engine = engine
        size_for_store = getattr(engine, "size_for_store", None)
        if size_for_store is not None:
            size_for_store(self.cfg)

    def _make_engine(self, name: str) -> FetchEngine:
        on_cuda = self.device.type == "cuda"
        if name == "auto" and on_cuda:
            name = "stream"
        elif name == "auto":
            cores = rank_cpu_cores()
            name = auto_cpu_engine(cores)
            logger.info("prefetch engine auto -> %s (%d core(s) for this rank; the worker process needs >= %d)",
                        name, cores, WORKER_MIN_CPUS)
        if name == "inline":
            return InlineEngine(self.memory, self.transfer_backend)
        if name == "stream":
            from sgl_ess.prefetch.stream_engine import StreamEngine

            return StreamEngine(self.memory, self.transfer_backend)
        if name == "worker":
            if on_cuda:
                raise ValueError(
                    "--ess-prefetch-engine worker: on CUDA the hot buffers and rings are device memory a worker "
                    "process cannot write without CUDA IPC; the fetch runs on a side stream instead "
                    "(--ess-prefetch-engine stream, the default there)")
            from sgl_ess.prefetch.client import WorkerEngine

            return WorkerEngine(self.memory, self.transfer_backend)
        raise ValueError(f"prefetch engine {name!r}: expected auto, worker, stream or inline (--ess-prefetch-engine)")

    # --- request lifetime ---------------------------------------------------------------
    def open(self, req: int) -> None:
        """Start an empty hot buffer for request `req` (any earlier state is dropped). With fewer hot
        buffers than request rows (`hot_groups`), the row takes a free one."""
        self._check_req(req)
        g = self._group_host[req]
        if g < 0:
            if not self._free_groups:
                raise RuntimeError(
                    f"request index {req}: all {self.cfg.groups} hot buffers are held by open requests "
                    f"({self.open_requests}); a request must close before another opens (--max-running-requests "
                    "sizes them)")
            g = self._free_groups.pop()
            self._group_host[req] = g
            self.group_of[req:req + 1].fill_(g)       # a device fill: no host->device copy to wait for
        self._reset(g)
        self.hot.is_open[g] = True
        self._row_open[req] = True
        self.counters.reset_request(g)
        if self.spec is not None:         # a reused index must not inherit the predictor's state
            self.spec.forget(req)
        if self.trace is not None:
            self.trace.open(req)

    def close(self, req: int) -> None:
        """Request finished, aborted or retracted: zero and free its hot buffer, and drop every
        speculative staging (they may hold its rows). Ring rows are zeroed by each commit ("move").
        A row that is not open gets its slot map emptied (defence in depth: nothing a forward left in
        it is reachable by the row's next request)."""
        self._check_req(req)
        g = self._group_host[req]
        if g >= 0 and self.hot.is_open[g]:
            self._reset(g)
            self.slots.clear_speculative()
            if self.spec is not None:
                self.spec.forget(req)
            self.hot.is_open[g] = False
            self._row_open[req] = False
            if self.trace is not None:
                self.trace.close_request(req)
        elif g >= 0:
            # a row that was never opened (or closed already): a device decode does not check that
            # its row is open, so forwards that bypassed open() may have filled this hot buffer's
            # slot map; empty it, so the next request on the row cannot read these rows. The map only
            # (L x N entries), not the bytes (a PD decode node closes every row it allocates): a hot
            # slot is read only through its map entry (a hit), an empty slot is written by a miss's
            # move before any read, and open() zeroes the bytes as well
            self.hot.reset(g)
        if self._indirect and g >= 0:
            self._group_host[req] = -1
            self.group_of[req:req + 1].fill_(-1)
            self._free_groups.append(g)

    def _reset(self, group: int) -> None:
        self.engine.drain()               # no pending copy may land in a slot after it is zeroed
        self.hot.reset(group)
        self.slots.zero_request(group)

    @property
    def open_requests(self) -> int:
        return sum(self.hot.is_open)

    def is_open(self, req: int) -> bool:
        """Request row `req` holds an open hot buffer."""
        g = self._group_host[req] if 0 <= int(req) < self.cfg.max_requests else -1
        return g >= 0 and bool(self.hot.is_open[g])

    def groups_of(self, reqs: torch.Tensor, padded: bool = False) -> torch.Tensor:
        """The hot buffers of request rows `reqs` (int64, on the store's device; -1: none). With
        `padded`, rows -1 are padded batch rows and get none (two more ops with indirect buffers)."""
        if not self._indirect:
            return reqs
        if padded:
            return torch.where(reqs >= 0, self.group_of[reqs.clamp(min=0)], -1)
        return self.group_of[reqs]

    def shutdown(self) -> None:
        if self.trace is not None:
            self.trace.close()
        self.engine.close()
        if self._owns_host:               # a pool handed in is released by its owner
            self.host.close()

    # --- host rows ----------------------------------------------------------------------
    def write_host(self, layer: int, locs: torch.Tensor, rows: torch.Tensor) -> None:
        """rows uint8 [n, row_bytes] -> host pool at `locs` (int64 [n]) of `layer` (D2H)."""
        check_rows(rows, locs.numel(), self.cfg.row_bytes, "write_host")
        self._check_layer(layer)
        locs = locs.to(torch.int64).reshape(-1)
        if locs.numel() and (int(locs.min()) < 0 or int(locs.max()) >= self.cfg.host_capacity_tokens):
            raise IndexError(f"write_host: location out of range [0, {self.cfg.host_capacity_tokens})")
        self.fence_host(layer)
        src_idx = torch.arange(locs.numel(), device=rows.device)
        copy_rows(rows, src_idx, self.host.rows[layer], locs.to(rows.device), self.transfer_backend)
        self.counters.add_d2h(layer, locs.numel())

    def clear_host(self, locs: torch.Tensor) -> None:
        """Zero host rows that were released (they hold user data), in every layer: a zero plan,
        ordered after every copy and write submitted before it (a device stream: after the compute
        stream's work so far, so an in-flight forward's write of these rows lands first).

        Colocated (every writer of host rows is the store's or a forward's, fenced by `fence_host`):
        no host wait; a later write to layer l is ordered after layer l's memset on the device.
        With `external_host_writer` (a PD decode node, issue 32 defect 3): SGLang frees the locations
        after this returns and may hand them to a transfer that writes host rows by RDMA, outside
        every stream and every fence, so the host waits for the zeroing here (`complete`).

        locs int [n], any device. On a device-stream engine nothing here waits for the device (issue 32):
        the locations stay on the store's device (a host tensor is staged through pinned memory, never a
        pageable copy) and the range check is a device-side assert (`torch._assert_async`: on CUDA a
        failed device assert stops the process at its next sync - CUDA does not carry the message, the CPU
        raises it at once). Other engines address their runs on the
        host: the locations are read there (a sync they make anyway) and checked at once."""
        locs = locs.reshape(-1)
        if locs.numel() == 0:
            return
        cap = self.cfg.host_capacity_tokens
        if self.engine.ordered_on_device:
            locs = index_to_device(locs, self.device)
            torch._assert_async(((locs >= 0) & (locs < cap)).all(),
                                f"clear_host: a released location is out of range [0, {cap})")
        else:
            locs = locs.to("cpu", torch.int64)
            if int(locs.min()) < 0 or int(locs.max()) >= cap:
                raise IndexError(f"clear_host: location out of range [0, {cap})")
        ticket = self.engine.submit(CopyPlan("zero", torch.full_like(locs, -1), locs,
                                             tier="background", note="zero released rows"))
        if self.external_host_writer:
            self.engine.complete(ticket)
        else:
            self._host_fence.append((ticket, set()))

    def fence_host(self, layer: int | None = None) -> None:
        """Before anything writes host rows (of `layer`; None: of any layer): order the write after
        the pending zeroing of released rows (SGLang may hand a released location to a new request
        right away). With a layer, a device stream waits for that layer's memset only."""
        if layer is None:
            while self._host_fence:
                self.engine.wait(self._host_fence.pop(0)[0])
            return
        keep = []
        for ticket, fenced in self._host_fence:
            if layer in fenced:
                keep.append((ticket, fenced))
                continue
            fenced.add(layer)
            if self.engine.wait_layer(ticket, layer):
                continue                               # the whole plan is ordered now
            if len(fenced) == self.cfg.num_layers:
                self.engine.wait(ticket)               # every layer fenced: forget the plan
                continue
            keep.append((ticket, fenced))
        self._host_fence = keep

    def graph_boundary(self) -> None:
        """A CUDA graph's edge (decode graphs, --ess-cuda-graph): everything submitted so far is ordered
        before the compute stream's next work, and no ticket is kept. Before a capture and before each
        replay this orders pending eager work (zeroing, commits, warmups) ahead of the graph; at the
        end of a captured step it joins the step's side-stream work back into the graph (a capture
        may not end with forked work, and an event recorded inside a graph cannot be waited on
        outside it). A device-stream engine only: no host wait."""
        if not self.engine.ordered_on_device:
            raise RuntimeError(f"ESS decode CUDA graphs need the stream engine, not {self.engine.name!r}")
        self.engine.drain()
        self._group_fence.clear()
        self._layer_fence.clear()
        self._host_fence.clear()

    # --- decode path -------------------------------------------------------------------
    def plan(self, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor, topk: torch.Tensor,
             req_to_host: torch.Tensor, micro_batch: int = 0, validate: bool = True, padded: bool = False) -> StepPlan:
        """Resolve one layer's top-k for a (sub-)batch and submit the misses' fetch.

        reqs int64 [b] (unique, opened), seq_lens int64 [b], topk int32/int64 [b, k] token
        positions (-1 padded), req_to_host int64 [max_requests, max_context].
        `validate=False` skips the input checks (they sync the host) on a trusted hot path.
        `padded`: `reqs` may hold -1 for padded batch rows: nothing is read, fetched or counted for them."""
        self._check_layer(layer)
        self._check_ungrouped(layer, "plan", "plan_group")
        if not 0 <= micro_batch < self.cfg.ring_micro_batches:
            raise ValueError(f"micro_batch={micro_batch}: expected 0..{self.cfg.ring_micro_batches - 1}")
        reqs = reqs.to(self.device, torch.int64)
        seq_lens = seq_lens.to(self.device, torch.int64)
        if validate:
            self._check_batch(reqs)
            check_topk(topk, seq_lens, "resolve topk")
        if self.trace is not None:
            self.trace.plan(layer, micro_batch, reqs, seq_lens, topk)
        for t in self._layer_fence.pop(layer, []):
            self.engine.wait(t)
        group = self._ring_group(layer, micro_batch)
        if group in self._group_fence:            # the ring group's previous commit must have landed
            self.engine.wait(self._group_fence.pop(group))
        tokens = topk.to(self.device, torch.int64)
        groups = self.groups_of(reqs, padded)
        a = assign(self.hot, self._table[layer], groups, seq_lens, tokens, backend=self.resolver_backend)
        self.resolver_calls += 1
        if self.spec is None:
            return self._plan_fused(layer, micro_batch, reqs, groups, tokens, a, req_to_host, group)
        self.counters.add_step(layer, groups, a.hit, a.miss)
        n = self.cfg.hot_slots_per_request
        hot_abs = self._hot_abs(layer, groups, a.slots)
        spec = self.spec.claim(layer, reqs, tokens, a.miss, micro_batch) if self.spec is not None else None
        fetch = a.miss if spec is None else a.miss & (spec < 0)
        dst, to_ring = miss_destinations(fetch, hot_abs, self.slots.ring_row(group, 0), self.slots.ring_slots)
        if spec is not None:                       # staged speculatively and landed: read in place
            dst = torch.where(spec >= 0, spec, dst)
        # a device stream orders a speculative staging only before later plans' waits: claimed rows
        # are read after this plan's wait there (with the fetched ones); a host engine's landed
        # staging (its tag checked in claim) is read at once
        waits = a.miss if spec is not None and self.engine.ordered_on_device else fetch
        read, staged = read_locations(a.slots, hot_abs, a.miss, dst, waits, n)
        # per entry [b*k], -1 where it does not apply (static shapes: no compaction, no host sync)
        miss_f, fetch_f = a.miss.reshape(-1), fetch.reshape(-1)
        dst_f = dst.reshape(-1)
        src_f = torch.where(fetch_f, req_to_host.to(self.device)[reqs.unsqueeze(1), tokens.clamp(min=0)].reshape(-1), -1)
        seq = self.next_seq()
        step = StepPlan(layer=layer, micro_batch=micro_batch, seq=seq, reqs=reqs,
                        read_slots=read.to(torch.int32), staged=staged,
                        hot_dst=torch.where(miss_f, hot_abs.reshape(-1), -1),
                        ring_dst=torch.where(to_ring.reshape(-1) & fetch_f, dst_f, -1),
                        host_src=src_f,
                        spec_dst=torch.where(miss_f & ~fetch_f, dst_f, -1))
        step.ticket = self._submit(CopyPlan("h2s", src_f, torch.where(fetch_f, dst_f, -1), layer=layer,
                                                  tier="immediate", micro_batch=micro_batch, tag_seq=seq))
        if self.spec is not None:
            self.spec.after_plan(layer, reqs, seq_lens, tokens, req_to_host, micro_batch)
        return step

    def plan_group(self, anchor: int, reqs: torch.Tensor, seq_lens: torch.Tensor, topk: torch.Tensor,
                   req_to_host: torch.Tensor, micro_batch: int = 0, validate: bool = True,
                   padded: bool = False) -> list[StepPlan]:
        """`plan` for every layer of anchor `anchor`'s group (the anchor first), with ONE resolver call
        on the group's slot table: the same slots, hits and misses apply to each layer's own rows, and
        every layer's fetch is submitted now. Arguments as `plan`. A layer without shared-index layers
        after it is a group of one (same result as `plan`)."""
        self._check_layer(anchor)
        if self.cfg.anchors[anchor] != anchor:
            raise ValueError(f"plan_group: layer {anchor} is a shared-index layer (anchor "
                             f"{self.cfg.anchors[anchor]}); plan its group at the anchor")
        if self.spec is not None:
            return [self.plan(anchor, reqs, seq_lens, topk, req_to_host, micro_batch, validate, padded)]
        if not 0 <= micro_batch < self.cfg.ring_micro_batches:
            raise ValueError(f"micro_batch={micro_batch}: expected 0..{self.cfg.ring_micro_batches - 1}")
        layers = self.cfg.group_layers(anchor)
        reqs = reqs.to(self.device, torch.int64)
        seq_lens = seq_lens.to(self.device, torch.int64)
        if validate:
            self._check_batch(reqs)
            check_topk(topk, seq_lens, "resolve topk")
        for layer in layers:
            if self.trace is not None:
                self.trace.plan(layer, micro_batch, reqs, seq_lens, topk)
            for t in self._layer_fence.pop(layer, []):
                self.engine.wait(t)
        group = self._ring_group(anchor, micro_batch)
        if group in self._group_fence:
            self.engine.wait(self._group_fence.pop(group))
        tokens = topk.to(self.device, torch.int64)
        groups = self.groups_of(reqs, padded)
        a = assign(self.hot, self._table[anchor], groups, seq_lens, tokens, backend=self.resolver_backend)
        self.resolver_calls += 1
        return [self._plan_fused(layer, micro_batch, reqs, groups, tokens, a, req_to_host, group,
                                 use_ring=layer == anchor) for layer in layers]

    def _plan_fused(self, layer, micro_batch, reqs, groups, tokens, a, req_to_host, group,
                    use_ring: bool = True) -> StepPlan:
        """`plan` without a speculative tier: the resolver's result turned into the step in one
        epilogue (torch ops here; one Triton launch with the Triton resolver, i.e. on CUDA).
        `use_ring` False: every miss goes straight to its hot slot (a shared-index layer, plan_group)."""
        seq = self.next_seq()
        args = (a.slots, a.miss, a.hit, tokens, reqs, groups, req_to_host.to(self.device))
        kw = dict(hot_base=self.slots.hot_base(layer), n_slots=self.cfg.hot_slots_per_request,
                  ring_first=self.slots.ring_row(group, 0), ring_cap=self.slots.ring_slots if use_ring else 0)
        if self.resolver_backend == "triton":
            from sgl_ess.kernels.plan_epilogue_triton import plan_epilogue_triton

            c = self.counters
            out = plan_epilogue_triton(*args, self._redirect_scratch(micro_batch), hits_row=c.hits[layer],
                                       misses_row=c.misses[layer], layer_counts=c.step_counts[layer], **kw)
        else:
            out = plan_epilogue_torch(*args, self.counters, layer, **kw)
        read, staged, hot_dst, ring_dst, host_src, fetch_dst = out
        step = StepPlan(layer=layer, micro_batch=micro_batch, seq=seq, reqs=reqs, read_slots=read, staged=staged,
                        hot_dst=hot_dst, ring_dst=ring_dst, host_src=host_src,
                        spec_dst=None)
        step.ticket = self._submit(CopyPlan("h2s", host_src, fetch_dst, layer=layer, tier="immediate",
                                            micro_batch=micro_batch, tag_seq=seq))
        return step

    def _redirect_scratch(self, micro_batch: int) -> torch.Tensor:
        """The Triton plan epilogue's zeroed scratch, one per micro-batch (int32 [R, N + 1])."""
        return self._redirect[micro_batch]

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def land(self, step: StepPlan) -> None:
        """Wait until every row `step` fetches has landed. With an engine in another process, also
        re-fetch inline any ring row whose tag is not this plan's (a late or lost completion), so
        nothing stale is ever read; a device-stream engine orders rows on the stream instead."""
        if step.landed:
            return
        if step.ticket is not None:
            self.engine.wait(step.ticket)
        if not self.engine.ordered_on_device:
            in_ring = step.ring_dst >= 0
            tags = self.slots.ring_tags[(step.ring_dst - self.slots.ring_base).clamp(min=0)]
            bad = in_ring & (tags != step.seq)
            if bool(bad.any()):
                logger.warning("ESS: %d staged rows of layer %d carried a stale tag; re-fetched inline",
                               int(bad.sum()), step.layer)
                self.counters.add_refetch(step.layer, int(bad.sum()))
                InlineEngine(self.memory, self.transfer_backend).submit(
                    CopyPlan("h2s", torch.where(bad, step.host_src, -1), torch.where(bad, step.ring_dst, -1),
                             layer=step.layer, tag_seq=step.seq))
        step.landed = True

    def commit(self, step: StepPlan) -> None:
        """After attention read `step`: move its landed ring (and speculative) rows into their LRU
        hot slots, as a background plan the next use of this ring group waits for."""
        if step.committed:
            return
        self.land(step)
        if step.spec_dst is None:       # an entry moves where both are set: the copy kernels mask the rest
            src, dst = step.ring_dst, step.hot_dst
        else:
            src = torch.where(step.ring_dst >= 0, step.ring_dst, step.spec_dst)
            dst = torch.where(src >= 0, step.hot_dst, -1)
        plan = CopyPlan("move", src, dst, tier="background", micro_batch=step.micro_batch, note="commit")
        ticket = self._submit(plan)
        self._group_fence[self._ring_group(step.layer, step.micro_batch)] = ticket
        if self.spec is not None:
            self.spec.note_commit(step.layer, ticket, step.micro_batch)
        step.committed = True

    def resolve(self, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor, topk: torch.Tensor,
                req_to_host: torch.Tensor, validate: bool = True) -> torch.Tensor:
        """Make every top-k entry resident in its hot slot and return where it lives.

        returns int32 [b, k]: rows of `self.slot_rows` (hot slots), -1 for padding."""
        step = self.plan(layer, reqs, seq_lens, topk, req_to_host, validate=validate)
        self.commit(step)
        self.engine.drain()
        return self._hot_rows_of(step)

    def reserve(self, layer: int, reqs: torch.Tensor, positions: torch.Tensor, validate: bool = True,
                padded: bool = False) -> torch.Tensor:
        """Make the newest tokens `positions` [b] the most recently used entries of their hot
        buffers (evicting as a step would) and return their slot rows int64 [b]; the caller writes
        the rows' bytes there (`admit` does both). Lets a step be planned before the newest latent
        row exists: the step that selects it then hits instead of fetching it back. A warmup of
        this layer still in flight lands first: its rows must not land in a slot handed out here.
        `padded`: `reqs` may hold -1 for padded batch rows (SGLang's padding, as a CUDA graph pads
        its batch): they touch nothing and get row -1, which `write_slots(padded=True)` skips (two more ops)."""
        self._check_layer(layer)
        self._check_ungrouped(layer, "reserve", "reserve_group")
        return self._reserve(layer, [layer], reqs, positions, validate, padded)[0]

    def reserve_group(self, anchor: int, reqs: torch.Tensor, positions: torch.Tensor, validate: bool = True,
                      padded: bool = False) -> list[torch.Tensor]:
        """`reserve` for every layer of anchor `anchor`'s group (the anchor first), one resolver call on
        the group's slot table: the newest token takes the same slot in each layer's rows. Returns each
        layer's slot rows int64 [b]."""
        self._check_layer(anchor)
        if self.cfg.anchors[anchor] != anchor:
            raise ValueError(f"reserve_group: layer {anchor} is a shared-index layer (anchor "
                             f"{self.cfg.anchors[anchor]}); reserve its group at the anchor")
        return self._reserve(anchor, self.cfg.group_layers(anchor), reqs, positions, validate, padded)

    def _reserve(self, anchor: int, layers: list[int], reqs, positions, validate: bool, padded: bool):
        for layer in layers:
            for t in self._layer_fence.pop(layer, []):
                self.engine.wait(t)
        reqs = reqs.to(self.device, torch.int64)
        positions = positions.to(self.device, torch.int64)
        if validate:
            self._check_batch(reqs)
        if self.trace is not None:
            for layer in layers:
                self.trace.touch(layer, reqs, positions + 1, positions.unsqueeze(1))
        groups = self.groups_of(reqs, padded)
        a = assign(self.hot, self._table[anchor], groups, positions + 1, positions.unsqueeze(1),
                   backend=self.resolver_backend)
        # the newest token of a real row always gets a slot: its absolute row in two ops
        local = torch.add(a.slots[:, 0], groups, alpha=self.cfg.hot_slots_per_request)
        out = []
        for layer in layers:
            rows = local + self.slots.hot_base(layer)
            out.append(torch.where(a.slots[:, 0] >= 0, rows, -1) if padded else rows)
        return out

    def admit(self, layer: int, reqs: torch.Tensor, positions: torch.Tensor, data: torch.Tensor,
              validate: bool = True) -> None:
        """Put the newest rows (already written to the host by the engine) into hot slots as the
        most recently used entries, so the step that selects them does not fetch them back.
        reqs int64 [b] (unique, open), positions int64 [b], data uint8 [b, row_bytes].
        `validate=False` skips the batch checks (a host sync) on a trusted hot path."""
        check_rows(data, reqs.numel(), self.cfg.row_bytes, "admit")
        rows = self.reserve(layer, reqs, positions, validate)
        self.write_slots(rows, data)

    def write_slots(self, rows: torch.Tensor, data: torch.Tensor, padded: bool = False) -> None:
        """data uint8 [b, row_bytes] -> slot rows `rows` [b] (reserve's). `padded`: rows -1 (padded
        batch rows) are skipped, one FlashTrans launch on CUDA; otherwise one index_copy_."""
        data = data.to(self.device)
        if not padded:
            self.slots.rows.index_copy_(0, rows, data)
            return
        b = rows.numel()
        if b > self._iota.numel():
            raise ValueError(f"write_slots(padded=True): {b} rows, more than the store's {self._iota.numel()} request "
                             "rows (a padded batch holds at most one row per request row; --max-running-requests)")
        copy_rows(data, self._iota[:b], self.slots.rows, rows, self.transfer_backend)

    def append(self, layer: int, reqs: torch.Tensor, positions: torch.Tensor, data: torch.Tensor,
               req_to_host: torch.Tensor) -> None:
        """The step's newest latent rows: data uint8 [b, row_bytes] at token `positions` [b]
        -> host pool (write-back) and straight into a hot slot (`admit`)."""
        reqs = reqs.to(self.device, torch.int64)
        positions = positions.to(self.device, torch.int64)
        check_rows(data, reqs.numel(), self.cfg.row_bytes, "append")
        locs = req_to_host.to(self.device)[reqs, positions]
        self.write_host(layer, locs, data)
        self.admit(layer, reqs, positions, data)

    def admit_from_host(self, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor, positions: torch.Tensor,
                        req_to_host: torch.Tensor, padded: bool = False) -> int:
        """Make rows that are already final in the host pool the most recently used entries of
        their hot buffers, oldest column first (one set per request, as a step would), copying
        the bytes host -> slot. For rows that became final after the step that wrote them:
        accepted speculative tokens (store/verify.py). Waits for the moves still pending on this
        layer's hot slots first, so none can land over an admitted row.

        reqs int64 [b] (open), seq_lens int64 [b], positions int64 [b, m] (< seq_lens, -1 padded).
        Returns the number of rows copied, int64 0-d on the store's device (already-resident rows
        are not copied again). Static shapes, no host read: a speculative step on CUDA runs this
        every layer. `padded`: `reqs` may hold -1 for padded batch rows (a CUDA graph's batch): they get
        no slot and change nothing (`assign`), whatever their positions."""
        self._check_layer(layer)
        self._check_ungrouped(layer, "admit_from_host (MTP verify)", None)
        reqs = reqs.to(self.device, torch.int64)
        seq_lens = seq_lens.to(self.device, torch.int64)
        positions = positions.to(self.device, torch.int64)
        for t in self._layer_fence.pop(layer, []):
            self.engine.wait(t)
        for mb in range(self.cfg.ring_micro_batches):
            fence = self._group_fence.pop(self._ring_group(layer, mb), None)
            if fence is not None:
                self.engine.wait(fence)
        if self.trace is not None:
            self.trace.touch(layer, reqs, seq_lens, positions)
        groups = self.groups_of(reqs, padded)
        a = assign(self.hot, self._table[layer], groups, seq_lens, positions, backend=self.resolver_backend)
        dst = self._hot_abs(layer, groups, a.slots)
        src = req_to_host.to(self.device)[reqs.unsqueeze(1), positions.clamp(min=0)]
        moved = a.miss
        copy_rows(self.host.rows[layer], torch.where(moved, src, -1).reshape(-1), self.slots.rows,
                  torch.where(moved, dst, -1).reshape(-1), self.transfer_backend)
        m = moved.sum()
        self.counters.rows_h2d[layer] += m
        return m

    # --- views -----------------------------------------------------------------------------
    @property
    def slot_rows(self) -> torch.Tensor:
        """uint8 [S, row_bytes]: the flat slot space every slot table indexes."""
        return self.slots.rows

    def layer_rows(self, layer: int) -> torch.Tensor:
        """uint8 [R*N, row_bytes]: one layer's hot slots (a view into `slot_rows`)."""
        return self.slots.layer_rows(layer)

    def usage(self, host_tokens_used: int | None = None) -> dict:
        """Host and hot-buffer occupancy. An engine that hands out host locations with its own
        allocator (SGLang) passes its count as `host_tokens_used`."""
        return {
            "host_tokens_used": self.host.used_tokens if host_tokens_used is None else host_tokens_used,
            "host_tokens_capacity": self.host.capacity_tokens,
            "hot_requests_open": self.open_requests,
            "hot_slots_used": self._used_slots(),
            "hot_slots_capacity": self.cfg.num_layers * self.cfg.hot_slots_total,
            "host_bytes": self.cfg.host_bytes,
            "device_bytes": self.cfg.device_bytes,
            "prefetch": {**self.engine.stats(),
                         "speculative": self.spec.stats() if self.spec is not None else None},
        }

    # --- internals -----------------------------------------------------------------------
    def _used_slots(self) -> int:
        """Occupied (layer, hot buffer, slot) triples: a group's table counts once per layer."""
        if not self._grouped:
            return self.hot.used_slots()
        per_table = (self.hot.slot_to_token >= 0).sum(dim=(1, 2)).tolist()
        return sum(per_table[t] for t in self._table)

    def _check_ungrouped(self, layer: int, what: str, instead: str | None) -> None:
        """Refuse a per-layer call on a layer that shares its slot table with other layers."""
        if self._grouped and len(self.cfg.group_layers(self.cfg.anchors[layer])) > 1:
            fix = (f"use {instead}({self.cfg.anchors[layer]}, ...) at its anchor" if instead else
                   "this path is not implemented for shared-index layers (speculative decoding / MTP with "
                   "GLM-5.2-style indexer_types 'shared'); serve without --speculative-algorithm")
            raise NotImplementedError(f"{what} on layer {layer}: it shares its LRU slot table with layers "
                                      f"{self.cfg.group_layers(self.cfg.anchors[layer])} (shared-index layers, "
                                      f"StoreConfig.layer_anchors); {fix}")

    def _submit(self, plan: CopyPlan) -> Ticket:
        """Plans carry one entry per (request, top-k entry), -1 where nothing moves (static shapes
        for device engines); an engine in another process gets only the live entries (a host sync
        it needs anyway to address its runs). The inline engine runs the plan here through run_plan,
        whose copies, tags and row count skip the -1 entries themselves: compacting for it would only
        add a mask, two selections and their host syncs per plan."""
        if not self.engine.ordered_on_device and plan.kind != "zero" and type(self.engine) is not InlineEngine:
            keep = (plan.src_idx >= 0) & (plan.dst_idx >= 0)
            plan.src_idx, plan.dst_idx = plan.src_idx[keep], plan.dst_idx[keep]
        return self.engine.submit(plan)

    def _ring_group(self, layer: int, micro_batch: int) -> int:
        return (layer % 2) * self.cfg.ring_micro_batches + micro_batch

    def _hot_abs(self, layer: int, groups: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """Absolute slot-space rows of local slots `local` [b, x] of hot buffers `groups` [b]."""
        n = self.cfg.hot_slots_per_request
        base = self.slots.hot_base(layer) + groups.unsqueeze(1) * n
        return torch.where(local >= 0, base + local, -1)

    def _hot_rows_of(self, step: StepPlan) -> torch.Tensor:
        """int32 [b, k]: every entry's hot-slot row after commit (misses: their LRU slot)."""
        read = step.read_slots.to(torch.int64)
        size = self.slots.total_slots - self.slots.ring_base
        lut = torch.full((size + 1,), -1, dtype=torch.int64, device=self.device)
        src = step.ring_dst if step.spec_dst is None else torch.where(step.ring_dst >= 0, step.ring_dst,
                                                                        step.spec_dst)
        lut.index_copy_(0, torch.where(src >= 0, src - self.slots.ring_base, size), step.hot_dst)
        staged_row = read >= self.slots.ring_base
        via = lut[torch.where(staged_row, read - self.slots.ring_base, size)]
        return torch.where(staged_row, via, read).to(torch.int32)

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.cfg.num_layers:
            raise IndexError(f"layer {layer} out of range: the store has {self.cfg.num_layers} layers")

    def _check_req(self, req: int) -> None:
        if not 0 <= int(req) < self.cfg.max_requests:
            raise KeyError(f"request index {req} out of range [0, {self.cfg.max_requests}); "
                           "raise --max-running-requests")

    def _check_open(self, req: int) -> None:
        self._check_req(req)
        if not self.is_open(req):
            raise KeyError(f"request index {req} has no open hot buffer (call open() first, "
                           "or the request already finished)")

    def _check_batch(self, reqs: torch.Tensor) -> None:
        rl = reqs.tolist()
        for r in rl:
            self._check_open(r)
        if len(set(rl)) != len(rl):
            raise ValueError(f"request indices repeat in one batch: {rl}")
