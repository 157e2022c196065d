"""Mixed chunked prefill (``--enable-mixed-chunk``) with ESS on: running requests that ride in a
mixed batch (one query token each, next to another request's prefill chunk) take the decode path
and keep their hot buffers. Driven in-process on the same trace twice - pure decode batches plus
separate prefill chunks, and the same work as mixed batches - the riding requests' outputs, hits,
misses and hot-buffer state are identical (before this, every mixed step re-opened their hot
buffers), and so are the prefilling request's outputs."""

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.backend_registration import create_ess_backend  # noqa: E402

from ._fake_runner import (causal_topk, fake_runner, forward_batch, layer, place_requests, query,  # noqa: E402
                           shared_pools, write_rows)
from ._spec_fixtures import ess_env, server_args  # noqa: E402,F401

RUNNING, PROMPTS, NEW_ROW, NEW_PROMPT, CHUNK, LAYERS = [1, 2], [150, 90], 3, 80, 16, 2


def _run(mixed: bool, mode: str = "EXTEND"):
    g = torch.Generator().manual_seed(3)
    req_pool, alloc = shared_pools()
    runner = fake_runner(req_pool, alloc, LAYERS)
    steps = NEW_PROMPT // CHUNK
    place_requests(req_pool, RUNNING + [NEW_ROW], [p + steps for p in PROMPTS] + [NEW_PROMPT])
    r2t = req_pool.req_to_token
    for li in range(LAYERS):
        for r, p in zip(RUNNING + [NEW_ROW], PROMPTS + [NEW_PROMPT]):
            write_rows(runner, li, r2t[r, :p], g)
    backend = create_ess_backend(runner)
    qpos = [p - 4 + j for p in PROMPTS for j in range(4)]
    fb = forward_batch("EXTEND", RUNNING, PROMPTS, torch.cat([r2t[r, p - 4:p] for r, p in zip(RUNNING, PROMPTS)]),
                       extend_lens=[4, 4])
    for li in range(LAYERS):
        backend.forward_extend(query(g, len(qpos)), None, None, layer(li), fb, save_kv_cache=False,
                               topk_indices=causal_topk(g, qpos))
    outs_running, outs_new = [], []
    for step in range(steps):
        seq = [p + step + 1 for p in PROMPTS]
        loc = torch.stack([r2t[r, s - 1] for r, s in zip(RUNNING, seq)])
        end = (step + 1) * CHUNK
        chunk_loc = r2t[NEW_ROW, end - CHUNK:end]
        chunk_pos = list(range(end - CHUNK, end))
        for li in range(LAYERS):
            write_rows(runner, li, loc, g)
        q_dec, q_new = [query(g, len(RUNNING)) for _ in range(LAYERS)], [query(g, CHUNK) for _ in range(LAYERS)]
        t_dec = [causal_topk(g, [s - 1 for s in seq]) for _ in range(LAYERS)]
        t_new = [causal_topk(g, chunk_pos) for _ in range(LAYERS)]
        if mixed:
            fb = forward_batch(mode, [NEW_ROW] + RUNNING, [end] + seq, torch.cat([chunk_loc, loc]),
                               extend_lens=[CHUNK, 1, 1])
            for li in range(LAYERS):
                out = backend.forward_extend(torch.cat([q_new[li], q_dec[li]]), None, None, layer(li), fb,
                                             save_kv_cache=False, topk_indices=torch.cat([t_new[li], t_dec[li]]))
                outs_new.append(out[:CHUNK])
                outs_running.append(out[CHUNK:])
        else:
            fb_new = forward_batch("EXTEND", [NEW_ROW], [end], chunk_loc, extend_lens=[CHUNK])
            fb_dec = forward_batch("DECODE", RUNNING, seq, loc)
            for li in range(LAYERS):
                outs_new.append(backend.forward_extend(q_new[li], None, None, layer(li), fb_new,
                                                       save_kv_cache=False, topk_indices=t_new[li]))
            for li in range(LAYERS):
                outs_running.append(backend.forward_decode(q_dec[li], None, None, layer(li), fb_dec,
                                                           save_kv_cache=False, topk_indices=t_dec[li]))
    store = backend.ess.store
    store.engine.drain()
    rows = torch.tensor(RUNNING)
    return (outs_running, outs_new, store.counters.hits[:, rows].clone(), store.counters.misses[:, rows].clone(),
            store.hot.slot_to_token[:, rows].clone())


@pytest.mark.parametrize("mode", ["EXTEND", "MIXED"])      # SGLang 0.5.23 hands mixed batches over as EXTEND
def test_mixed_batches_keep_running_hot_buffers(ess_env, server_args, mode):
    ess_env(hot_slots_per_request=24)
    pure = _run(mixed=False)
    mixed = _run(mixed=True, mode=mode)
    for a, b in zip(pure[0], mixed[0]):
        assert torch.equal(a, b), "a running request's output changed in a mixed batch"
    for a, b in zip(pure[1], mixed[1]):
        assert torch.equal(a, b), "the prefilling request's output changed in a mixed batch"
    hits_pure, misses_pure = pure[2], pure[3]
    assert torch.equal(hits_pure, mixed[2]) and torch.equal(misses_pure, mixed[3])
    assert int(hits_pure.sum()) > 0
    assert torch.equal(pure[4], mixed[4])
    rate = int(hits_pure.sum()) / int(hits_pure.sum() + misses_pure.sum())
    print(f"\nhit rate of the running requests: pure decode {rate:.3f} = mixed batches "
          f"{int(mixed[2].sum()) / int(mixed[2].sum() + mixed[3].sum()):.3f}")
