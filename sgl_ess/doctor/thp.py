"""Transparent huge pages: which mode the kernel is in, and what it means for the ESS host pool.

Informational only: sgl-ess has measured no difference between the modes. What is known: the
host pool is a memfd (sgl_ess/memory/shared_segment.py), i.e. shmem, so its page size follows
`shmem_enabled`, not `enabled` (which governs private anonymous memory: malloc, torch's own
pinned buffers). sgl-ess does not madvise(MADV_HUGEPAGE) the pool, so `advise` means 4 KiB pages.
With 4 KiB pages a 200 GB pool is ~49 million pages: more page-table memory and a longer
start-up (MAP_POPULATE faults every page, cudaHostRegister pins every page); the GPU's fetches
themselves read it through the driver's mappings, which this check does not judge.
"""
from __future__ import annotations

import os

from sgl_ess.doctor.finding import Finding
from sgl_ess.doctor.sysfs import read_text

HUGE_SHMEM = ("always", "within_size", "force")


def selected(text: str | None) -> str | None:
    """'always [madvise] never' -> 'madvise'."""
    if not text or "[" not in text:
        return None
    return text.split("[", 1)[1].split("]", 1)[0]


def check_thp(sys_root: str = "/sys") -> Finding:
    base = os.path.join(sys_root, "kernel", "mm", "transparent_hugepage")
    anon = selected(read_text(os.path.join(base, "enabled")))
    shmem = selected(read_text(os.path.join(base, "shmem_enabled")))
    if anon is None and shmem is None:
        return Finding("thp", "info", f"transparent huge pages not reported ({base} missing)")
    pool = ("huge pages where the kernel finds them" if shmem in HUGE_SHMEM
            else "4 KiB pages (sgl-ess does not madvise the pool)" if shmem in ("advise", "never", "deny")
            else "page size unknown")
    return Finding("thp", "info",
                   f"enabled [{anon or '?'}], shmem_enabled [{shmem or '?'}]: the host pool is a memfd (shmem), "
                   f"so it gets {pool}; 4 KiB pages cost page-table memory and start-up time (populate + pin), "
                   f"no fetch-speed difference has been measured")
