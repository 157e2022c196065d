"""Zero-copy views of pinned host memory for GPU kernels (CUDA unified virtual addressing). The CUDA
runtime is called through cuda-python (kernels/cuda_api.py), its flags by name.

`device_view(t)` returns a CUDA tensor that aliases the pinned CPU tensor `t` (no copy): a
kernel that reads it pulls the bytes over PCIe on demand. The returned tensor keeps `t` alive.
On a machine without CUDA this raises: callers use the torch path there.
"""
from __future__ import annotations

import torch

from sgl_ess.kernels import cuda_api


class _CudaArray:
    """Minimal __cuda_array_interface__ holder so torch.as_tensor can alias a device pointer."""

    def __init__(self, ptr: int, shape, typestr: str, owner: torch.Tensor):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": tuple(shape),
                                         "typestr": typestr, "version": 3, "strides": None}
        self._owner = owner


_TYPESTR = {torch.uint8: "|u1", torch.int32: "<i4", torch.int64: "<i8", torch.float32: "<f4"}


def device_pointer(host_ptr: int) -> int:
    """Device address of pinned or registered host memory (cudaHostGetDevicePointer; under UVA the
    same address). A pointer CUDA does not know is an error, not a guess."""
    rt = cuda_api.runtime()
    return int(cuda_api.check(rt.cudaHostGetDevicePointer(host_ptr, 0), "cudaHostGetDevicePointer",
                              "the host memory must be pinned or registered (StoreConfig.pin_host)"))


def device_view(t: torch.Tensor) -> torch.Tensor:
    if not torch.cuda.is_available():
        raise RuntimeError("device_view needs CUDA; on CPU use the torch FlashTrans path")
    if t.is_cuda:
        return t
    if not (t.is_pinned() or _registered(t)):
        raise ValueError("device_view: the host tensor must be pinned or registered (StoreConfig.pin_host)")
    if not t.is_contiguous() or t.dtype not in _TYPESTR:
        raise ValueError(f"device_view: need a contiguous {list(_TYPESTR)} tensor, got {t.dtype}")
    arr = _CudaArray(device_pointer(t.data_ptr()), t.shape, _TYPESTR[t.dtype], t)
    view = torch.as_tensor(arr, device="cuda")
    view._sgl_ess_owner = arr  # keep the pinned storage alive while the view lives
    return view


_REGISTERED: list["HostRegistration"] = []


def _registered(t: torch.Tensor) -> bool:
    p, n = t.data_ptr(), t.numel() * t.element_size()
    return any(r.ptr <= p and p + n <= r.ptr + r.nbytes and r.chunks for r in _REGISTERED)


class HostRegistration:
    """Page-locks an existing host tensor in place (cudaHostRegister, in chunks) for zero-copy GPU
    access; `unregister()` undoes it. Owned by whoever owns the tensor (the host pool)."""

    CHUNK_BYTES = 1 << 30

    def __init__(self, t: torch.Tensor, chunk_bytes: int = CHUNK_BYTES, readonly: bool = False):
        if not torch.cuda.is_available():
            raise RuntimeError("register_host needs CUDA; on CPU the host pool is used as is")
        if t.is_cuda or not t.is_contiguous():
            raise ValueError("register_host: need a contiguous CPU tensor")
        self.tensor = t
        self.ptr = t.data_ptr()
        self.nbytes = t.numel() * t.element_size()
        self.chunks: list[tuple[int, int]] = []
        rt = cuda_api.runtime()
        # read-only: a PROT_READ mapping the GPU only reads (a reader rank of a shared pool)
        flags = rt.cudaHostRegisterReadOnly if readonly else rt.cudaHostRegisterDefault
        off = 0
        try:
            while off < self.nbytes:
                size = min(chunk_bytes, self.nbytes - off)
                cuda_api.check(rt.cudaHostRegister(self.ptr + off, size, flags),
                               f"cudaHostRegister at byte {off} of a {self.nbytes}-byte host pool",
                               "the OS limits page-locked memory (ulimit -l, container memlock) or the pool is "
                               "larger than free RAM: lower --ess-memory-pool-size-gb")
                self.chunks.append((self.ptr + off, size))
                off += size
        except Exception:
            try:
                self.unregister()
            except RuntimeError:
                pass                  # the registration's own error is the one to report
            raise
        _REGISTERED.append(self)

    def unregister(self) -> None:
        rt = cuda_api.runtime() if self.chunks else None
        failed = [(ptr, rt.cudaHostUnregister(ptr)[0]) for ptr, _ in self.chunks]
        failed = [(ptr, st) for ptr, st in failed if int(st) != 0]
        self.chunks = []
        if self in _REGISTERED:
            _REGISTERED.remove(self)
        if failed:                    # every chunk was tried first: none stays registered by an early stop
            cuda_api.check((failed[0][1],), f"cudaHostUnregister of {len(failed)} chunk(s), first at {failed[0][0]:#x}",
                           "the memory was unregistered or freed elsewhere")


def register_host(t: torch.Tensor, chunk_bytes: int = HostRegistration.CHUNK_BYTES,
                  readonly: bool = False) -> HostRegistration:
    return HostRegistration(t, chunk_bytes, readonly)
