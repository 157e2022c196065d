"""GPU fake: a stand-in for CUDA streams and events (sgl_ess.prefetch.stream_runtime.CudaStreams)
whose side streams complete work late and out of order, so the StreamEngine - the class that ships
on a GPU - runs in the CPU suite with only its kernels (torch) and its streams swapped.

  the compute stream   the host itself: what it is given runs at once (the test's reads and
                       writes are eager torch on CPU, as SGLang's compute stream is to its kernels)
  a side stream        a FIFO of kernels, event records and waits that runs nothing when given:
                       an op runs only when something needs it - the compute stream waits for an
                       event or a stream - or when `progress()` advances a randomly chosen stream
                       by one op (other streams' work completing at any time, out of order)
  events               done once the stream that recorded them reaches them; `query()` says so
  mapping values       asks stream_values.check_supported of a driver double (StockDriver: the
                       attributes a stock driver reports, by cuda.bindings' own enums), as
                       CudaStreams.map_values asks the real driver
  values               an int64 host tensor (shared memory): a write on the compute stream stores at
                       once, on a side stream when that stream reaches it; a wait on the compute
                       stream spins the host until another process (or side stream) stores enough,
                       on a side stream it holds that stream's later ops until then
Within one stream ops keep their order (CUDA's guarantee); across streams only waits order them.
A bug that relies on a stream having run - a read before the wait, a write racing a zeroing on
another stream - then reads stale or wiped rows in a test instead of passing by luck.
"""
from __future__ import annotations

import collections
import random
import time

VALUE_WAIT_TIMEOUT_S = 60.0     # a value another process never writes: fail, as a hung GPU stream would not


class FakeEvent:
    def __init__(self):
        self.finished = False

    def query(self) -> bool:
        return self.finished

    def synchronize(self) -> None:
        raise AssertionError("a host sync (Event.synchronize) in the stream engine's data path")


class FakeStream:
    def __init__(self, name: str):
        self.name = name
        self.ops: collections.deque = collections.deque()


class StockDriver:
    """cuda.bindings.driver as far as kernels/stream_values.py uses it, answering as a stock NVIDIA driver
    (no NVreg_EnableStreamMemOPs): the v2 64-bit stream memory operations are on (attribute 122), the
    legacy v1 API is off (93, 92). Its enums and handle types are cuda.bindings' own, so a query by a
    wrong name or number reads what that name or number means there. `queried` lists the attributes
    asked; `calls` the value operations queued."""

    def __init__(self, attributes: dict | None = None):
        from cuda.bindings import driver

        self._d = driver
        A = driver.CUdevice_attribute                  # noqa: N806 - the enum, spelled as cuda.bindings does
        self.attributes = attributes if attributes is not None else {
            A.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: 1,
            A.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1: 0,
            A.CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1: 0}
        self.queried: list = []
        self.calls: list[tuple] = []

    def __getattr__(self, name):                       # enums, handle types, cuGetErrorString: the real ones
        return getattr(self._d, name)

    def cuInit(self, flags):
        return (self._d.CUresult.CUDA_SUCCESS,)

    def cuDeviceGet(self, ordinal):
        if ordinal != 0:
            return (self._d.CUresult.CUDA_ERROR_INVALID_DEVICE, None)
        return (self._d.CUresult.CUDA_SUCCESS, self._d.CUdevice(ordinal))

    def cuDeviceGetAttribute(self, attr, dev):
        if not isinstance(attr, self._d.CUdevice_attribute):
            raise TypeError(f"cuDeviceGetAttribute: attribute {attr!r} is not a CUdevice_attribute")
        self.queried.append(attr)
        return (self._d.CUresult.CUDA_SUCCESS, self.attributes.get(attr, 0))

    def cuStreamWriteValue64(self, stream, addr, value, flags):
        self.calls.append(("write", int(stream), int(addr), value, flags))
        return (self._d.CUresult.CUDA_SUCCESS,)

    def cuStreamWaitValue64(self, stream, addr, value, flags):
        self.calls.append(("wait", int(stream), int(addr), value, flags))
        return (self._d.CUresult.CUDA_SUCCESS,)


class LateStreams:
    requires_cuda = False
    event_class = FakeEvent

    def __init__(self, seed: int = 0, driver=None):
        self.compute = FakeStream("compute")
        self.streams: list[FakeStream] = []
        self.rng = random.Random(seed)
        self.driver = driver             # a StockDriver on the first mapping unless one is given
        self.host_syncs = 0              # synchronize() calls: the host waited for the device

    # --- the runtime API (stream_runtime.CudaStreams) --------------------------------------
    def stream(self, priority: str) -> FakeStream:
        s = FakeStream(f"{priority}{len(self.streams)}")
        self.streams.append(s)
        return s

    def current(self) -> FakeStream:
        return self.compute

    def wait_stream(self, waiter: FakeStream, waitee: FakeStream) -> None:
        if waitee is self.compute:
            return                                   # the compute stream's work is done already
        self.wait_event(waiter, self.record(waitee))

    def record(self, stream: FakeStream) -> FakeEvent:
        ev = self.event_class()
        if stream is self.compute:
            ev.finished = True
        else:
            stream.ops.append(("record", ev))
        return ev

    def record_timed(self, stream):
        raise AssertionError("timing events need CUDA")

    def wait_event(self, stream: FakeStream, ev: FakeEvent) -> None:
        if stream is self.compute:
            self._run_until(ev)
        elif not ev.finished:
            stream.ops.append(("wait", ev))

    def synchronize(self, ev: FakeEvent) -> None:
        """The host waits for the event: the stream that records it runs up to it (and what it waits on)."""
        self.host_syncs += 1
        self._run_until(ev)

    def launch(self, stream: FakeStream, fn):
        if stream is self.compute:
            return fn()
        stream.ops.append(("run", fn))
        return None

    def keep_alive(self, t, stream) -> None:
        pass

    def map_values(self, t):
        from sgl_ess.kernels import stream_values

        if self.driver is None:
            self.driver = StockDriver()
        stream_values.check_supported(0, drv=self.driver)     # what CudaStreams.map_values asks first
        return t

    def write_value(self, stream: FakeStream, values, index: int, value: int) -> None:
        def store():
            values[index] = value
        self.launch(stream, store)

    def wait_value(self, stream: FakeStream, values, index: int, value: int) -> None:
        if stream is self.compute:
            self._spin(values, index, value)
        else:
            stream.ops.append(("value", (values, index, value)))

    # --- the double's own controls -----------------------------------------------------------
    def pending(self, stream: FakeStream) -> int:
        return sum(1 for op in stream.ops if op[0] == "run")

    def progress(self, ops: int = 1) -> int:
        """Advance randomly chosen side streams by up to `ops` ops (work finishing out of order);
        how many ran."""
        done = 0
        for _ in range(ops):
            ready = [s for s in self.streams if s.ops and not (s.ops[0][0] == "wait" and not s.ops[0][1].finished)
                     and not (s.ops[0][0] == "value" and not self._reached(*s.ops[0][1]))]
            if not ready:
                return done
            self._step(self.rng.choice(ready))
            done += 1
        return done

    def finish(self) -> None:
        """Everything given so far runs (as a device synchronize would)."""
        while any(s.ops for s in self.streams):
            for s in self.streams:
                while s.ops:
                    self._step(s)

    def _step(self, s: FakeStream) -> None:
        kind, x = s.ops[0]
        if kind == "wait" and not x.finished:
            self._run_until(x)
        if kind == "value":
            self._spin(*x)
        s.ops.popleft()
        if kind == "run":
            x()
        elif kind == "record":
            x.finished = True

    @staticmethod
    def _reached(values, index: int, value: int) -> bool:
        return int(values[index]) >= value

    def _spin(self, values, index: int, value: int) -> None:
        """Wait for another process to store the value (a side stream of this one may hold it: run them)."""
        deadline = time.monotonic() + VALUE_WAIT_TIMEOUT_S
        while not self._reached(values, index, value):
            if self.progress(1):
                continue
            if time.monotonic() > deadline:
                raise AssertionError(f"a stream waited {VALUE_WAIT_TIMEOUT_S:g} s for value {index} to reach {value} "
                                     f"(it is {int(values[index])}): nobody writes it")
            time.sleep(0.0002)

    def _run_until(self, ev: FakeEvent) -> None:
        if ev.finished:
            return
        owner = next((s for s in self.streams if any(op[1] is ev for op in s.ops)), None)
        if owner is None:
            raise AssertionError("waiting on an event no stream will ever record")
        while not ev.finished:
            self._step(owner)


class LaggedStreams(LateStreams):
    """LateStreams whose compute stream also runs ahead of the host: an event recorded on it (the
    end of an asynchronous device -> host copy, store/host_feed.py) completes only after `lag`
    more events were recorded there - as a GPU that finishes a layer's top-k while the host has
    already queued later layers."""

    def __init__(self, seed: int = 0, lag: int = 2):
        super().__init__(seed)
        self.lag = lag
        self._compute_events: list = []

    def record(self, stream):
        if stream is not self.compute:
            return super().record(stream)
        ev = self.event_class()
        self._compute_events.append(ev)
        if len(self._compute_events) > self.lag:
            self._compute_events.pop(0).finished = True
        return ev


class DeviceComputeStreams(LateStreams):
    """LateStreams whose compute stream also runs late, as a GPU's runs behind the host that queues
    its work: only `progress()`, `finish()` or a wait runs it. For orderings that must hold on the
    device, not on the host (two processes' compute streams ordered through shared memory)."""

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.device_compute = self.stream("compute")     # self.compute stays the host (runs at once)

    def current(self) -> FakeStream:
        return self.device_compute
