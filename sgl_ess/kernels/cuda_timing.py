"""Time a GPU operation with CUDA events (the GPU's own clock, not the host's). GPU only."""
from __future__ import annotations

import time


def time_cuda(fn, repeats: int = 0, budget_s: float = 0.0, max_reps: int = 200) -> list[float]:
    """Seconds per call of `fn` after 3 warm-up calls: `repeats` calls, or (repeats=0) as many as fit in
    `budget_s` (at least 5, at most `max_reps`)."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out, start = [], time.monotonic()
    while (len(out) < repeats) if repeats else (len(out) < max_reps and (len(out) < 5 or
                                                                       time.monotonic() - start < budget_s)):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return out
