"""Stream memory operations: a stream writes a 64-bit value to memory, or waits until a value in
memory reaches one, in stream order, without the host (CUDA driver API, cuStreamWriteValue64 /
cuStreamWaitValue64). NOT YET RUN ON A GPU (tests/gpu/test_stream_values_cuda.py checks it there).

What it is for: ranks of one node that share a host pool (integration/sglang/pools/shared_host_pool.py)
order their GPU work through a per-layer count in shared, page-locked host memory. The owner's
compute stream writes the count after its kernel stored the layer's rows; a reader's compute stream
waits for the count before any kernel reads them. A write is preceded by a system-scope memory
barrier (the default flags), so rows stored before it are visible to any agent that sees the count.

Called through the stream runtime (prefetch/stream_runtime.CudaStreams): the CPU suite swaps that
runtime for a double (tests/stream_doubles.py), so nothing here runs without CUDA. Memory: none;
the caller owns the value memory (registered with cudaHostRegister, kernels/uva.py).
"""
from __future__ import annotations

import ctypes

WAIT_GEQ = 0x0                  # CU_STREAM_WAIT_VALUE_GEQ: (int64)(*addr - value) >= 0
WRITE_DEFAULT = 0x0             # CU_STREAM_WRITE_VALUE_DEFAULT: a memory barrier, then the write
ATTR_64_BIT_MEM_OPS = 93        # CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
ERRORS = {1: "invalid value", 2: "out of memory", 3: "not initialized", 201: "invalid context",
          400: "invalid handle", 801: "not supported"}

_LIB: list = []


def _lib():
    if not _LIB:
        try:
            _LIB.append(ctypes.CDLL("libcuda.so.1"))
        except OSError as e:
            raise RuntimeError(f"stream memory operations need the CUDA driver (libcuda.so.1): {e}") from None
    return _LIB[0]


def _fn(name: str):
    lib = _lib()
    for sym in (name + "_v2", name):          # CUDA 12 spells them _v2 (always available there)
        f = getattr(lib, sym, None)
        if f is not None:
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
            return f
    raise RuntimeError(f"the CUDA driver has no {name}: update the NVIDIA driver (CUDA >= 11.7), or run with "
                       "--ess-share-host-pool off")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUDA driver error {rc} ({ERRORS.get(rc, 'see cuda.h')}); run with "
                           "--ess-share-host-pool off to keep one host pool per rank")


def check_supported(device_index: int) -> None:
    """Refuse a GPU whose driver cannot run 64-bit stream memory operations, naming the flag."""
    lib = _lib()
    dev, val = ctypes.c_int(), ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(device_index)), "cuDeviceGet")
    _check(lib.cuDeviceGetAttribute(ctypes.byref(val), ctypes.c_int(ATTR_64_BIT_MEM_OPS), dev),
           "cuDeviceGetAttribute(CAN_USE_64_BIT_STREAM_MEM_OPS)")
    if not val.value:
        raise RuntimeError(f"GPU {device_index} cannot run 64-bit stream memory operations, which a shared host "
                           "pool orders its ranks with: run with --ess-share-host-pool off")


def write_value(stream_handle: int, device_ptr: int, value: int) -> None:
    """Queue on the stream: a system-scope barrier, then *device_ptr = value (int64)."""
    _check(_fn("cuStreamWriteValue64")(ctypes.c_void_p(stream_handle), ctypes.c_uint64(device_ptr),
                                       ctypes.c_uint64(value), WRITE_DEFAULT), "cuStreamWriteValue64")


def wait_value(stream_handle: int, device_ptr: int, value: int) -> None:
    """Queue on the stream: its later work waits until *device_ptr >= value (int64)."""
    _check(_fn("cuStreamWaitValue64")(ctypes.c_void_p(stream_handle), ctypes.c_uint64(device_ptr),
                                      ctypes.c_uint64(value), WAIT_GEQ), "cuStreamWaitValue64")
