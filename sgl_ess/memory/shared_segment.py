"""SharedSegment: anonymous shared memory (Linux memfd) that a prefetch worker process maps too.

Memory: one `memfd_create` file of `nbytes`, mapped MAP_SHARED in this process. It has no name
in /dev/shm, so nothing can outlive the processes that hold its file descriptor: when the
scheduler and its worker exit (normally, on SIGTERM or SIGKILL) the kernel frees it. Pages are
zero when first touched (user data never leaks in from an earlier owner).

Sharing: pass `segment.fd` to a child (`subprocess.Popen(pass_fds=[fd])`, or SCM_RIGHTS) and
call `SharedSegment.attach(fd, nbytes)` there. Tensors from `tensor()` alias the mapping and keep
it alive; the file descriptor lives as long as this object (a restarted worker needs it again)
and is closed when it goes, so a dropped store gives its memory back.

Protection (sgl_ess.memory.protection): the memfd is sealed against growing and shrinking
right after `ftruncate` (F_SEAL_GROW|F_SEAL_SHRINK|F_SEAL_SEAL); `attach` refuses an fd of another
size or without those seals; every mapping, the owner's and each attached one, is excluded from
core dumps (MADV_DONTDUMP); with `lock=True` (--ess-lock-host-memory) it is also mlocked, in each
process that maps it (RLIMIT_MEMLOCK is per process). A step that fails raises
ProtectedMemoryError: no segment exists unprotected.

On CUDA the owner page-locks the mapping with cudaHostRegister (sgl_ess.kernels.uva) so GPU
kernels read and write it zero-copy; this module itself is device-agnostic.
"""
from __future__ import annotations

import mmap
import os
import warnings

import torch

from sgl_ess.memory.protection import check_sealed, exclude_from_dumps, lock_mapping, memfd_flags, seal_size

# the memfds' names: /proc/PID/smaps shows "/memfd:sgl_ess_host (deleted)" (the host pool,
# sgl_ess.store.host_pool) and "/memfd:sgl_ess_slots (deleted)" (the slot space, store/slot_space.py)
HOST_LABEL = "sgl_ess_host"
SLOTS_LABEL = "sgl_ess_slots"


class SharedSegment:
    def __init__(self, nbytes: int, *, label: str = "sgl_ess", fd: int | None = None, lock: bool = False,
                 readonly: bool = False):
        if nbytes <= 0:
            raise ValueError(f"SharedSegment: nbytes={nbytes}; expected > 0")
        self.nbytes = int(nbytes)
        self.label = label
        self.owner = fd is None
        self.fd = -1
        self.locked = False
        self.writable = not readonly
        if fd is None:
            fd = os.memfd_create(label, memfd_flags())
            try:
                os.ftruncate(fd, self.nbytes)
                seal_size(fd, label)
            except OSError:
                os.close(fd)
                raise
        else:
            check_sealed(fd, self.nbytes, label)
        self.fd = fd
        try:
            # MAP_POPULATE: fault every page in now (start-up), not on the first step that touches it
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            prot = mmap.PROT_READ if readonly else mmap.PROT_READ | mmap.PROT_WRITE
            self._map = mmap.mmap(fd, self.nbytes, flags=flags, prot=prot)
            exclude_from_dumps(self._map, label)
            if lock:
                lock_mapping(self.data_ptr(), self.nbytes, label)
                self.locked = True
        except OSError:
            if self.owner:
                self.close()
            raise

    @classmethod
    def attach(cls, fd: int, nbytes: int, label: str = "sgl_ess", lock: bool = False,
               readonly: bool = False) -> "SharedSegment":
        """Map a segment whose fd this process inherited or received (a worker, another TP rank);
        `lock` as the owner's; `readonly` maps it PROT_READ (a write through it faults)."""
        return cls(nbytes, label=label, fd=fd, lock=lock, readonly=readonly)

    def tensor(self, dtype: torch.dtype, shape: tuple[int, ...], offset_bytes: int = 0) -> torch.Tensor:
        """A CPU tensor of `shape` aliasing bytes [offset, offset + size) of the segment."""
        count = 1
        for s in shape:
            count *= int(s)
        size = count * torch.empty((), dtype=dtype).element_size()
        if offset_bytes < 0 or offset_bytes + size > self.nbytes:
            raise ValueError(f"SharedSegment.tensor: bytes [{offset_bytes}, {offset_bytes + size}) outside "
                             f"the {self.nbytes}-byte segment {self.label!r}")
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        with warnings.catch_warnings():         # read-only mappings: torch warns that writes would fault
            warnings.simplefilter("ignore", UserWarning)
            t = torch.frombuffer(self._map, dtype=dtype, count=count, offset=offset_bytes).view(*shape)
        return t

    def close(self) -> None:
        """Close this process's file descriptor. The pages go back to the system once every
        mapping is gone too (the mapping stays while tensors from `tensor()` are alive)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self):
        self.close()

    def data_ptr(self) -> int:
        """Address of the mapping in this process (for cudaHostRegister)."""
        import ctypes

        if not self.writable:                  # a read-only buffer cannot back a ctypes object
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return torch.frombuffer(self._map, dtype=torch.uint8, count=1).data_ptr()
        return ctypes.addressof(ctypes.c_char.from_buffer(self._map))

    def __repr__(self) -> str:
        return f"SharedSegment({self.label!r}, {self.nbytes} B, fd={self.fd}{', locked' if self.locked else ''})"
