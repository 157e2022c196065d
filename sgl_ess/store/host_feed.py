"""HostFeed: small device tensors the host reads later, without waiting for the device.

The speculative tier's bookkeeping on a device-ordered engine (CUDA's side-stream engine) must not
sync the host inside a layer: its precision counts and, for predictors that run on the host
(last_step, score_ema, lstm), the top-k they learn from, reach the host asynchronously. `push`
copies the tensors into host memory on the compute stream (pinned on CUDA, so the copy does not
block) and records an event after the copy; `ready` hands back, oldest first, every entry whose
event has completed and never waits. Without a stream runtime (the inline and worker engines,
whose tensors are host tensors already) an entry is ready at once.

The lag is what it costs: a host predictor on CUDA learns from a plan a few layers after it ran
(the device's lead over the host), and the precision gate sees its counts a window later.

Memory: owns the host copies of its entries until `ready` hands them over; `clear` drops them.
"""
from __future__ import annotations

import collections
from typing import Any

import torch


class HostFeed:
    def __init__(self, runtime=None, device: torch.device | str = "cpu"):
        self.rt = runtime                  # stream_runtime.CudaStreams (or the CPU suite's double), or None
        self.device = torch.device(device)
        self._queue: collections.deque = collections.deque()
        self.pushed = 0
        self.delivered = 0

    def push(self, key: Any, tensors: tuple[torch.Tensor, ...]) -> None:
        """Queue host copies of `tensors` (any device), handed back by `ready` with `key`."""
        pin = self.device.type == "cuda"
        host = []
        for t in tensors:
            h = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            h.copy_(t.detach(), non_blocking=pin)
            host.append(h)
        ev = self.rt.record(self.rt.current()) if self.rt is not None else None
        self._queue.append((ev, key, tuple(host)))
        self.pushed += 1

    def ready(self) -> list[tuple[Any, tuple[torch.Tensor, ...]]]:
        """Every queued entry whose copy has completed, oldest first (an entry never overtakes an
        older one that is still in flight)."""
        out = []
        while self._queue and (self._queue[0][0] is None or self._queue[0][0].query()):
            _, key, host = self._queue.popleft()
            out.append((key, host))
        self.delivered += len(out)
        return out

    def clear(self) -> None:
        self._queue.clear()

    def __len__(self) -> int:
        return len(self._queue)
