"""Fake sysfs / procfs trees for the doctor's tests (tmp_path based; nothing real is read)."""
from __future__ import annotations

from pathlib import Path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


def pci_device(sys_root: Path, bdf: str, *, vendor="0x10de", cls="0x030200", speed_now="16.0 GT/s PCIe",
               speed_max="16.0 GT/s PCIe", width_now=16, width_max=16, numa_node=0) -> Path:
    d = sys_root / "bus" / "pci" / "devices" / bdf
    for name, value in (("vendor", vendor), ("class", cls), ("current_link_speed", speed_now),
                        ("max_link_speed", speed_max), ("current_link_width", width_now),
                        ("max_link_width", width_max), ("numa_node", numa_node)):
        if value is not None:
            write(d / name, str(value))
    return d


def numa_nodes(sys_root: Path, online: str) -> None:
    write(sys_root / "devices" / "system" / "node" / "online", online)


def meminfo(path: Path, total_kb: int, available_kb: int) -> Path:
    return write(path, f"MemTotal:       {total_kb} kB\nMemFree:        1000 kB\nMemAvailable:   {available_kb} kB")
