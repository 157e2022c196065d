"""Zero-copy views of pinned host memory for GPU kernels (CUDA unified virtual addressing).

`device_view(t)` returns a CUDA tensor that aliases the pinned CPU tensor `t` (no copy): a
kernel that reads it pulls the bytes over PCIe on demand. The returned tensor keeps `t` alive.
On a machine without CUDA this raises: callers use the torch path there.
"""
from __future__ import annotations

import ctypes

import torch


class _CudaArray:
    """Minimal __cuda_array_interface__ holder so torch.as_tensor can alias a device pointer."""

    def __init__(self, ptr: int, shape, typestr: str, owner: torch.Tensor):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": tuple(shape),
                                         "typestr": typestr, "version": 3, "strides": None}
        self._owner = owner


_TYPESTR = {torch.uint8: "|u1", torch.int32: "<i4", torch.int64: "<i8", torch.float32: "<f4"}


def device_pointer(host_ptr: int) -> int:
    """Device address of pinned host memory: cudaHostGetDevicePointer, else the UVA identity."""
    try:
        lib = ctypes.CDLL("libcudart.so")
    except OSError:
        return host_ptr  # UVA: registered/allocated pinned memory has the same address on device
    dev = ctypes.c_void_p()
    rc = lib.cudaHostGetDevicePointer(ctypes.byref(dev), ctypes.c_void_p(host_ptr), 0)
    return dev.value if rc == 0 and dev.value else host_ptr


def device_view(t: torch.Tensor) -> torch.Tensor:
    if not torch.cuda.is_available():
        raise RuntimeError("device_view needs CUDA; on CPU use the torch FlashTrans path")
    if t.is_cuda:
        return t
    if not t.is_pinned():
        raise ValueError("device_view: the host tensor must be pinned (StoreConfig.pin_host)")
    if not t.is_contiguous() or t.dtype not in _TYPESTR:
        raise ValueError(f"device_view: need a contiguous {list(_TYPESTR)} tensor, got {t.dtype}")
    arr = _CudaArray(device_pointer(t.data_ptr()), t.shape, _TYPESTR[t.dtype], t)
    view = torch.as_tensor(arr, device="cuda")
    view._sgl_ess_owner = arr  # keep the pinned storage alive while the view lives
    return view
