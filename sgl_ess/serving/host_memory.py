"""Host memory for the ESS host pool: how much there is, and a check before the model loads.

The host pool (the latent history of every request) is the largest allocation sgl-ess makes:
200 GB in the paper's setting. It is checked against the machine's available memory
(/proc/meminfo MemAvailable) minus a stated safety margin before anything loads, and on a GPU
machine, where nothing else sizes it, its default is that available memory minus the margin.
No torch, no sglang: the launcher runs this first.
"""
from __future__ import annotations

from sgl_ess.serving.preflight import PreflightError

SAFETY_MARGIN_FRACTION = 0.10      # of MemTotal, left to the OS, SGLang, the model's host copy, page cache
SAFETY_MARGIN_MIN_BYTES = 8 << 30  # at least 8 GiB


def meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """MemTotal / MemAvailable in bytes ({} where the file is missing)."""
    out = {}
    try:
        with open(path) as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        return {}
    return out


def safety_margin_bytes(total: int) -> int:
    return max(SAFETY_MARGIN_MIN_BYTES, int(SAFETY_MARGIN_FRACTION * total))


def usable_bytes(info: dict[str, int]) -> int | None:
    """Host memory the pool may take: MemAvailable minus the margin (None when unknown)."""
    if "MemAvailable" not in info or "MemTotal" not in info:
        return None
    return max(0, info["MemAvailable"] - safety_margin_bytes(info["MemTotal"]))


def check_host_pool(pool_bytes: int, source: str, info: dict[str, int] | None = None) -> None:
    """Raise PreflightError when a host pool of `pool_bytes` cannot fit in host memory."""
    info = meminfo() if info is None else info
    usable = usable_bytes(info)
    if usable is None or pool_bytes <= usable:
        return
    margin = safety_margin_bytes(info["MemTotal"])
    raise PreflightError(
        f"the ESS host pool needs {pool_bytes / 1e9:.2f} GB ({source}), but this machine has "
        f"{info['MemAvailable'] / 1e9:.2f} GB available and sgl-ess keeps {margin / 1e9:.2f} GB free "
        f"(max of {SAFETY_MARGIN_MIN_BYTES >> 30} GiB and {SAFETY_MARGIN_FRACTION:.0%} of "
        f"{info['MemTotal'] / 1e9:.1f} GB): lower --ess-memory-pool-size-gb (or --max-total-tokens)")
