"""HostLatentPool: the full latent history of every request, in host memory.

Memory: one uint8 tensor `rows [num_layers, capacity_tokens, row_bytes]`, layer-first like
SGLang's DSA pools, owned by this object for the life of the process. It lives in an anonymous
shared-memory segment (`self.segment`, memfd) so a prefetch worker process maps the same bytes.
With `pin=True` (CUDA machines) the segment is also page-locked in place with chunked
cudaHostRegister (sgl_ess.kernels.uva.register_host) so GPU kernels read and write it directly
(zero-copy); no `pin_memory()` copy, whose caching allocator would round a 200 GB pool up to
the next power of two. The segment is excluded from core dumps and sealed against resizing, and
with `lock=True` (--ess-lock-host-memory) mlocked against swap (sgl_ess.memory.protection).

Token locations ("host locs", 0..capacity-1) are handed out by `alloc` and returned by
`free`, which zeroes every layer's row first: rows hold user data and must not leak from one
request to the next. An engine with its own token allocator (SGLang's) may skip `alloc` and
use `write`/`clear` on the locations it hands out.
"""
from __future__ import annotations

import torch

from sgl_ess.memory.shared_segment import HOST_LABEL, SharedSegment


class HostPoolFullError(RuntimeError):
    """The host latent pool has fewer free token rows than asked for."""


class HostLatentPool:
    def __init__(self, num_layers: int, capacity_tokens: int, row_bytes: int, *, pin: bool = False,
                 lock: bool = False, fd: int | None = None, readonly: bool = False):
        """`fd` given: map another process's pool (a TP rank sharing its owner's pool on this node,
        sgl_ess.integration.sglang.pools.shared_host_pool); such a pool is a reader (`writer` False): it
        never writes or zeroes rows, and with `readonly` it is mapped PROT_READ (a debug mode)."""
        self.num_layers = num_layers
        self.capacity_tokens = capacity_tokens
        self.row_bytes = row_bytes
        nbytes = num_layers * capacity_tokens * row_bytes
        self.writer = fd is None
        if fd is None:
            self.segment = SharedSegment(nbytes, label=HOST_LABEL, lock=lock)
        else:
            self.segment = SharedSegment.attach(fd, nbytes, label=HOST_LABEL, lock=lock, readonly=readonly)
        self.rows = self.segment.tensor(torch.uint8, (num_layers, capacity_tokens, row_bytes))
        self.registration = None
        if pin:
            from sgl_ess.kernels.uva import register_host

            self.registration = register_host(self.rows, readonly=readonly)   # each process its own mapping
        self.pinned = pin
        # free stack: _free[:_n_free] are free locations
        self._free = torch.arange(capacity_tokens - 1, -1, -1, dtype=torch.int64)
        self._n_free = capacity_tokens
        self._allocated = torch.zeros(capacity_tokens, dtype=torch.bool)

    def close(self) -> None:
        """Give back the page-locking (cudaHostUnregister) once the device is done with the rows: a
        registration outlives nothing that owns it (issue 32). The rows stay mapped; idempotent."""
        if self.registration is None:
            return
        torch.cuda.synchronize()          # no queued kernel may still read or write them through UVA
        self.registration.unregister()
        self.registration = None

    # --- allocation -------------------------------------------------------------------
    @property
    def free_tokens(self) -> int:
        return self._n_free

    @property
    def used_tokens(self) -> int:
        return self.capacity_tokens - self._n_free

    def can_alloc(self, n_tokens: int) -> bool:
        return 0 <= n_tokens <= self._n_free

    def alloc(self, n_tokens: int) -> torch.Tensor:
        """Take `n_tokens` free locations -> int64 [n_tokens] (CPU). Raises HostPoolFullError."""
        if n_tokens < 0:
            raise ValueError(f"alloc(n_tokens={n_tokens}): expected >= 0")
        if n_tokens > self._n_free:
            raise HostPoolFullError(
                f"host latent pool full: asked for {n_tokens} token rows, {self._n_free} free of "
                f"{self.capacity_tokens} ({self.num_layers} layers x {self.row_bytes} B each). "
                "Raise --ess-memory-pool-size-gb (ess_config.memory_pool_size_gb) or admit fewer requests")
        start = self._n_free - n_tokens
        locs = self._free[start:self._n_free].clone()
        self._n_free = start
        self._allocated[locs] = True
        return locs

    def free(self, locs: torch.Tensor) -> None:
        """Return locations; their rows are zeroed in every layer first (clear-on-release)."""
        locs = locs.to("cpu", torch.int64).reshape(-1)
        if locs.numel() == 0:
            return
        self._check_locs(locs)
        if not bool(self._allocated[locs].all()) or locs.unique().numel() != locs.numel():
            raise ValueError("HostLatentPool.free: some locations are not allocated or repeat (double free)")
        self.clear(locs)
        self._allocated[locs] = False
        self._free[self._n_free:self._n_free + locs.numel()] = locs
        self._n_free += locs.numel()

    # --- data ------------------------------------------------------------------------
    def write(self, layer: int, locs: torch.Tensor, rows: torch.Tensor) -> None:
        """rows uint8 [n, row_bytes] (any device) -> host rows at `locs` of `layer`."""
        self._check_layer(layer)
        locs = locs.to("cpu", torch.int64).reshape(-1)
        if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != self.row_bytes \
                or rows.shape[0] != locs.numel():
            raise ValueError(
                f"HostLatentPool.write: rows must be uint8 [{locs.numel()}, {self.row_bytes}], "
                f"got {rows.dtype} {list(rows.shape)}")
        self._check_locs(locs)
        self.rows[layer].index_copy_(0, locs, rows.to("cpu"))

    def read(self, layer: int, locs: torch.Tensor) -> torch.Tensor:
        """uint8 [n, row_bytes]: a copy in the ordinary torch CPU heap, not in the protected segment
        (tests and tools; the serving path never calls it)."""
        self._check_layer(layer)
        locs = locs.to("cpu", torch.int64).reshape(-1)
        self._check_locs(locs)
        return self.rows[layer].index_select(0, locs)

    def clear(self, locs: torch.Tensor) -> None:
        locs = locs.to("cpu", torch.int64).reshape(-1)
        if locs.numel():
            self._check_locs(locs)
            self.rows[:, locs] = 0

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} out of range: the store has {self.num_layers} layers")

    def _check_locs(self, locs: torch.Tensor) -> None:
        if locs.numel() and (int(locs.min()) < 0 or int(locs.max()) >= self.capacity_tokens):
            raise IndexError(
                f"host location out of range [{int(locs.min())}, {int(locs.max())}]: the pool has "
                f"{self.capacity_tokens} token rows (--ess-memory-pool-size-gb sets the capacity)")
