"""Issue 16, defect 7: ``--ess-warmup-queries 0`` turns the LRU warmup off (it was ``max(1, w)``:
one query's top-k was still loaded). Driven in-process through the real ess backend's extend."""

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.backend_registration import create_ess_backend  # noqa: E402

from ._fake_runner import causal_topk, fake_runner, forward_batch, layer, place_requests, query, shared_pools, \
    write_rows  # noqa: E402
from ._spec_fixtures import ess_env, server_args  # noqa: E402,F401

ROWS, PROMPTS, LAYERS = [1, 2], [150, 90], 2


def _warmup_rows_after_prefill(ess_env, warmup_queries: int) -> int:
    ess_env(hot_slots_per_request=24, warmup_queries=warmup_queries)
    g = torch.Generator().manual_seed(5)
    req_pool, alloc = shared_pools()
    runner = fake_runner(req_pool, alloc, LAYERS)
    place_requests(req_pool, ROWS, PROMPTS)
    r2t = req_pool.req_to_token
    for li in range(LAYERS):
        for r, p in zip(ROWS, PROMPTS):
            write_rows(runner, li, r2t[r, :p], g)
    backend = create_ess_backend(runner)
    qpos = [p - 4 + j for p in PROMPTS for j in range(4)]
    fb = forward_batch("EXTEND", ROWS, PROMPTS, torch.cat([r2t[r, p - 4:p] for r, p in zip(ROWS, PROMPTS)]),
                       extend_lens=[4, 4])
    for li in range(LAYERS):
        backend.forward_extend(query(g, len(qpos)), None, None, layer(li), fb, save_kv_cache=False,
                               topk_indices=causal_topk(g, qpos))
    store = backend.ess.store
    store.engine.drain()
    assert all(bool(store.hot.is_open[r]) for r in ROWS)
    return int(store.counters.warmup_rows.sum())


def test_warmup_queries_zero_opens_hot_buffers_cold(ess_env, server_args):
    assert _warmup_rows_after_prefill(ess_env, 4) > 0
    assert _warmup_rows_after_prefill(ess_env, 0) == 0
