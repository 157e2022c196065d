"""Environment the launcher sets before SGLang starts its processes (official SGLang/torch switches).

  * no CUDA: ``SGLANG_USE_CPU_ENGINE=1``; ``SGLANG_CUDA_COREDUMP_BEFORE_CRASH=0`` and
    ``SGLANG_PYSPY_DUMP_BEFORE_CRASH=0`` (else a crash waits 5 s + 60 s "for CUDA coredumps").
  * one node: ``SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE=file://<temp file>``. SGLang's default
    ``tcp://host:port`` rendezvous makes torch's TCPStore listen on ALL interfaces whatever the
    host; a file store opens no port. Multi-node keeps SGLang's TCP rendezvous.
  * a loopback ``--host``: ``GLOO_SOCKET_IFNAME=lo``, so gloo's own sockets bind there too.
A value the user already set is never overridden.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
import uuid

_dist_file: str | None = None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def apply(host: str, has_cuda: bool, nnodes: int, dist_init_addr: str | None) -> None:
    global _dist_file
    if not has_cuda:
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        os.environ.setdefault("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "0")
        os.environ.setdefault("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "0")
    if nnodes <= 1 and not dist_init_addr and not os.environ.get("SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE"):
        _dist_file = os.path.join(tempfile.gettempdir(), f"sgl_ess_dist_{os.getpid()}_{uuid.uuid4().hex[:8]}")
        os.environ["SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE"] = "file://" + _dist_file
    if _is_loopback(host):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def cleanup() -> None:
    if _dist_file and os.path.exists(_dist_file):
        try:
            os.remove(_dist_file)
        except OSError:
            pass
