"""StreamEngine (CUDA): CopyPlans run as FlashTrans kernels on a side stream of this process.

The device layer of the data path on a GPU. `submit` forks the side stream from the current
(compute) stream - so a plan sees every index and row the compute stream produced before it -
launches the plan's zero-copy FlashTrans kernel there and records an event; `wait` makes the
current stream wait on that event. Nothing in a step blocks the host or allocates on it, so decode
steps that use it can be captured in CUDA graphs (stream fork/join is capturable); only a release's
zeroing on a PD decode node makes the host wait (`complete`, outside any step).

Ordering replaces tags: the current stream cannot read a ring row before the event of the plan
that fills it, so readers need not check ring tags (`ordered_on_device`). A host row is zeroed
by a kernel on the zero stream, after every copy and every write the compute stream issued before the
release (SGLang's writer stores new rows through a zero-copy view on that stream). Later writes are
ordered after it on the device: a zero plan is one memset per layer with an event after each, and a
host write to layer l (the backends fence before each layer's KV write) waits for layer l's memset
only (`wait_layer`). Only where a writer outside every stream may reuse a released location (a PD
decode node: Mooncake / NIXL write host rows by RDMA) does the store make the host wait for the
zeroing (`complete`); zero plans keep their events in their own table (`zero_layer_events`), never
in `PlanEvents`, which may forget a finished event past its cap.

Priorities: every copy between host rows, hot slots and rings runs on one high-priority side
stream, in submission order (a warmup lands before the immediate fetch that may evict into its
slots: they must not reorder). Zeroing released rows runs on a second, low-priority stream, after
the copies submitted before it: nothing reads a released row, so an immediate fetch does not queue
behind 61 layers of memset. Rows and plans per tier are counted (`stats()`).

Streams and events go through a runtime (stream_runtime.CudaStreams on a GPU); the CPU suite runs
this class with a runtime whose streams complete work late and out of order and with the torch
kernels (tests/unit/prefetch/test_stream_engine_gpu_fake.py).

Memory: borrows the store's StoreMemory; owns two streams, one event per outstanding plan (at most
MAX_EVENTS: `PlanEvents`), one per layer per zero plan not yet fenced (`zero_layer_events`; `drain`
empties it), a one-row zero buffer, and per-tier row counters on the device (read
only by `stats()`).
"""
from __future__ import annotations

import time

import torch

from sgl_ess.kernels.flashtrans import copy_rows, move_rows
from sgl_ess.prefetch.engine import FetchEngine, Ticket
from sgl_ess.prefetch.memory import StoreMemory
from sgl_ess.prefetch.plan import TIERS, CopyPlan
from sgl_ess.prefetch.stream_runtime import CudaStreams

MAX_EVENTS = 4096


class PlanEvents:
    """The events of submitted plans nobody has waited on yet, by plan id, at most `cap`.

    Plans can outlive their readers (a speculative staging nobody claims), so the table is bounded.
    An event cannot simply be forgotten: a later wait on its ticket would then order nothing and the
    compute stream could read a row before the copy that fills it. Past the cap, the events whose
    work has finished are forgotten (a wait on them needs no ordering); if half the cap is still
    pending, `join()` orders everything submitted so far before the compute stream's next work (no
    host sync) and returns an event recorded after it all; the table is emptied: every forgotten
    ticket is then ordered, and `done` asks that event for them. `joins` counts those.
    """

    def __init__(self, join, cap: int = MAX_EVENTS):
        self.join, self.cap = join, cap
        self.pending: dict[int, object] = {}
        self.joins = 0
        self.joined_upto = -1           # plans up to this id were forgotten by the last join
        self.join_event = None

    def add(self, plan_id: int, event) -> None:
        self.pending[plan_id] = event
        if len(self.pending) > self.cap:
            for pid in [p for p, ev in self.pending.items() if ev.query()]:
                del self.pending[pid]
            if len(self.pending) > self.cap // 2:
                self.join_event = self.join()
                self.joined_upto = max(self.pending)
                self.pending.clear()
                self.joins += 1

    def done(self, plan_id: int) -> bool:
        """Has the device finished this plan (as far as the events say)?"""
        ev = self.pending.get(plan_id)
        if ev is None and plan_id <= self.joined_upto:
            ev = self.join_event
        return ev is None or ev.query()

    def pop(self, plan_id: int):
        return self.pending.pop(plan_id, None)

    def clear(self) -> None:
        self.pending.clear()

    def __len__(self) -> int:
        return len(self.pending)


class StreamEngine(FetchEngine):
    name = "stream"
    ordered_on_device = True

    def __init__(self, mem: StoreMemory, backend: str = "auto", device: torch.device | str | None = None,
                 timing: bool = False, runtime=None, zero_backend: str = "triton"):
        super().__init__(mem, backend)
        self.timing = timing           # record timing events around each plan (benchmarks; stats() syncs)
        self._timed: dict[str, list] = {t: [] for t in TIERS}
        self.device = torch.device(device) if device is not None else mem.slots.device
        if runtime is None:
            if not torch.cuda.is_available():
                raise RuntimeError("the stream engine needs CUDA; on CPU use --ess-prefetch-engine worker or inline")
            if self.device.type != "cuda":
                raise ValueError(f"StreamEngine: the slot space is on {self.device}, expected a CUDA device")
            runtime = CudaStreams(self.device)
        if timing and not getattr(runtime, "requires_cuda", False):
            raise ValueError("StreamEngine: timing=True needs CUDA events")
        self.rt = runtime
        self.zero_backend = zero_backend
        self.stream = runtime.stream("high")        # every copy, in submission order
        self.zero_stream = runtime.stream("low")    # zeroing released rows: nothing reads them
        self.events = PlanEvents(self._join)
        self.zero_layer_events: dict[int, list] = {}   # zero plan id -> event after each layer's memset
        self.zero_row = torch.zeros((1, mem.slots.shape[1]), dtype=torch.uint8, device=self.device)
        self.rows = {t: torch.zeros((), dtype=torch.int64, device=self.device) for t in TIERS}
        self.zero_rows = torch.zeros((), dtype=torch.int64, device=self.device)
        self._touched: list = []       # side streams given work since the compute stream last joined them

    def submit(self, plan: CopyPlan) -> Ticket:
        t = self._assign_id(plan)
        if plan.tier == "speculative" and plan.deadline_s is not None and time.monotonic() > plan.deadline_s:
            self.tiers.dropped(plan.tier)
            return t
        rt = self.rt
        stream = self.zero_stream if plan.kind == "zero" else self.stream
        rt.wait_stream(stream, rt.current())     # after every index and row the compute stream made
        if stream not in self._touched:
            self._touched.append(stream)
        if plan.kind == "zero":
            rt.wait_stream(stream, self.stream)   # and after every copy submitted before it
            return self._submit_zero(t, plan, stream)

        def work():
            # the plan's index tensors: copied to the device on this stream (a no-op when the resolver
            # made them there), read by the kernels queued after the copy
            src = plan.src_idx.to(self.device, non_blocking=True)
            dst = plan.dst_idx.to(self.device, non_blocking=True)
            self._run(plan, src, dst)
            return src, dst

        if self.timing:
            t0 = rt.record_timed(stream)
        used = rt.launch(stream, work)
        if self.timing:
            self._timed[plan.tier].append((t0, rt.record_timed(stream)))
        ev = rt.record(stream)
        for x in used or ():
            rt.keep_alive(x, stream)              # made on the compute side, read on this stream
        self.events.add(plan.plan_id, ev)
        return t

    def _submit_zero(self, t: Ticket, plan: CopyPlan, stream) -> Ticket:
        """A zero plan, one memset per layer on the zero stream, an event after each: a host write to
        layer l waits for layer l's memset only (`wait_layer`), not for every layer's. Its events stay
        out of `PlanEvents` (which may forget finished events): `complete` always finds them."""
        rt, mem = self.rt, self.mem
        idx = {}

        def indices():
            dst = plan.dst_idx.to(self.device, non_blocking=True)
            idx["dst"], idx["src"] = dst, torch.where(dst >= 0, 0, -1)
            self.zero_rows += (dst >= 0).sum()    # its own counter: the zero stream runs beside the copies
            return (dst,)

        def layer_work(layer):
            def work():
                copy_rows(self.zero_row, idx["src"], mem.host[layer], idx["dst"], self.zero_backend)
            return work

        for x in rt.launch(stream, indices) or ():
            rt.keep_alive(x, stream)
        events = []
        for layer in range(mem.host.shape[0]):
            rt.launch(stream, layer_work(layer))
            events.append(rt.record(stream))
        self.zero_layer_events[plan.plan_id] = events
        return t

    def wait_layer(self, ticket: Ticket, layer: int) -> bool:
        events = self.zero_layer_events.get(ticket.plan_id)
        if events is None:                    # not a zero plan, or already ordered as a whole
            self.wait(ticket)
            return True
        self.rt.wait_event(self.rt.current(), events[layer])
        return False

    def _run(self, plan: CopyPlan, src: torch.Tensor, dst: torch.Tensor) -> None:
        """One launch per plan (the row count added in the kernel, flashtrans.py)."""
        mem, count = self.mem, self.rows[plan.tier]
        if plan.kind == "h2s":
            copy_rows(mem.host[plan.layer], src, mem.slots, dst, self.backend, count=count)
        elif plan.kind == "s2h":
            copy_rows(mem.slots, src, mem.host[plan.layer], dst, self.backend, count=count)
        elif plan.kind == "move":
            # the staged rows just read are zeroed in the same launch (static shapes, no host sync). Their
            # tags may stay: on a device stream nothing re-checks ring tags, and a speculative staging is
            # claimed once.
            move_rows(mem.slots, src, dst, self.backend, count=count)
        else:
            copy_rows(mem.slots, src, mem.slots, dst, self.backend, count=count)

    def _order_all(self):
        """The compute stream's next work waits for everything both side streams were given. Only
        streams given work since the last join are waited on: inside a CUDA graph capture, a wait
        on a stream the capture never forked would be a wait on work outside the graph."""
        cur = self.rt.current()
        for s in self._touched:
            self.rt.wait_stream(cur, s)
        self._touched = []
        return cur

    def _join(self):
        """Order every plan submitted so far before the compute stream's next work; an event after them."""
        return self.rt.record(self._order_all())

    def wait(self, ticket: Ticket) -> None:
        zero = self.zero_layer_events.pop(ticket.plan_id, None)
        ev = zero[-1] if zero is not None else self.events.pop(ticket.plan_id)
        if ev is not None:
            self.rt.wait_event(self.rt.current(), ev)

    def complete(self, ticket: Ticket) -> None:
        """The host waits for a zero plan's last event (a host sync: the zeroing of released rows where a
        writer outside every stream may reuse them, a PD decode node). Any other plan: its event, or
        none when `PlanEvents` forgot it - only finished events are forgotten (past its cap), and a
        join's event is after the rest. Never raises: it runs on SGLang's allocator free."""
        zero = self.zero_layer_events.pop(ticket.plan_id, None)
        if zero is not None:
            self.rt.synchronize(zero[-1])
            return
        ev = self.events.pop(ticket.plan_id)
        if ev is None and ticket.plan_id <= self.events.joined_upto:
            ev = self.events.join_event           # forgotten by a join: the join's event is after it
        if ev is not None:
            self.rt.synchronize(ev)

    def done(self, ticket: Ticket) -> bool:
        zero = self.zero_layer_events.get(ticket.plan_id)
        if zero is not None:
            return bool(zero[-1].query())
        return self.events.done(ticket.plan_id)

    def drain(self) -> None:
        """Order everything submitted so far before the current stream's next work (no host sync)."""
        self._order_all()
        self.events.clear()
        self.zero_layer_events.clear()

    def stats(self) -> dict:
        s = super().stats()
        s["event_joins"] = self.events.joins
        for tier, n in self.rows.items():
            s["tiers"][tier]["rows"] = int(n) + (int(self.zero_rows) if tier == "background" else 0)  # metrics only
            timed = self._timed[tier]
            if timed:
                timed[-1][1].synchronize()
            # device time between the plan's start and end events (timing=True), else not measured
            s["tiers"][tier]["busy_s"] = sum(a.elapsed_time(b) for a, b in timed) / 1e3 if self.timing else None
        return s
