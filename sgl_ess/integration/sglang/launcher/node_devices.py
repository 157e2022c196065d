"""The devices of the node the launcher plans for: CPU, or N GPUs of M bytes each.

A real launch plans for the devices it has (torch.cuda). ``--ess-explain`` may plan for another node
with ``--ess-explain-device cuda:N:GiB`` (N GPUs of GiB GiB each, e.g. ``cuda:8:141`` for an 8 x H200
node) or ``cpu``: the CUDA branch of every default and check is then taken on any machine, and
nothing is started. Host memory is always this machine's (/proc/meminfo). Owns no state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from sgl_ess.serving.preflight import PreflightError

GIB = 1 << 30
SPEC_HELP = ("auto (this machine's devices) | cpu | cuda:N:GiB (N GPUs per node of GiB GiB each, e.g. cuda:8:141 "
             "for 8 x H200): the devices --ess-explain plans for; only with --ess-explain")


@dataclass(frozen=True)
class NodeDevices:
    kind: str                          # "cpu" | "cuda"
    gpus: int = 0                      # per node
    gpu_memory_bytes: Optional[int] = None
    source: str = "this machine"

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
    m = re.fullmatch(r"cuda:(\d+):(\d+(?:\.\d+)?)", spec)
    if not m or int(m.group(1)) < 1 or float(m.group(2)) <= 0:
        raise PreflightError(f"--ess-explain-device {spec}: expected auto, cpu or cuda:N:GiB with N >= 1 GPUs and "
                             f"GiB > 0 per GPU (e.g. cuda:8:141)")
    return NodeDevices("cuda", int(m.group(1)), int(float(m.group(2)) * GIB), f"--ess-explain-device {spec}")


def detect() -> NodeDevices:
    """This machine's devices, as torch sees them."""
    import torch

    if not torch.cuda.is_available():
        return NodeDevices("cpu")
    n = torch.cuda.device_count()
    try:
        mem = int(torch.cuda.get_device_properties(0).total_memory)
    except (RuntimeError, AssertionError):
        mem = None
    return NodeDevices("cuda", n, mem, "this machine (torch.cuda)")
