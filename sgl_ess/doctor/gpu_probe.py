"""A few-second FlashTrans probe: scattered 656-byte rows host->device vs a bulk copy of the same bytes.

The scattered fetch (many small rows gathered from the pinned host pool by one zero-copy Triton
launch, sgl_ess/kernels/flashtrans.py) is what ESS runs every decode step; the bulk copy is the
link's best case. A scattered rate far below the bulk rate means the fetch will not hide behind
compute. The host side is the store's own pool (memfd, chunked cudaHostRegister), as in
`python -m bench flashtrans`, which is the full measurement; this is its short form.
It also reads each GPU's link speed while the copies are queued: the link under load.

NOT YET RUN ON A GPU: written on a CPU-only machine; the bench it shortens has not run either.
"""
from __future__ import annotations

import statistics

from sgl_ess.doctor.finding import Finding
from sgl_ess.doctor.sysfs import nvidia_gpus
from sgl_ess.kernels.cuda_timing import time_cuda

MIN_RATIO = 0.5          # scattered / bulk below this: warn
ROW_BYTES = 656          # one FP8 latent row of DeepSeek-V3.2
ROWS = 32768             # rows per launch: 64 requests x 512 misses
HOST_ROWS = 1 << 19      # 344 MB pool to draw the rows from


def _links_under_load(fn, sys_root: str) -> str:
    """Queue a burst of `fn` launches, read the GPUs' link speeds while they run."""
    import torch

    for _ in range(50):
        fn()
    speeds = ", ".join(f"{g.bdf} {g.speed_now} x{g.width_now}" for g in nvidia_gpus(sys_root))
    torch.cuda.synchronize()
    return speeds or "not reported"


def run_probe(seconds: float = 5.0, sys_root: str = "/sys") -> Finding:
    import torch

    from sgl_ess.kernels.flashtrans import copy_rows
    from sgl_ess.store.host_pool import HostLatentPool

    try:
        pool = HostLatentPool(1, HOST_ROWS, ROW_BYTES, pin=True)    # memfd + chunked cudaHostRegister, as serving
    except (RuntimeError, OSError) as e:
        return Finding("gpu-probe", "fail", f"could not pin a {HOST_ROWS * ROW_BYTES / 1e6:.0f} MB probe pool the way "
                                            f"the server pins its host pool: {e}",
                       "see the host-memory and memlock lines; the server's pool is far larger")
    try:
        host = pool.rows[0]
        host[:, 0] = (torch.arange(HOST_ROWS) % 251).to(torch.uint8)      # rows tell apart, cheaply
        dev = torch.zeros((2 * ROWS, ROW_BYTES), dtype=torch.uint8, device="cuda")
        src = torch.randperm(HOST_ROWS, device="cuda")[:ROWS]
        dst = torch.randperm(2 * ROWS, device="cuda")[:ROWS]
        scattered = lambda: copy_rows(host, src, dev, dst, "triton")       # noqa: E731
        bulk = lambda: dev[:ROWS].copy_(host[:ROWS], non_blocking=True)    # noqa: E731
        budget = max(0.5, seconds / 2 - 0.5)
        t_scattered = time_cuda(scattered, budget_s=budget)
        links = _links_under_load(scattered, sys_root)
        if not torch.equal(dev[dst[:64]].cpu(), host[src[:64].cpu()]):
            return Finding("gpu-probe", "fail", "FlashTrans moved the wrong bytes (64 rows compared)",
                           "report this as an sgl-ess bug, with `python -m bench flashtrans` output")
        t_bulk = time_cuda(bulk, budget_s=budget)
    finally:
        if pool.registration is not None:
            pool.registration.unregister()
    nbytes = ROWS * ROW_BYTES
    gb_scattered = nbytes / statistics.median(t_scattered) / 1e9
    gb_bulk = nbytes / statistics.median(t_bulk) / 1e9
    ratio = gb_scattered / gb_bulk
    detail = (f"{torch.cuda.get_device_name()}: FlashTrans {ROWS} x {ROW_BYTES}-B rows {gb_scattered:.1f} GB/s vs bulk "
              f"pinned copy {gb_bulk:.1f} GB/s (median of {len(t_scattered)} / {len(t_bulk)}), ratio {ratio:.2f}; "
              f"link under load: {links} (this probe is new: written without a GPU, first GPU runs unverified)")
    if ratio < MIN_RATIO:
        return Finding("gpu-probe", "warn", detail,
                       f"scattered fetch under {MIN_RATIO:.0%} of bulk: fetches may not hide behind compute; run "
                       f"`python -m bench flashtrans` for the full measurement and check the pcie line")
    return Finding("gpu-probe", "ok", detail)
