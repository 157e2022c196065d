"""Environment the launcher sets before SGLang starts its processes (official SGLang/torch switches).

  * no CUDA: ``SGLANG_USE_CPU_ENGINE=1``; ``SGLANG_CUDA_COREDUMP_BEFORE_CRASH=0`` and
    ``SGLANG_PYSPY_DUMP_BEFORE_CRASH=0`` (else a crash waits 5 s + 60 s "for CUDA coredumps").
  * one node: ``SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE=file://<temp file>``. SGLang's default
    ``tcp://host:port`` rendezvous makes torch's TCPStore listen on ALL interfaces whatever the
    host; a file store opens no port. Multi-node keeps SGLang's TCP rendezvous.
  * gloo's own sockets (``GLOO_SOCKET_IFNAME``): one node with a loopback ``--host`` -> ``lo``;
    several nodes -> the interface this machine reaches ``--dist-init-addr`` through (``lo`` when
    that address is loopback, e.g. two test "nodes" on one machine), never chosen from ``--host``.
  * no CUDA and more than one rank in the run: ``SGLANG_CPU_OMP_THREADS_BIND``, the cores this
    process may run on (its affinity) split into one contiguous group per rank on this node
    (SGLang otherwise refuses more ranks in the whole run than this node has NUMA nodes). Fewer cores than ranks: cores are shared
    round-robin, with a warning.
  * PD (``--disaggregation-mode prefill|decode``): ``SGLESS_PD_ROLE`` for the plugin (cpu_fixes.py);
    without CUDA ``MOONCAKE_PROTOCOL=tcp`` (no RDMA device) and, on a prefill node,
    ``SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX=0`` (that path records a CUDA event); with a
    loopback ``--host``, ``SGLANG_HOST_IP=127.0.0.1`` (the address Mooncake advertises to peers).
  * ``SGLESS_RUN_ID`` (always, the launcher's own): ``<launcher pid>-<random>``, inherited by every
    process of the server; the step watchdog keys its stall files by it (with --dp-size > 1 the
    schedulers are not children of the HTTP process), and ``cleanup`` removes this run's.
A value the user already set is never overridden (``SGLESS_RUN_ID`` is the launcher's, not the user's).
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import struct
import tempfile
import uuid

from ..observe.scheduler_watchdog import ENV_RUN_ID   # the reader owns the name

logger = logging.getLogger("sgl_ess")
_dist_file: str | None = None
_SIOCGIFADDR = 0x8915


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _interface_with_address(ip: str) -> str | None:
    """The name of the local IPv4 interface that holds `ip` (None if none does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    return None


def gloo_interface(dist_init_addr: str) -> str | None:
    """The interface gloo should bind to reach `dist_init_addr` (``host:port``); None if unknown."""
    host, _, port = dist_init_addr.rpartition(":")
    host = host.strip("[]") or dist_init_addr
    if _is_loopback(host):
        return "lo"
    try:
        ip = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, int(port or 1)))            # UDP connect sends nothing: it picks the route
            local = s.getsockname()[0]
    except (OSError, ValueError):
        return None
    return "lo" if _is_loopback(local) else _interface_with_address(local)


ENV_PD_ROLE = "SGLESS_PD_ROLE"


def apply(host: str, has_cuda: bool, nnodes: int, dist_init_addr: str | None, pd_role: str | None = None) -> None:
    global _dist_file
    os.environ[ENV_RUN_ID] = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if not has_cuda:
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        os.environ.setdefault("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "0")
        os.environ.setdefault("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "0")
    if pd_role in ("prefill", "decode"):
        os.environ[ENV_PD_ROLE] = pd_role
        if not has_cuda:
            os.environ.setdefault("MOONCAKE_PROTOCOL", "tcp")
            if pd_role == "prefill":
                os.environ.setdefault("SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX", "0")
        if _is_loopback(host):
            os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")
    if nnodes <= 1 and not dist_init_addr and not os.environ.get("SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE"):
        _dist_file = os.path.join(tempfile.gettempdir(), f"sgl_ess_dist_{os.getpid()}_{uuid.uuid4().hex[:8]}")
        os.environ["SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE"] = "file://" + _dist_file
    if nnodes > 1 and dist_init_addr:
        ifname = gloo_interface(dist_init_addr)
        if ifname:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    elif nnodes <= 1 and _is_loopback(host):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def ranks_on_this_node(tp: int, dp: int, pp: int, dp_attention: bool, nnodes: int) -> int:
    """Scheduler processes SGLang starts on one node: DP attention partitions the TP group, plain
    DP replicates it."""
    world = tp * pp * (1 if dp_attention else dp)
    return max(1, world // max(1, nnodes))


def core_groups(cores: list[int], ranks: int) -> list[list[int]]:
    """`cores` split into `ranks` contiguous groups (round-robin single cores when too few)."""
    cores = sorted(cores)
    if len(cores) < ranks:
        return [[cores[i % len(cores)]] for i in range(ranks)]
    base, extra = divmod(len(cores), ranks)
    out, at = [], 0
    for r in range(ranks):
        n = base + (1 if r < extra else 0)
        out.append(cores[at:at + n])
        at += n
    return out


def _spec(group: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (SGLang's bind-list syntax)."""
    parts, start, prev = [], group[0], group[0]
    for c in group[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(parts)


def bind_cpu_threads(server_args, has_cuda: bool) -> str | None:
    """Set SGLANG_CPU_OMP_THREADS_BIND for a multi-rank CPU run (see the module docstring); the
    value set, or None when nothing was needed or the user set it."""
    if has_cuda or os.environ.get("SGLANG_CPU_OMP_THREADS_BIND"):
        return None
    from .compat import layout_of

    lay = layout_of(server_args)[0]
    ranks = ranks_on_this_node(lay.tp, lay.dp, lay.pp, lay.dp_attention, lay.nnodes)
    if ranks * max(1, server_args.nnodes) <= 1:
        return None             # SGLang checks the whole world's ranks; its bind list is per node
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < ranks:
        logger.warning("%d ranks on this node but %d cores: ranks share cores (set SGLANG_CPU_OMP_THREADS_BIND "
                       "to choose)", ranks, len(cores))
    value = "|".join(_spec(g) for g in core_groups(cores, ranks))
    os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = value
    logger.info("SGLANG_CPU_OMP_THREADS_BIND=%s (%d ranks on this node)", value, ranks)
    return value


def cleanup() -> None:
    """At the launcher's exit: its rendezvous file, its server's /dev/shm files (shm_files.py) and the
    step watchdog's stall files of this run."""
    from ..observe import scheduler_watchdog
    from . import shm_files

    if _dist_file and os.path.exists(_dist_file):
        try:
            os.remove(_dist_file)
        except OSError:
            pass
    shm_files.remove_all()
    scheduler_watchdog.remove_stall_files()
