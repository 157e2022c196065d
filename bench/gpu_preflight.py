"""Step 1 of bench/gpu_check.sh: what this GPU machine lets ESS do, and what falls back where it does not.

  python -m bench.gpu_preflight --out PATH          (CUDA; on a CPU machine every check records a skip)

Each check says whether the capability works here (pass / fail / skip, with the error), what in
ESS falls back when it is missing, and the fallback this check then used:
  memfd_register     the store's host pool (an anonymous memfd mapping, sgl_ess/store/host_pool.py)
                     page-locked in place with cudaHostRegister (sgl_ess/kernels/uva.py) and read
                     by a Triton FlashTrans launch; the bytes are compared
  readonly_register  the device attribute READ_ONLY_HOST_REGISTER_SUPPORTED, then a memfd segment
                     mapped a second time PROT_READ (what a reader rank of a shared host pool maps
                     with SGLESS_SHARED_POOL_READONLY=1), registered with cudaHostRegisterReadOnly;
                     the GPU reads it and the bytes are compared
  stream_memops      64-bit stream memory operations (sgl_ess/kernels/stream_values.py): the
                     device attributes for the legacy (v1, 93) and current (v2, 122) API read
                     through cuda-python's named enums, the repo's own check_supported() verdict
                     (it asks the v2 one), then a cuStreamWriteValue64 seen by the host and a
                     cuStreamWaitValue64 that holds a second stream's work until the first stream
                     writes the value
Every check runs in this process in turn; one that raises is recorded as a failure and the next
runs. The result is one JSON file (--out). Exit 1 when the store's host pool cannot be registered
(ESS cannot start on this machine); the other two have fallbacks and only say so.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

SEGMENT_BYTES = 64 << 20          # 64 MiB: registration is per page; large enough to span many chunks' pages
ROW_BYTES = 656                   # one FP8 latent row of DeepSeek-V3.2
ENV_READONLY = "SGLESS_SHARED_POOL_READONLY"    # sgl_ess/integration/sglang/pools/shared_host_pool.py


def _versions() -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
           "kernel": platform.release(), "gpu": None, "capability": None}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError as e:
        out["triton"] = f"missing: {e}"
    try:
        from importlib.metadata import version

        out["cuda_bindings"] = version("cuda-bindings")
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        out["cuda_bindings"] = f"missing: {type(e).__name__}"
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        out["capability"] = list(torch.cuda.get_device_capability())
        free, total = torch.cuda.mem_get_info()
        out["gpu_memory_gib"] = {"free": round(free / 2 ** 30, 1), "total": round(total / 2 ** 30, 1)}
    # gVisor reports an old kernel (4.4.0): some host-memory calls behave differently there
    out["sandboxed_kernel_guess"] = platform.release().startswith("4.4.0")
    return out


def _check(name: str, fn, fallback_when_missing: str) -> dict:
    t0 = time.perf_counter()
    try:
        res = fn()
    except Exception as e:  # noqa: BLE001 - the failure is the finding
        res = {"status": "fail", "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
    res.setdefault("fallback_when_missing", fallback_when_missing)
    res["seconds"] = round(time.perf_counter() - t0, 3)
    print(f"[preflight] {name}: {res['status']}" + (f" ({res.get('error')})" if res.get("error") else ""), flush=True)
    return res


def _flashtrans_reads(host_rows, n_rows: int = 4096) -> dict:
    """One Triton FlashTrans launch gathers random rows of `host_rows` (uint8 [R, 656], registered
    or pinned) into device memory; the bytes are compared with the host's."""
    import torch

    from sgl_ess.kernels.flashtrans import copy_rows

    g = torch.Generator().manual_seed(int(time.time()))
    src = torch.randperm(host_rows.shape[0], generator=g)[:n_rows]
    dst = torch.randperm(2 * n_rows, generator=g)[:n_rows]
    dev = torch.full((2 * n_rows, host_rows.shape[1]), 0xA5, dtype=torch.uint8, device="cuda")   # poisoned
    copy_rows(host_rows, src.cuda(), dev, dst.cuda(), "triton")
    torch.cuda.synchronize()
    ok = torch.equal(dev[dst.cuda()].cpu(), host_rows[src])
    return {"rows_compared": n_rows, "bytes_equal": bool(ok)}


def check_memfd_register() -> dict:
    import torch

    from sgl_ess.kernels.uva import register_host
    from sgl_ess.memory.shared_segment import SharedSegment

    rows = SEGMENT_BYTES // ROW_BYTES
    seg = SharedSegment(rows * ROW_BYTES, label="sgl_ess_preflight")
    host = seg.tensor(torch.uint8, (rows, ROW_BYTES))
    host.copy_(torch.randint(0, 256, host.shape, dtype=torch.uint8))
    out = {"segment_bytes": rows * ROW_BYTES, "fallback_used": None}
    try:
        reg = register_host(host, chunk_bytes=16 << 20)          # several chunks, as the store registers
    except Exception as e:  # noqa: BLE001
        out.update(status="fail", error=f"{type(e).__name__}: {e}")
        # the fallback this check uses: torch's own pinned allocation (cudaHostAlloc), not a memfd
        pinned = host.clone().pin_memory()
        out["fallback_used"] = "torch pin_memory() buffer (cudaHostAlloc, not shareable with a worker or TP rank)"
        out["fallback_flashtrans"] = _flashtrans_reads(pinned)
        return out
    try:
        out.update(_flashtrans_reads(host), chunks=len(reg.chunks))
        out["status"] = "pass" if out["bytes_equal"] else "fail"
        if not out["bytes_equal"]:
            out["error"] = "FlashTrans read different bytes from the registered memfd mapping"
    finally:
        reg.unregister()
    return out


def check_readonly_register() -> dict:
    import torch

    from sgl_ess.kernels.uva import register_host
    from sgl_ess.memory.shared_segment import SharedSegment

    out = {"device_attribute": _attribute("CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED"),
           "fallback_used": None}
    rows = (8 << 20) // ROW_BYTES
    owner = SharedSegment(rows * ROW_BYTES, label="sgl_ess_preflight_ro")
    owner.tensor(torch.uint8, (rows, ROW_BYTES)).copy_(torch.randint(0, 256, (rows, ROW_BYTES), dtype=torch.uint8))
    reader = SharedSegment.attach(os.dup(owner.fd), rows * ROW_BYTES, label="sgl_ess_preflight_ro", readonly=True)
    host = reader.tensor(torch.uint8, (rows, ROW_BYTES))
    try:
        reg = register_host(host, readonly=True)
    except Exception as e:  # noqa: BLE001
        out.update(status="fail", error=f"{type(e).__name__}: {e}",
                   fallback_used=f"none needed by default: {ENV_READONLY} is unset, so reader ranks map the pool "
                                 "read-write and register it without the read-only flag")
        return out
    try:
        out.update(_flashtrans_reads(host, 2048), chunks=len(reg.chunks))
        out["status"] = "pass" if out["bytes_equal"] else "fail"
    finally:
        reg.unregister()
    return out


def _attribute(name: str, device: int = 0) -> dict:
    """A device attribute read through cuda-python's named enum (sgl_ess/kernels/cuda_api.py):
    {name, number, value}, or {name, error} when it cannot be read."""
    from sgl_ess.kernels import cuda_api

    try:
        drv = cuda_api.driver()
    except Exception as e:  # noqa: BLE001 - cuda-python missing or broken: the reading is the error
        return {"name": name, "error": f"{type(e).__name__}: {e}"}
    enum = getattr(drv.CUdevice_attribute, name, None)
    if enum is None:
        return {"name": name, "error": "not in this cuda-python's CUdevice_attribute"}
    try:
        cuda_api.check(drv.cuInit(0), "cuInit", "")
        dev = cuda_api.check(drv.cuDeviceGet(device), f"cuDeviceGet({device})", "")
        val = cuda_api.check(drv.cuDeviceGetAttribute(enum, dev), f"cuDeviceGetAttribute({name})", "")
    except Exception as e:  # noqa: BLE001 - no driver, or a call refused: said, not raised
        return {"name": name, "number": int(enum), "error": f"{type(e).__name__}: {e}"}
    return {"name": name, "number": int(enum), "value": int(val)}


def check_stream_memops() -> dict:
    import torch

    from sgl_ess.kernels import stream_values
    from sgl_ess.kernels.uva import device_pointer, register_host
    from sgl_ess.memory.shared_segment import SharedSegment

    out = {"attributes": [_attribute("CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1"),
                          _attribute("CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS")],
           "fallback_used": None}
    try:
        stream_values.check_supported(torch.cuda.current_device())
        out["repo_check_supported"] = "accepted"
    except Exception as e:  # noqa: BLE001 - its verdict is a result, compared with the calls below
        out["repo_check_supported"] = f"refused: {type(e).__name__}: {e}"
    seg = SharedSegment(4096, label="sgl_ess_preflight_values")     # the shared pool's epoch counts live in one
    values = seg.tensor(torch.int64, (512,))
    values.zero_()
    reg = register_host(values)
    try:
        ptr = device_pointer(values.data_ptr())
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        stream_values.write_value(a.cuda_stream, ptr, 5)              # 1: a write the host then sees
        a.synchronize()
        out["write_seen_by_host"] = int(values[0]) == 5
        if not out["write_seen_by_host"]:
            out.update(status="fail", error=f"cuStreamWriteValue64 wrote 5, the host reads {int(values[0])}")
            return out
        # 2: b waits for 6 before it fills; a writes 6 only after ~50 ms of spinning. The write is
        # known to work (1), so the wait cannot hang. Without the wait b's fill would end long
        # before a's spin does; with it, b's fill ends after the event a records when the spin ends.
        flag = torch.zeros(1024, device="cuda")
        slept, done_b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        stream_values.wait_value(b.cuda_stream, ptr, 6)
        with torch.cuda.stream(b):
            flag.fill_(1.0)
            done_b.record()
        with torch.cuda.stream(a):
            torch.cuda._sleep(100_000_000)                            # ~50 ms of GPU cycles
            slept.record()
        stream_values.write_value(a.cuda_stream, ptr, 6)
        torch.cuda.synchronize()
        gap_ms = slept.elapsed_time(done_b)
        out.update(fill_ended_after_spin_ms=round(gap_ms, 3), host_value=int(values[0]),
                   filled=bool(flag.eq(1.0).all()))
        ok = out["filled"] and out["host_value"] == 6 and gap_ms >= 0
        out["status"] = "pass" if ok else "fail"
        if not ok:
            out["error"] = "the waiting stream ran before the value was written"
    except Exception as e:  # noqa: BLE001
        out.update(status="fail", error=f"{type(e).__name__}: {e}")
    finally:
        reg.unregister()
    if out["status"] == "fail":
        out["fallback_used"] = ("--ess-share-host-pool off (auto is already off on CUDA): each attention-TP rank "
                                "keeps its own host pool and no stream waits on another rank")
    return out


CHECKS = (
    ("memfd_register", check_memfd_register,
     "nothing in serving: the host pool refuses to start with the cudaHostRegister error (it names "
     "--ess-memory-pool-size-gb and memlock); a pool that is not registered cannot be read by FlashTrans"),
    ("readonly_register", check_readonly_register,
     f"the read-only mapping of a reader rank is a debug mode ({ENV_READONLY}=1); without it readers map the "
     "shared pool read-write"),
    ("stream_memops", check_stream_memops,
     "a host pool shared by attention-TP ranks (--ess-share-host-pool on) needs them; without them: "
     "--ess-share-host-pool off, one host pool per rank"),
)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_preflight", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="result JSON")
    args = p.parse_args()
    import torch

    res = {"versions": _versions(), "checks": {}}
    if not torch.cuda.is_available():
        reason = "needs a CUDA device (this machine has none); nothing checked"
        res["skipped"] = reason
        for name, _, fallback in CHECKS:
            res["checks"][name] = {"status": "skip", "reason": reason, "fallback_when_missing": fallback}
        print(f"[preflight] {reason}")
    else:
        torch.cuda.init()
        for name, fn, fallback in CHECKS:
            res["checks"][name] = _check(name, fn, fallback)
            with open(args.out, "w") as fh:         # after each check: a cut run keeps what ran
                json.dump(res, fh, indent=1)
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    return 1 if res["checks"]["memfd_register"]["status"] == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
