"""Engine choice: which fetch engine a LatentStore runs on this rank, and how index tensors reach the
store's device. `auto_cpu_engine` picks the prefetch worker only when the rank has at least
WORKER_MIN_CPUS cores of its own (`rank_cpu_cores`: its torch intra-op threads, the cores SGLang binds
the rank to), else the inline engine (`--ess-prefetch-engine auto`); `index_to_device` moves an index
tensor to the store's device without making the host wait (pinned, then a non-blocking copy).
"""
from __future__ import annotations

import torch

WORKER_MIN_CPUS = 4


def index_to_device(idx: torch.Tensor, device: torch.device) -> torch.Tensor:
    """idx (int, any device) as int64 on `device`, without making the host wait: already there, a
    conversion on the device; a host tensor bound for an accelerator is copied into pinned memory first
    (torch's caching host allocator keeps the block until the copy ran), then copied without blocking -
    a pageable host -> device copy would wait for the device."""
    if idx.device == device:
        return idx.to(torch.int64)
    if idx.device.type == "cpu" and device.type != "cpu":
        return idx.to(torch.int64).pin_memory().to(device, non_blocking=True)
    return idx.to(device, torch.int64)


def rank_cpu_cores() -> int:
    """Cores this scheduler rank computes on: its torch intra-op threads (SGLang binds them to the rank's
    SGLANG_CPU_OMP_THREADS_BIND group with several ranks on a node), never more than the machine has."""
    import os

    import torch

    return max(1, min(torch.get_num_threads(), os.cpu_count() or 1))


def auto_cpu_engine(cores: int | None = None) -> str:
    """The prefetch worker pays off when it has a core of its own: the scheduler's torch already
    uses two threads, and a worker sharing those cores only adds a round trip per plan (on 2 cores,
    bench/results/serving_20261129T180418Z.json: pooled over 10 interleaved runs each, the worker
    served 0.95x the tokens/s of inline). `cores`: this rank's cores (rank_cpu_cores()), not the
    machine's: TP 4 on 8 cores leaves each rank 2."""
    return "worker" if (rank_cpu_cores() if cores is None else cores) >= WORKER_MIN_CPUS else "inline"
