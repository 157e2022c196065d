"""Frees ESS memory when SGLang frees its own: request rows (finish, abort, retract) and token
pages (request end without caching, radix-cache eviction, flush).

The process-wide active store is set by the ``ess`` backend factory (one model runner per
scheduler process); with ESS off there is none and every hook is a no-op.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from . import targets

_active = None  # Optional[EssLatentStore]


def set_active_store(store) -> None:
    global _active
    _active = store


def active_store():
    return _active


def _after_free_rows(result, pool, indices, *args, **kwargs):
    if _active is not None:
        _active.close_rows([int(i) for i in indices])
    return result


def _before_release_pages(allocator, *page_ids, **kwargs):
    if _active is not None and page_ids:
        ids = torch.cat([p.reshape(-1) for p in page_ids]).long().cpu()
        if ids.numel():
            ps = allocator.page_size
            locs = (ids[:, None] * ps + torch.arange(ps)[None, :]).reshape(-1)
            _active.clear_locs(locs)
    return None


def _before_allocator_clear(allocator, *args, **kwargs):
    if _active is not None:
        _active.clear_locs(torch.arange(_active.store_cfg.host_capacity_tokens))
    return None


def _after_internal_state(result, *args, **kwargs):
    if _active is not None:
        result.internal_state["ess"] = _active.usage()
    else:
        result.internal_state["ess"] = {"enabled": False}
    return result


def register() -> None:
    HookRegistry.register(targets.REQ_ROWS_FREE, _after_free_rows, HookType.AFTER)
    HookRegistry.register(targets.PAGES_RELEASE, _before_release_pages, HookType.BEFORE)
    HookRegistry.register(targets.ALLOCATOR_CLEAR, _before_allocator_clear, HookType.BEFORE)
    HookRegistry.register(targets.INTERNAL_STATE, _after_internal_state, HookType.AFTER)
