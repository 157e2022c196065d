"""Zero-copy views of pinned host memory for GPU kernels (CUDA unified virtual addressing).

`device_view(t)` returns a CUDA tensor that aliases the pinned CPU tensor `t` (no copy): a
kernel that reads it pulls the bytes over PCIe on demand. The returned tensor keeps `t` alive.
On a machine without CUDA this raises: callers use the torch path there.
"""
from __future__ import annotations

import ctypes

import torch

CUDART_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")


def cudart_paths_in_maps(maps_text: str) -> list[str]:
    """Paths of CUDA runtimes mapped into a process (/proc/PID/maps text), first seen first: torch
    wheels load their own ``libcudart.so.NN`` (from the nvidia-cuda-runtime wheel), not a bare
    ``libcudart.so``."""
    out = []
    for line in maps_text.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "/libcudart.so" in path and path not in out:
            out.append(path)
    return out


_CUDART: list = []


def cudart():
    """The CUDA runtime this process uses (loaded once found), or None: a runtime torch already
    mapped first, then the usual sonames. A failed lookup is not remembered (CUDA may load later)."""
    if _CUDART:
        return _CUDART[0]
    try:
        with open("/proc/self/maps") as f:
            candidates = cudart_paths_in_maps(f.read())
    except OSError:
        candidates = []
    for name in (*candidates, *CUDART_NAMES):
        try:
            _CUDART.append(ctypes.CDLL(name))
            return _CUDART[0]
        except OSError:
            continue
    return None


class _CudaArray:
    """Minimal __cuda_array_interface__ holder so torch.as_tensor can alias a device pointer."""

    def __init__(self, ptr: int, shape, typestr: str, owner: torch.Tensor):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": tuple(shape),
                                         "typestr": typestr, "version": 3, "strides": None}
        self._owner = owner


_TYPESTR = {torch.uint8: "|u1", torch.int32: "<i4", torch.int64: "<i8", torch.float32: "<f4"}


def device_pointer(host_ptr: int) -> int:
    """Device address of pinned host memory: cudaHostGetDevicePointer, else the UVA identity."""
    lib = cudart()
    if lib is None:
        return host_ptr  # UVA: registered/allocated pinned memory has the same address on device
    dev = ctypes.c_void_p()
    rc = lib.cudaHostGetDevicePointer(ctypes.byref(dev), ctypes.c_void_p(host_ptr), 0)
    return dev.value if rc == 0 and dev.value else host_ptr


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

    READ_ONLY = 0x08               # cudaHostRegisterReadOnly: a PROT_READ mapping (GPU reads only)

    def __init__(self, t: torch.Tensor, chunk_bytes: int = CHUNK_BYTES, readonly: bool = False):
        if not torch.cuda.is_available():
            raise RuntimeError("register_host needs CUDA; on CPU the host pool is used as is")
        if t.is_cuda or not t.is_contiguous():
            raise ValueError("register_host: need a contiguous CPU tensor")
        self.tensor = t
        self.ptr = t.data_ptr()
        self.nbytes = t.numel() * t.element_size()
        self.chunks: list[tuple[int, int]] = []
        rt = torch.cuda.cudart()
        off = 0
        try:
            while off < self.nbytes:
                size = min(chunk_bytes, self.nbytes - off)
                rc = rt.cudaHostRegister(self.ptr + off, size, self.READ_ONLY if readonly else 0)
                if int(rc) != 0:
                    raise RuntimeError(
                        f"cudaHostRegister failed (error {int(rc)}) at byte {off} of a {self.nbytes}-byte host "
                        "pool: the OS limits page-locked memory (ulimit -l, container memlock) or the pool is "
                        "larger than free RAM. Lower --ess-memory-pool-size-gb")
                self.chunks.append((self.ptr + off, size))
                off += size
        except Exception:
            self.unregister()
            raise
        _REGISTERED.append(self)

    def unregister(self) -> None:
        rt = torch.cuda.cudart()
        for ptr, _ in self.chunks:
            rt.cudaHostUnregister(ptr)
        self.chunks = []
        if self in _REGISTERED:
            _REGISTERED.remove(self)


def register_host(t: torch.Tensor, chunk_bytes: int = HostRegistration.CHUNK_BYTES,
                  readonly: bool = False) -> HostRegistration:
    return HostRegistration(t, chunk_bytes, readonly)
