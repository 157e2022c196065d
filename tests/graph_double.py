"""A CUDA graph double for the CPU suite (GPU fake): capture a callable's tensor ops once, replay
them later on the same tensors, with the rules a real capture enforces.

  capture   runs the callable once under a TorchDispatchMode that records every ATen op with its
            argument and result tensors (the tensors stay alive: a graph's memory pool). Python runs
            only here, as in a real capture: host state it changes is changed once. No kernel runs
            in a real capture, so afterwards every tensor that existed before is restored to what it
            held (the ops ran here only to give Python its shapes), and every tensor the capture
            allocated holds junk until the first replay - a cache first filled inside a capture, or
            read by another graph, shows up as junk.
  replay    re-runs the recorded ops in order on the same tensors: views are kept (they alias
            already), in-place and out= ops run again, and every other op's result is copied into
            the tensor it returned at capture (a graph's outputs live at fixed addresses). No Python
            of the captured code runs.
  refused   (GraphCaptureError) what a CUDA capture cannot hold: a host read (`.item()`, `bool()`,
            `torch.equal`, `.tolist()`, `.numpy()`), a data-dependent shape (`nonzero`, boolean
            indexing, `masked_select`, `unique`, `repeat_interleave` without `output_size`), a host
            value turned into a tensor (`torch.tensor(list)`: a pageable copy into the graph), and
            with `CaptureStreams` (the stream double below) side-stream work the capture never
            forked from or joined back into the capturing stream.

What it cannot see: kernels that are not ATen ops (none run on CPU), and a real capture's memory
addresses (tensors here are kept alive instead).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tests.stream_doubles import FakeEvent, LateStreams

aten = torch.ops.aten


class GraphCaptureError(AssertionError):
    pass


HOST_READS = {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default}
DYNAMIC_SHAPES = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
                  aten.unique_consecutive.default, aten.unique_dim.default}
NO_KERNEL = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default}
HOST_VALUES = {aten.lift_fresh.default, aten.lift_fresh_copy.default}


def _refuse(func, args, kwargs) -> None:
    if func in HOST_READS:
        raise GraphCaptureError(f"{func}: a host read during capture (the host would wait for the device)")
    if func in DYNAMIC_SHAPES:
        raise GraphCaptureError(f"{func}: a data-dependent shape during capture")
    if func in HOST_VALUES:
        raise GraphCaptureError(f"{func}: a host value (torch.tensor of Python data) copied into the graph during "
                                "capture; it would be frozen at its capture-time value")
    if func.overloadpacket is aten.repeat_interleave and kwargs.get("output_size") is None:
        raise GraphCaptureError("repeat_interleave without output_size: a data-dependent shape during capture")
    if func.overloadpacket in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        for t in tree_flatten(args[1])[0]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.bool:
                raise GraphCaptureError(f"{func} with a boolean mask: a data-dependent shape during capture")


class Graph:
    """One captured step: `capture(fn)` then `replay()` as often as wanted."""

    def __init__(self, streams: "CaptureStreams | None" = None):
        self.ops: list[tuple] = []
        self.streams = streams
        self.captured = False

    def capture(self, fn):
        if self.captured:
            raise GraphCaptureError("a graph is captured once")
        tolist, numpy = torch.Tensor.tolist, torch.Tensor.numpy

        def no_read(*_a, **_k):
            raise GraphCaptureError("a host read (.tolist() / .numpy()) during capture")
        if self.streams is not None:
            self.streams.begin_capture()
        torch.Tensor.tolist, torch.Tensor.numpy = no_read, no_read
        rec = _Recorder(self.ops)
        try:
            with rec:
                out = fn()
        finally:
            torch.Tensor.tolist, torch.Tensor.numpy = tolist, numpy
        if self.streams is not None:
            self.streams.end_capture()
        rec.undo()
        self.captured = True
        return out

    def replay(self) -> None:
        if not self.captured:
            raise GraphCaptureError("replay before capture")
        for func, args, kwargs, outs, kind in self.ops:
            if kind == "view":
                continue
            res = func(*args, **kwargs)
            if kind != "functional":
                continue
            for kept, new in zip(outs, tree_flatten(res)[0]):
                if isinstance(kept, torch.Tensor):
                    if kept.shape != new.shape:
                        raise GraphCaptureError(f"{func}: shape {tuple(new.shape)} at replay, "
                                                f"{tuple(kept.shape)} at capture")
                    kept.copy_(new)

    @property
    def op_count(self) -> int:
        return sum(1 for op in self.ops if op[4] != "view")


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _junk(t: torch.Tensor) -> None:
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(-3 if t.is_signed() else 0xA5)     # -3: an index no padding rule uses; 0xA5 in bytes


class _Recorder(TorchDispatchMode):
    """Records the ops; remembers what the capture wrote into tensors that existed before it (to put
    back) and which storages it allocated (to fill with junk): `undo`, once capture ends."""

    def __init__(self, ops: list):
        super().__init__()
        self.ops = ops
        self.allocated: dict[int, torch.Tensor] = {}      # storage -> one tensor over it
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def undo(self) -> None:
        with torch.no_grad():
            for t, before in reversed(self.saved):
                t.copy_(before)
            for t in self.allocated.values():
                base = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
                _junk(base)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        _refuse(func, args, kwargs)
        schema = func._schema
        if schema.is_mutable:
            given = dict(zip([a.name for a in schema.arguments], args)) | kwargs
            for a in schema.arguments:
                t = given.get(a.name)
                if (a.alias_info is not None and a.alias_info.is_write and isinstance(t, torch.Tensor)
                        and _storage(t) not in self.allocated):
                    self.saved.append((t, t.clone()))
        res = func(*args, **kwargs)
        schema = func._schema
        if schema.is_mutable:
            kind = "mutate"
        elif any(r.alias_info is not None for r in schema.returns):
            kind = "view"
        elif func in NO_KERNEL:
            kind = "view"          # nothing to re-run: its contents are unspecified anyway
        else:
            kind = "functional"
        outs = tree_flatten(res)[0]
        if kind == "functional" or func in NO_KERNEL:
            for t in outs:
                if isinstance(t, torch.Tensor) and t.numel():
                    self.allocated.setdefault(_storage(t), t)
        self.ops.append((func, args, kwargs, outs, kind))
        return res


class _CheckedEvent(FakeEvent):
    """An event the host may not query or wait for while a capture runs (the capture would be
    invalidated, or the host would wait on work that never runs until a replay)."""

    def query(self) -> bool:
        if self.rt.capturing:
            raise GraphCaptureError("an event queried by the host during capture")
        return super().query()

    def synchronize(self) -> None:
        if self.rt.capturing:
            raise GraphCaptureError("the host waits for an event during capture")
        super().synchronize()


class CaptureStreams(LateStreams):
    """LateStreams (side streams completing work late and out of order) that also enforce a CUDA
    capture's stream rules while `Graph.capture` runs: a side stream takes part only after it
    waited on the capturing (compute) stream; work on a stream that did not is refused (it would run
    outside the graph); a captured stream may wait only on events recorded inside the capture; the
    host may not query or wait for an event; and the capture may not end while a forked stream
    still holds work (unjoined). Not modelled: `record_stream` / allocator lifetimes (`keep_alive`
    is a no-op and every captured tensor is kept alive) and host-to-device copies (on CPU a
    `.to(device)` is no op at all). The double cannot
    model side work left from before the capture running beside it, so a capture also refuses to
    begin while any is pending (ESS orders it before the capture: LatentStore.graph_boundary)."""

    event_class = _CheckedEvent

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.capturing = False
        self.forked: list = []
        self.inside: dict[int, object] = {}    # events recorded inside the capture (kept: ids stay theirs)

    def begin_capture(self) -> None:
        busy = [s.name for s in self.streams if s.ops]
        if busy:
            raise GraphCaptureError(f"capture begins with side-stream work pending on {busy}: nothing ordered it "
                                    "before the capture")
        self.capturing, self.forked, self.inside = True, [], {}

    def end_capture(self) -> None:
        self.capturing = False
        left = [s.name for s in self.forked if s.ops]
        if left:
            raise GraphCaptureError(f"capture ended with forked work not joined back ({left}): "
                                    "cudaErrorStreamCaptureUnjoined")

    def _in_capture(self, stream) -> bool:
        return stream is self.compute or any(stream is s for s in self.forked)

    def wait_stream(self, waiter, waitee) -> None:
        if self.capturing and waitee is self.compute and waiter is not self.compute and not self._in_capture(waiter):
            self.forked.append(waiter)
        super().wait_stream(waiter, waitee)

    def record(self, stream):
        ev = super().record(stream)
        ev.rt = self
        if self.capturing and self._in_capture(stream):
            self.inside[id(ev)] = ev
        return ev

    def wait_event(self, stream, ev) -> None:
        if self.capturing and self._in_capture(stream) and id(ev) not in self.inside:
            raise GraphCaptureError("a captured stream waits on an event recorded outside the capture "
                                    "(cudaErrorStreamCaptureIsolation)")
        super().wait_event(stream, ev)

    def launch(self, stream, fn):
        if self.capturing and not self._in_capture(stream):
            raise GraphCaptureError(f"work launched on {stream.name}, a stream the capture never forked: it would "
                                    "run once, outside the graph")
        return super().launch(stream, fn)
