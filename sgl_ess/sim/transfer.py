"""Transfer model: how long host<->GPU latent traffic takes.

A miss moves one 656 B latent row host->GPU; each new token writes one row GPU->host per layer.
FlashTrans (GPU threads reading pinned host memory through UVA) reaches the paper's 37 GiB/s
host->GPU and 43 GiB/s GPU->host on PCIe 5.0; one cudaMemcpyAsync per row reaches 0.79 / 0.23 GiB/s.
On other PCIe generations the FlashTrans rates scale with the link (paper_pcie_GBps is their
reference); per-row memcpy is latency-bound and does not scale. The paper's "GB/s" is read as GiB/s:
80 requests x 512 misses x 656 B at 37 GiB/s is exactly the 675 us it reports.
"""
from __future__ import annotations

from .config import EssConfig
from .constants import const
from .hardware import HardwareProfile

GIB = 2 ** 30


def h2d_bytes_per_s(ess: EssConfig, hw: HardwareProfile) -> float:
    """Effective host->GPU rate for miss fetches."""
    if ess.pcie_h2d_gibps is not None:
        return ess.pcie_h2d_gibps * GIB
    if ess.transfer == "memcpy":
        return const("memcpy_h2d_GiBps") * GIB
    return const("flashtrans_h2d_GiBps") * GIB * hw.pcie_bytes_per_s / (const("paper_pcie_GBps") * 1e9)


def d2h_bytes_per_s(ess: EssConfig, hw: HardwareProfile) -> float:
    """Effective GPU->host rate for write-back; follows an --pcie-h2d-gibps override proportionally."""
    if ess.transfer == "memcpy":
        base = const("memcpy_d2h_GiBps") * GIB
    else:
        base = const("flashtrans_d2h_GiBps") * GIB * hw.pcie_bytes_per_s / (const("paper_pcie_GBps") * 1e9)
    if ess.pcie_h2d_gibps is not None:
        base *= ess.pcie_h2d_gibps * GIB / h2d_bytes_per_s(EssConfig(transfer=ess.transfer), hw)
    return base


def transfer_us(rows: float, row_bytes: int, bytes_per_s: float) -> float:
    """Time to move `rows` rows of `row_bytes` each at `bytes_per_s`; rows may be a mean (fractional)."""
    if rows < 0 or row_bytes < 0 or bytes_per_s <= 0:
        raise ValueError(f"transfer_us(rows={rows}, row_bytes={row_bytes}, bytes_per_s={bytes_per_s}): "
                         f"expected rows >= 0, row_bytes >= 0, bytes_per_s > 0")
    return rows * row_bytes / bytes_per_s * 1e6
