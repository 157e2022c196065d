"""GPU hardware profiles, loaded from data/hardware.json (each value carries its source there).

Peak rates only; efficiency factors live in the op profile (profile.py) so they are never hidden here.
Units: bytes per second and FLOP per second after loading; the JSON holds GB/s and TFLOPS (1e9/1e12).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .config import SimConfigError, load_data


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops_per_s: float
    fp8_flops_per_s: float
    pcie_bytes_per_s: float      # theoretical, per direction
    nvlink_bytes_per_s: float    # per direction, per GPU
    rdma_bytes_per_s: float      # per GPU NIC, per direction
    source: str

    def flops_per_s(self, dtype: str) -> float:
        return self.fp8_flops_per_s if dtype == "fp8" else self.bf16_flops_per_s


@lru_cache(maxsize=None)
def _profiles() -> dict[str, HardwareProfile]:
    out = {}
    for name, p in load_data("hardware.json")["profiles"].items():
        out[name] = HardwareProfile(
            name=name, memory_bytes=p["memory_GB"] * 1e9, hbm_bytes_per_s=p["hbm_GBps"] * 1e9,
            bf16_flops_per_s=p["bf16_tflops"] * 1e12, fp8_flops_per_s=p["fp8_tflops"] * 1e12,
            pcie_bytes_per_s=p["pcie_GBps"] * 1e9, nvlink_bytes_per_s=p["nvlink_GBps"] * 1e9,
            rdma_bytes_per_s=p["rdma_GBps"] * 1e9, source=p["source"])
    return out


def known_hardware() -> list[str]:
    return sorted(_profiles())


def get_hardware(name: str) -> HardwareProfile:
    """Look a profile up by (case-insensitive) name; unknown names list the known ones."""
    key = name.lower()
    if key not in _profiles():
        raise SimConfigError(f"hardware = {name!r}: unknown GPU profile; expected one of "
                             f"{', '.join(known_hardware())} (data/hardware.json); fix --hardware")
    return _profiles()[key]
