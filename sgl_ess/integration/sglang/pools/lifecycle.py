"""Frees ESS memory when SGLang frees its own: request rows (finish, abort, retract) and token
pages (request end without caching, radix-cache eviction, flush).

One store adapter per model runner (a speculative draft runner in the same process gets its
own: its latent rows differ from the target's). The ``ess`` backend factory registers each
adapter with the request pool and token allocator it serves; the hooks reach exactly the
adapters of the pool / allocator SGLang is freeing. With ESS off there are none and every hook
is a no-op.
"""

from __future__ import annotations


import torch

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from .. import targets

_adapters: list = []          # every EssPoolAdapter of this process, target runner first


def adapter_for(runner):
    """The adapter already built for `runner` (backends are built more than once per runner)."""
    for a in _adapters:
        if a.runner_id == id(runner):
            return a
    return None


def register_adapter(adapter) -> None:
    _adapters.append(adapter)


def all_adapters() -> list:
    return list(_adapters)


def active_store():
    """The target model runner's adapter (the first built), or None with ESS off."""
    return _adapters[0] if _adapters else None


def _after_free_rows(result, pool, indices, *args, **kwargs):
    for a in _adapters:
        if a.req_pool is pool:
            a.close_rows([int(i) for i in indices])
    return result


def _around_decode_alloc(original_fn, pool, reqs, *args, **kwargs):
    """PD decode node (DecodeReqToTokenPool): rows handed to new requests wait for their first batch
    to open a hot buffer (their KV comes by transfer: no extend opens them here; pool_adapter.
    open_pending); rows a request keeps are left alone."""
    fresh = [r for r in reqs if not r.kv.holds_kv]
    out = original_fn(pool, reqs, *args, **kwargs)
    if out is not None and fresh:
        rows = [int(r.kv.req_pool_idx) for r in fresh]
        for a in _adapters:
            if a.req_pool is pool:
                a.note_rows_allocated(rows)
    return out


def _before_decode_free(pool, req, *args, **kwargs):
    """PD decode node: a freed row's hot buffer is closed (finish, abort, retraction)."""
    row = req.kv.req_pool_idx
    if row is not None:
        for a in _adapters:
            if a.req_pool is pool:
                a.close_rows([int(row)])
    return None


def _page_locs(allocator, page_ids) -> torch.Tensor:
    ids = torch.cat([p.reshape(-1) for p in page_ids]).long().cpu()
    ps = allocator.page_size
    return (ids[:, None] * ps + torch.arange(ps)[None, :]).reshape(-1)


def _before_release_pages(allocator, *page_ids, **kwargs):
    if not page_ids:
        return None
    for a in _adapters:
        if a.allocator is allocator:
            locs = _page_locs(allocator, page_ids)
            if locs.numel():
                a.clear_locs(locs)
    return None


def _before_allocator_clear(allocator, *args, **kwargs):
    for a in _adapters:
        if a.allocator is allocator:
            if hasattr(a, "clear_all"):          # host rows not keyed by token location (V4: C4 locations)
                a.clear_all()
            else:
                a.clear_locs(torch.arange(a.store_cfg.host_capacity_tokens))
    return None


def _after_internal_state(result, *args, **kwargs):
    _active = active_store()
    if _active is not None:
        result.internal_state["ess"] = _active.usage()
    else:
        result.internal_state["ess"] = {"enabled": False}
    return result


def register() -> None:
    HookRegistry.register(targets.REQ_ROWS_FREE, _after_free_rows, HookType.AFTER)
    HookRegistry.register(targets.DECODE_REQ_ROWS_ALLOC, _around_decode_alloc, HookType.AROUND)
    HookRegistry.register(targets.DECODE_REQ_ROWS_FREE, _before_decode_free, HookType.BEFORE)
    HookRegistry.register(targets.PAGES_RELEASE, _before_release_pages, HookType.BEFORE)
    HookRegistry.register(targets.ALLOCATOR_CLEAR, _before_allocator_clear, HookType.BEFORE)
    HookRegistry.register(targets.INTERNAL_STATE, _after_internal_state, HookType.AFTER)
