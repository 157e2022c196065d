"""PCIe link of each NVIDIA GPU: the speed and width trained now vs the most the link supports.

A GPU that trained at x8, or at a lower generation, halves the host->device bandwidth ESS's
fetches ride on, and the fetch stops hiding behind compute (GPU utilisation dips). Width lost is
a hardware or seating fault. Speed can also drop legitimately: an idle GPU lowers its link speed
to save power (ASPM / the driver's power states), so a speed drop seen at idle is a warning to
re-check under load, and a failure only with `under_load=True` (--under-load).
"""
from __future__ import annotations

from sgl_ess.doctor.finding import Finding
from sgl_ess.doctor.sysfs import PciGpu, link_gb_per_s, parse_speed_gts

CHECK = "pcie"

FIX = ("re-check under load (an idle GPU may lower its link speed: run `python -m sgl_ess.doctor "
       "--under-load` while the GPU is busy, or read LnkSta in `sudo lspci -vv -s BDF` / "
       "`nvidia-smi -q -d PCI` while serving); if it stays low: reseat the card and its riser, set "
       "the slot's PCIe generation to Auto or the card's generation in the BIOS, and turn off ASPM / "
       "PCIe power saving for the slot (BIOS, or kernel pcie_aspm=off)")


def _rate(gts: float | None, lanes: int | None) -> str:
    if gts is None or lanes is None:
        return ""
    return f", ~{link_gb_per_s(gts, lanes):.1f} GB/s per direction"


def check_gpu_link(gpu: PciGpu, under_load: bool = False) -> Finding:
    now_gts, max_gts = parse_speed_gts(gpu.speed_now), parse_speed_gts(gpu.speed_max)
    now = f"{gpu.speed_now or '?'} x{gpu.width_now if gpu.width_now is not None else '?'}"
    most = f"{gpu.speed_max or '?'} x{gpu.width_max if gpu.width_max is not None else '?'}"
    if None in (now_gts, max_gts, gpu.width_now, gpu.width_max):
        return Finding(CHECK, "info", f"{gpu.bdf}: link not fully reported by sysfs (now {now}, max {most}); "
                                      f"a VM or passthrough may hide it")
    lost = []
    if gpu.width_now < gpu.width_max:
        lost.append(f"width x{gpu.width_now} of x{gpu.width_max}")
    if now_gts < max_gts:
        lost.append(f"speed {now_gts:g} of {max_gts:g} GT/s")
    if not lost:
        return Finding(CHECK, "ok", f"{gpu.bdf}: {now} = max{_rate(now_gts, gpu.width_now)}")
    width_lost = gpu.width_now < gpu.width_max
    status = "fail" if (width_lost or under_load) else "warn"
    why = ("" if width_lost or under_load else
           "; idle GPUs may lower link speed to save power: re-check under load")
    return Finding(CHECK, status,
                   f"{gpu.bdf}: link downgraded ({', '.join(lost)}): now {now}{_rate(now_gts, gpu.width_now)}, "
                   f"max {most}{_rate(max_gts, gpu.width_max)}{why}", FIX)


def check_pcie(gpus: list[PciGpu], sys_root: str = "/sys", under_load: bool = False) -> list[Finding]:
    if not gpus:
        return [Finding(CHECK, "skip", f"no GPU: skipped (no NVIDIA display/3D controller, vendor 0x10de "
                                       f"class 0x03xxxx, under {sys_root}/bus/pci/devices)")]
    return [check_gpu_link(g, under_load) for g in gpus]
