"""Is there a usable NVIDIA GPU, and the FlashTrans probe on it.

Cheap first: without a /dev/nvidia<N> device node nothing imports torch (the CPU path stays fast).
With one, torch is imported and asked; the probe itself is gpu_probe.py.
"""
from __future__ import annotations

import glob
import os

from sgl_ess.doctor.finding import Finding

NOT_RUN_NOTE = "this probe has not yet run on a GPU (written and tested only on CPU)"


def gpu_absent_reason(dev_root: str = "/dev") -> str | None:
    """None when a CUDA GPU is usable, else why not."""
    if not glob.glob(os.path.join(dev_root, "nvidia[0-9]*")):
        return f"no {dev_root}/nvidia0: no NVIDIA driver device node"
    try:
        import torch
    except ImportError as e:
        return f"torch not importable ({e})"
    if not torch.cuda.is_available():
        build = "a CPU-only torch build" if torch.version.cuda is None else f"CUDA {torch.version.cuda} build"
        return f"torch.cuda.is_available() is False ({build}, torch {torch.__version__})"
    return None


def check_gpu_probe(absent_reason: str | None, probe: bool, seconds: float, sys_root: str) -> Finding:
    if absent_reason:
        return Finding("gpu-probe", "skip", f"no GPU: skipped ({absent_reason}); {NOT_RUN_NOTE}")
    if not probe:
        return Finding("gpu-probe", "skip", "skipped (--no-probe)")
    from sgl_ess.doctor.gpu_probe import run_probe

    return run_probe(seconds, sys_root)
