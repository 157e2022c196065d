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
  record_timed(s)         a timing event (benchmarks only; CUDA)
  launch(s, fn)           run fn's kernels on s (CUDA: now, queued on s, and fn's result back;
                          the double: when something waits for them, and None)
  keep_alive(t, s)        t's memory is not reused before s's work so far is done (record_stream)
Memory: none (streams and events belong to their callers).
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
    def launch(stream, fn):
        with torch.cuda.stream(stream):
            return fn()

    @staticmethod
    def keep_alive(t: torch.Tensor, stream) -> None:
        t.record_stream(stream)
