"""Reading /sys: NVIDIA GPUs on the PCI bus with their link state and NUMA node, and cpulists.

Every function takes the sysfs root (default /sys) so tests can point it at a fake tree. Files
that are missing or unreadable read as None: a VM or container may hide any of them.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass

NVIDIA_VENDOR = "0x10de"
DISPLAY_CLASS_PREFIX = "0x03"       # PCI base class 03: VGA (0x0300xx) and 3D controllers (0x0302xx)


def read_text(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def parse_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parse_speed_gts(text: str | None) -> float | None:
    """'16.0 GT/s PCIe' (newer kernels), '8 GT/s' (older), 'Unknown' -> 16.0, 8.0, None."""
    if not text:
        return None
    try:
        return float(text.split()[0])
    except ValueError:
        return None


def parse_cpulist(text: str | None) -> set[int] | None:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}; '' -> set(); None or malformed -> None."""
    if text is None:
        return None
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return None
    return out


@dataclass(frozen=True)
class PciGpu:
    bdf: str                        # 0000:17:00.0
    numa_node: int | None           # None: the firmware gives none (sysfs says -1) or the file is missing
    speed_now: str | None           # raw sysfs text, e.g. '16.0 GT/s PCIe'
    speed_max: str | None
    width_now: int | None           # lanes
    width_max: int | None


def nvidia_gpus(sys_root: str = "/sys") -> list[PciGpu]:
    """NVIDIA display / 3D controllers under <sys_root>/bus/pci/devices, sorted by address."""
    out = []
    for dev in sorted(glob.glob(os.path.join(sys_root, "bus", "pci", "devices", "*"))):
        if read_text(os.path.join(dev, "vendor")) != NVIDIA_VENDOR:
            continue
        if not (read_text(os.path.join(dev, "class")) or "").startswith(DISPLAY_CLASS_PREFIX):
            continue
        node = parse_int(read_text(os.path.join(dev, "numa_node")))
        out.append(PciGpu(
            bdf=os.path.basename(dev),
            numa_node=None if node is None or node < 0 else node,
            speed_now=read_text(os.path.join(dev, "current_link_speed")),
            speed_max=read_text(os.path.join(dev, "max_link_speed")),
            width_now=parse_int(read_text(os.path.join(dev, "current_link_width"))),
            width_max=parse_int(read_text(os.path.join(dev, "max_link_width")))))
    return out


def link_gb_per_s(speed_gts: float, lanes: int) -> float:
    """One direction's raw link rate in GB/s, after line coding and before protocol overhead:
    8b/10b up to 5 GT/s (PCIe 1-2), 128b/130b at 8-32 GT/s (PCIe 3-5), FLIT 242/256 at 64 (PCIe 6)."""
    coding = 0.8 if speed_gts <= 5.0 else (128 / 130 if speed_gts <= 32.0 else 242 / 256)
    return speed_gts * lanes * coding / 8
