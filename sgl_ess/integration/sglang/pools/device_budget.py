"""What SGLang's GPU pool budget set aside for each ESS store (cuda_memory.py fills it before the
pools are built), and the check a store makes once it exists. Memory: one small dict."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

RESERVED: dict[str, int] = {}      # runner ("target", "draft") -> device bytes set aside for its store


def note_store(runner: str, allocated: int) -> None:
    """A store was built on CUDA with `allocated` device bytes: say so when that is more than the
    pool budget set aside for it (SGLang sized its pools assuming less was in use), e.g. a PD decode
    node's pre-allocated request rows, which the budget does not count."""
    reserved = RESERVED.get(runner)
    if reserved is not None and allocated > reserved:
        logger.warning("ESS: the %s store allocates %d B on the GPU but the pool budget set aside %d B: SGLang's pools "
                       "were sized for %d B more free memory than there is; lower --ess-hot-slots-per-request or "
                       "--max-running-requests if the GPU runs out of memory", runner, allocated, reserved,
                       allocated - reserved)
