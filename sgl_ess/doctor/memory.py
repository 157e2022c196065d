"""Host memory for the planned ESS host pool: MemAvailable, and the page-locking limit.

The pool is sized as the launcher sizes it (sgl_ess/integration/sglang/launcher/launcher_defaults.py): an
explicit budget (--ess-memory-pool-size-gb, ess_config.memory_pool_size_gb, SGLESS_MEMORY_POOL_SIZE_GB)
is an upper bound on the bytes allocated; with nothing set, a GPU machine gives the pool the
available memory minus the safety margin (sgl_ess/serving/host_memory.py). The fit test is the
launcher's own `check_host_pool`, so the doctor and the launcher cannot disagree.

RLIMIT_MEMLOCK: what it bounds, honestly. It bounds mlock()/mlockall() -- what --ess-lock-host-memory
does, in every process that maps the pool (the scheduler and its prefetch worker each lock it all;
the launcher refuses too little with sgl_ess.serving.preflight.check_memlock) -- and RDMA
registration of host memory (ibv_reg_mr, as Mooncake's RDMA transport does), unless the process
holds CAP_IPC_LOCK.
The pinning sgl-ess does by default, cudaHostRegister, goes through the NVIDIA driver, which pins
with get_user_pages and does not charge this limit (open-gpu-kernel-modules, os-mlock.c
`os_lock_user_pages`); that reading has not been confirmed on a GPU here.
"""
from __future__ import annotations

import resource
from dataclasses import dataclass

from sgl_ess.doctor.finding import Finding, bytes_text
from sgl_ess.serving import host_memory
from sgl_ess.serving.preflight import PreflightError

MEMLOCK_FIX = ("raise RLIMIT_MEMLOCK to unlimited (or >= the bytes to lock): docker run --ulimit memlock=-1:-1; "
               "Kubernetes: the container runtime's default ulimits (containerd / CRI-O config) or grant "
               "CAP_IPC_LOCK; systemd: LimitMEMLOCK=infinity; a login shell: `* - memlock unlimited` in "
               "/etc/security/limits.conf")


@dataclass(frozen=True)
class PlannedPool:
    nbytes: int | None          # None: unknown (no budget given and no /proc/meminfo)
    source: str


def planned_pool(pool_bytes: int | None, pool_gb: float, info: dict[str, int]) -> PlannedPool:
    if pool_bytes:
        return PlannedPool(pool_bytes, f"--pool-bytes {pool_bytes}")
    if pool_gb:
        return PlannedPool(int(pool_gb * 1e9), f"memory_pool_size_gb {pool_gb:g}, an upper bound")
    usable = host_memory.usable_bytes(info)
    return PlannedPool(usable, "the launcher's default on a GPU machine: MemAvailable minus the safety margin")


def check_host_memory(pool: PlannedPool, info: dict[str, int], meminfo_path: str = "/proc/meminfo") -> Finding:
    if "MemAvailable" not in info or "MemTotal" not in info or pool.nbytes is None:
        return Finding("host-memory", "skip",
                       f"no MemTotal / MemAvailable in {meminfo_path}: host pool fit not checked")
    margin = host_memory.safety_margin_bytes(info["MemTotal"])
    try:
        host_memory.check_host_pool(pool.nbytes, pool.source, info)
    except PreflightError as e:
        return Finding("host-memory", "fail", str(e),
                       "lower --ess-memory-pool-size-gb (or --max-total-tokens), or free host memory "
                       "(the pool is page-locked on a GPU: it cannot be swapped out)")
    return Finding("host-memory", "ok",
                   f"host pool {bytes_text(pool.nbytes)} ({pool.source}) fits: MemAvailable "
                   f"{bytes_text(info['MemAvailable'])} of {bytes_text(info['MemTotal'])}, "
                   f"{bytes_text(margin)} kept free")


def memlock_limits() -> tuple[int | None, int | None]:
    """(soft, hard) RLIMIT_MEMLOCK in bytes; None = unlimited."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return (None if soft == resource.RLIM_INFINITY else soft, None if hard == resource.RLIM_INFINITY else hard)


def _limit(n: int | None) -> str:
    return "unlimited" if n is None else f"{bytes_text(n)} (ulimit -l {n // 1024})"


def check_memlock(lock_bytes: int, pool_bytes: int | None, soft: int | None, hard: int | None,
                  cap_ipc_lock: bool) -> Finding:
    """`lock_bytes`: what --ess-lock-host-memory would lock in each process (0: not planned).
    The soft limit is what mlock checks; a hard limit above the need only means the shell can raise it."""
    limits = f"RLIMIT_MEMLOCK soft {_limit(soft)}, hard {_limit(hard)}"
    if cap_ipc_lock:
        return Finding("memlock", "ok", f"{limits}; CAP_IPC_LOCK is held, so the limit does not bound locking")
    if lock_bytes > 0:
        if soft is None or soft >= lock_bytes:
            return Finding("memlock", "ok", f"{limits} >= the {bytes_text(lock_bytes)} --ess-lock-host-memory "
                                            f"locks per process")
        if hard is None or hard >= lock_bytes:
            return Finding("memlock", "warn",
                           f"{limits}: the soft limit is below the {bytes_text(lock_bytes)} --ess-lock-host-memory "
                           f"locks; the hard limit allows it",
                           "raise the soft limit in the shell that launches the server: `ulimit -l unlimited`")
        return Finding("memlock", "fail",
                       f"{limits}: below the {bytes_text(lock_bytes)} --ess-lock-host-memory locks per process "
                       f"(containers often default to 64 KiB or 8 MiB)", MEMLOCK_FIX)
    pool = f" (the planned pool is {bytes_text(pool_bytes)})" if pool_bytes else ""
    return Finding("memlock", "info",
                   f"{limits}; no locking planned (pass --ess-lock-host-memory or --lock-bytes to check it). The "
                   f"limit bounds mlock() and RDMA registration of host memory (ibverbs, e.g. Mooncake in PD): "
                   f"those need it unlimited or >= the bytes they lock{pool}. The default pinning, "
                   f"cudaHostRegister, is done by the NVIDIA driver, which does not charge this limit "
                   f"(not yet confirmed on a GPU here)")
