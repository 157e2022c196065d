"""CudaStreams: the stream API the StreamEngine (stream_engine.py) runs its plans through - the
whole of its device layer besides the kernel table. On a GPU it is torch.cuda's streams and events,
nothing added; the CPU suite swaps in a double whose streams complete work late and out of order
(tests/stream_doubles.py, the "GPU fake"), so the engine's ordering is tested without a GPU.

  stream(priority)        a new stream; "high" for immediate copies, "low" for work nothing waits
                          on soon (zeroing released rows). CUDA: torch.cuda.Stream(priority=...),
                          a lower number is a higher priority; out-of-range values are clamped.
  current()               the compute stream (SGLang's)
  wait_stream(a, b)       a's later work waits for everything b has been given so far
  record(s) / wait_event(s, ev)   an event after s's work so far / s's later work waits for it
  synchronize(ev)         the host waits until ev is done (a host sync; the zeroing of released rows only)
  record_timed(s)         a timing event (benchmarks only; CUDA)
  launch(s, fn)           run fn's kernels on s (CUDA: now, queued on s, and fn's result back;
                          the double: when something waits for them, and None)
  keep_alive(t, s)        t's memory is not reused before s's work so far is done (record_stream)
  map_values(t)           int64 host tensor t (shared memory) -> a handle its values are addressed by
                          (CUDA: t page-locked in place and its device address)
  write_value(s, h, i, v) s writes v to value i after its work so far (a system-scope barrier first)
  wait_value(s, h, i, v)  s's later work waits until value i >= v (written by any process)
The value operations order GPU work of different processes through shared host memory (a host
pool shared by TP ranks, integration/sglang/pools/shared_host_pool.py; kernels/stream_values.py).
Memory: none (streams and events belong to their callers; a mapped value tensor stays registered
while its handle lives).
"""
from __future__ import annotations

import torch

PRIORITY = {"high": -1, "low": 0}


class CudaStreams:
    requires_cuda = True

    def __init__(self, device: torch.device):
        self.device = device

    def stream(self, priority: str):
        return torch.cuda.Stream(self.device, priority=PRIORITY[priority])

    def current(self):
        return torch.cuda.current_stream(self.device)

    @staticmethod
    def wait_stream(waiter, waitee) -> None:
        waiter.wait_stream(waitee)

    @staticmethod
    def record(stream):
        ev = torch.cuda.Event()
        ev.record(stream)
        return ev

    @staticmethod
    def record_timed(stream):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    @staticmethod
    def wait_event(stream, ev) -> None:
        stream.wait_event(ev)

    @staticmethod
    def synchronize(ev) -> None:
        ev.synchronize()

    @staticmethod
    def launch(stream, fn):
        with torch.cuda.stream(stream):
            return fn()

    @staticmethod
    def keep_alive(t: torch.Tensor, stream) -> None:
        t.record_stream(stream)

    def map_values(self, t: torch.Tensor) -> "MappedValues":
        from sgl_ess.kernels import stream_values
        from sgl_ess.kernels.uva import device_pointer, register_host

        if t.dtype != torch.int64 or t.is_cuda or not t.is_contiguous():
            raise ValueError(f"map_values: need a contiguous int64 host tensor, got {t.dtype} on {t.device}")
        stream_values.check_supported(self.device.index if self.device.index is not None else
                                      torch.cuda.current_device())
        reg = register_host(t)
        return MappedValues(t, reg, device_pointer(t.data_ptr()))

    @staticmethod
    def write_value(stream, values: "MappedValues", index: int, value: int) -> None:
        from sgl_ess.kernels import stream_values

        stream_values.write_value(stream.cuda_stream, values.address(index), value)

    @staticmethod
    def wait_value(stream, values: "MappedValues", index: int, value: int) -> None:
        from sgl_ess.kernels import stream_values

        stream_values.wait_value(stream.cuda_stream, values.address(index), value)


class MappedValues:
    """An int64 host tensor page-locked for stream memory operations; `tensor` is its host view."""

    def __init__(self, tensor: torch.Tensor, registration, device_ptr: int):
        self.tensor, self.registration, self.device_ptr = tensor, registration, device_ptr

    def address(self, index: int) -> int:
        if not 0 <= index < self.tensor.numel():
            raise IndexError(f"value {index} of {self.tensor.numel()}")
        return self.device_ptr + 8 * index
