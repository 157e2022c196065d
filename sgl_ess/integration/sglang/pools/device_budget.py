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


def draft_tokens() -> int:
    """Query tokens per request of an MTP forward (TARGET_VERIFY, DRAFT_EXTEND_V2) in this process:
    SGLang's largest draft-token count when speculative decoding is on, else 0."""
    from sglang.srt.runtime_context import get_spec, max_speculative_num_draft_tokens

    algo = getattr(get_spec(), "speculative_algorithm", None)
    if algo in (None, "", "NONE") or getattr(algo, "name", algo) == "NONE":
        return 0
    return int(max_speculative_num_draft_tokens() or 0)


def verify_rows_per_request(draft: int, topk: int, hot_slots: int) -> int:
    """Slot-space rows per request row that an MTP forward needs on the device (store/verify_slots.py):
    `draft` window rows (this forward's positions, read by the sparse kernel as slots but never
    admitted) and the committed entries past the hot buffer when the union of `draft` top-k sets can
    exceed it (draft x topk - hot_slots, 0 at the default 4 x topk hot slots with <= 4 draft
    tokens). 0 without MTP. Counted in StoreConfig.device_allocation (slot_rows), so the pool budget
    (cuda_memory.py) sets it aside."""
    if draft <= 0:
        return 0
    return draft + max(0, draft * topk - hot_slots)
