"""Stream memory operations: a stream writes a 64-bit value to memory, or waits until a value in
memory reaches one, in stream order, without the host (CUDA driver API, cuStreamWriteValue64 /
cuStreamWaitValue64, through cuda-python's bindings: kernels/cuda_api.py). NOT YET RUN ON A GPU
(tests/gpu/test_stream_values_cuda.py checks it there).

What it is for: ranks of one node that share a host pool (integration/sglang/pools/shared_host_pool.py)
order their GPU work through a per-layer count in shared, page-locked host memory. The owner's
compute stream writes the count after its kernel stored the layer's rows; a reader's compute stream
waits for the count before any kernel reads them. A write is preceded by a system-scope memory
barrier (the default flags), so rows stored before it are visible to any agent that sees the count.

Which attribute says they run: the functions called here are the v2 stream memory operations (CUDA
>= 11.7, always on in CUDA 12), which CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS (122) reports.
The legacy ..._V1 attribute (93) reports the v1 API, off on a stock driver unless
NVreg_EnableStreamMemOPs=1: asking it refused every stock H200 (issue 32, defect 4).

Called through the stream runtime (prefetch/stream_runtime.CudaStreams): the CPU suite swaps that
runtime for a double (tests/stream_doubles.py) whose value mapping asks `check_supported` of a
driver double answering as a stock driver does. `drv` (every function's last argument) is
cuda.bindings.driver unless a test passes its double. Memory: none; the caller owns the value memory
(registered with cudaHostRegister, kernels/uva.py).
"""
from __future__ import annotations

from sgl_ess.kernels import cuda_api

FIX = "run with --ess-share-host-pool off to keep one host pool per rank"


def check_supported(device_index: int, drv=None) -> None:
    """Refuse a GPU whose driver cannot run the (v2) 64-bit stream memory operations, naming the flag."""
    drv = drv or cuda_api.driver()
    cuda_api.check(drv.cuInit(0), "cuInit", FIX)
    dev = cuda_api.check(drv.cuDeviceGet(device_index), f"cuDeviceGet({device_index})", FIX)
    attr = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
    if not cuda_api.check(drv.cuDeviceGetAttribute(attr, dev), f"cuDeviceGetAttribute({attr.name})", FIX):
        raise RuntimeError(f"GPU {device_index} cannot run 64-bit stream memory operations ({attr.name} is 0), "
                           f"which a shared host pool orders its ranks with: {FIX}")


def write_value(stream_handle: int, device_ptr: int, value: int, drv=None) -> None:
    """Queue on the stream: a system-scope barrier, then *device_ptr = value (int64)."""
    drv = drv or cuda_api.driver()
    cuda_api.check(drv.cuStreamWriteValue64(drv.CUstream(stream_handle), drv.CUdeviceptr(device_ptr), value,
                                            drv.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT),
                   "cuStreamWriteValue64", FIX)


def wait_value(stream_handle: int, device_ptr: int, value: int, drv=None) -> None:
    """Queue on the stream: its later work waits until *device_ptr >= value (int64, cyclic)."""
    drv = drv or cuda_api.driver()
    cuda_api.check(drv.cuStreamWaitValue64(drv.CUstream(stream_handle), drv.CUdeviceptr(device_ptr), value,
                                           drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ),
                   "cuStreamWaitValue64", FIX)
