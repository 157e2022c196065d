"""The devices of the node the launcher plans for: CPU, or N GPUs of M bytes each.

A real launch plans for the devices and host memory it has (torch.cuda, /proc/meminfo).
``--ess-explain`` may plan for another node with ``--ess-explain-device cuda:N:GiB[:HostGiB]`` (N GPUs of
GiB GiB each, and HostGiB GiB of host memory, all of it taken as available; e.g. ``cuda:8:141:2048`` for
an 8 x H200 node with 2 TiB) or ``cpu``: the CUDA branch of every default and check is then taken on any
machine, and nothing is started. Without HostGiB the host memory is this machine's, and the plan says
so. Owns no state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from sgl_ess.serving.preflight import PreflightError

GIB = 1 << 30
SPEC_HELP = ("auto (this machine's devices) | cpu | cuda:N:GiB[:HostGiB] (N GPUs per node of GiB GiB each and, "
             "optionally, HostGiB GiB of host memory, all taken as available; e.g. cuda:8:141:2048 for 8 x H200 "
             "with 2 TiB of host memory): the node --ess-explain plans for; only with --ess-explain. Without "
             "HostGiB the host pool is sized from THIS machine's /proc/meminfo")


@dataclass(frozen=True)
class NodeDevices:
    kind: str                          # "cpu" | "cuda"
    gpus: int = 0                      # per node
    gpu_memory_bytes: Optional[int] = None
    source: str = "this machine"
    host_memory_bytes: Optional[int] = None   # the node's host memory when given (spec); None: /proc/meminfo
    sm_major: Optional[int] = None            # GPU compute capability major (detect(); None: not known)

    def meminfo(self) -> dict[str, int]:
        """Host memory as serving/host_memory reads it: the given node's (all of it available), or this
        machine's /proc/meminfo."""
        from sgl_ess.serving import host_memory

        if self.host_memory_bytes is None:
            return host_memory.meminfo()
        return {"MemTotal": self.host_memory_bytes, "MemAvailable": self.host_memory_bytes}

    def host_memory_source(self) -> str:
        return ("this machine's /proc/meminfo" if self.host_memory_bytes is None else
                f"{self.host_memory_bytes / GIB:g} GiB given by {self.source}, all of it taken as available")

    @property
    def has_cuda(self) -> bool:
        return self.kind == "cuda"

    def describe(self) -> str:
        if not self.has_cuda:
            return f"CPU ({self.source})"
        mem = f"{self.gpu_memory_bytes / GIB:.1f} GiB" if self.gpu_memory_bytes else "unknown memory"
        return f"{self.gpus} CUDA GPU(s) of {mem} each ({self.source})"


def parse_spec(spec: str) -> Optional[NodeDevices]:
    """`spec` from --ess-explain-device (None for auto). Raises PreflightError."""
    if spec in (None, "", "auto"):
        return None
    if spec == "cpu":
        return NodeDevices("cpu", source="--ess-explain-device cpu")
    m = re.fullmatch(r"cuda:(\d+):(\d+(?:\.\d+)?)(?::(\d+(?:\.\d+)?))?", spec)
    if not m or int(m.group(1)) < 1 or float(m.group(2)) <= 0 or (m.group(3) and float(m.group(3)) <= 0):
        raise PreflightError(f"--ess-explain-device {spec}: expected auto, cpu or cuda:N:GiB[:HostGiB] with N >= 1 "
                             f"GPUs, GiB > 0 per GPU and HostGiB > 0 of host memory (e.g. cuda:8:141:2048)")
    host = int(float(m.group(3)) * GIB) if m.group(3) else None
    return NodeDevices("cuda", int(m.group(1)), int(float(m.group(2)) * GIB), f"--ess-explain-device {spec}", host)


def detect() -> NodeDevices:
    """This machine's devices, as torch sees them."""
    import torch

    if not torch.cuda.is_available():
        return NodeDevices("cpu")
    n = torch.cuda.device_count()
    try:
        props = torch.cuda.get_device_properties(0)
        mem, major = int(props.total_memory), int(props.major)
    except (RuntimeError, AssertionError):
        mem = major = None
    return NodeDevices("cuda", n, mem, "this machine (torch.cuda)", sm_major=major)
