"""Every check in report order. Reads the machine once (sysfs, /proc, limits) and hands the values
to the check functions; a check that raises becomes one `warn` line and the rest still run."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Callable, Mapping

from sgl_ess.doctor import gpu, ipc, memory, numa, pcie, pd_packages, thp
from sgl_ess.doctor.finding import Finding
from sgl_ess.doctor.sysfs import nvidia_gpus, read_text
from sgl_ess.serving import host_memory
from sgl_ess.serving.preflight import has_cap_ipc_lock, locked_bytes


@dataclass(frozen=True)
class DoctorInputs:
    sys_root: str = "/sys"
    proc_root: str = "/proc"
    dev_root: str = "/dev"
    pool_bytes: int | None = None       # --pool-bytes
    pool_gb: float = 0.0                # memory_pool_size_gb from flags / YAML / env
    lock_pool: bool = False             # lock_host_memory (flag / YAML / env) planned: lock the whole pool
    lock_bytes: int = 0                 # --lock-bytes: lock exactly this much
    under_load: bool = False
    probe: bool = True
    probe_seconds: float = 5.0
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def _first_line(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.readline().strip()
    except OSError:
        return None


def _guard(name: str, fn: Callable[[], list[Finding] | Finding]) -> list[Finding]:
    try:
        out = fn()
    except Exception as e:  # a doctor bug must not hide the other checks
        return [Finding(name, "warn", f"the check itself failed: {type(e).__name__}: {e}",
                        "report this as an sgl-ess bug")]
    return out if isinstance(out, list) else [out]


def run_checks(inp: DoctorInputs) -> list[Finding]:
    gpus = nvidia_gpus(inp.sys_root)
    meminfo_path = os.path.join(inp.proc_root, "meminfo")
    info = host_memory.meminfo(meminfo_path)
    status_path = os.path.join(inp.proc_root, "self", "status")
    status_text = read_text(status_path)
    pool = memory.planned_pool(inp.pool_bytes, inp.pool_gb, info)
    lock = inp.lock_bytes
    if not lock and inp.lock_pool and pool.nbytes:
        lock = locked_bytes(pool.nbytes)                 # whole pages, as mlock locks them

    def memlock():
        soft, hard = memory.memlock_limits()
        return memory.check_memlock(lock, pool.nbytes, soft, hard, has_cap_ipc_lock(status_path))

    def numa_check():
        return numa.check_numa(gpus, inp.sys_root, status_text,
                               _first_line(os.path.join(inp.proc_root, "self", "numa_maps")),
                               inp.environ, shutil.which, pd_packages.has_module)

    out: list[Finding] = []
    out += _guard("pcie", lambda: pcie.check_pcie(gpus, inp.sys_root, inp.under_load))
    out += _guard("host-memory", lambda: memory.check_host_memory(pool, info, meminfo_path))
    out += _guard("memlock", memlock)
    out += _guard("numa", numa_check)
    out += _guard("thp", lambda: thp.check_thp(inp.sys_root))
    out += _guard("ipc", lambda: ipc.check_ipc(inp.environ))
    out += _guard("pd", lambda: pd_packages.check_pd(inp.sys_root))
    out += _guard("gpu-probe", lambda: gpu.check_gpu_probe(gpu.gpu_absent_reason(inp.dev_root), inp.probe,
                                                           inp.probe_seconds, inp.sys_root))
    return out
