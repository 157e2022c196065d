"""Two-Batch Overlap on CPU: SGLang's ``TboAttnBackend`` with two ess child backends, driven with a
split decode batch in TBO's launch order (per layer: micro-batch a's indexer, a's attention, then
b's indexer, b's attention - a's expert GEMMs run between b's indexer and b's attention on a GPU).

Shown: the split batch's outputs equal the whole batch's (bitwise, every step and layer) and the
hot buffers end in the same state; each child's misses are fetched from its own indexer hand-off
(issued before its attention starts) and awaited inside its attention; the two micro-batches use
disjoint ring groups and ring rows. The recorded issue/await order is printed (pytest -s).
SGLang's full TBO (with DeepEP expert parallelism or DP attention across GPUs) is not run here.
"""

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.layers.attention.tbo_backend import TboAttnBackend  # noqa: E402
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402

from sgl_ess.integration.sglang.backends.backend_registration import create_ess_backend  # noqa: E402
from sgl_ess.integration.sglang.backends.indexer_torch import _EarlyHandoff  # noqa: E402

from ._fake_runner import (causal_topk, fake_runner, forward_batch, layer, place_requests, query,  # noqa: E402
                           shared_pools, write_rows)
from ._spec_fixtures import ess_env, server_args  # noqa: E402,F401

ROWS, PROMPTS, STEPS, LAYERS = [1, 2, 3, 4, 5], [150, 90, 200, 120, 170], 6, 2
SPLIT = 3          # TBO's decode split: the first requests go to micro-batch a


def _indexer_then_attention(backend, fb, li, q, topk, r2t, events, who):
    with forward_context(ForwardContext(attn_backend=backend), forward_batch=fb):
        handoff = _EarlyHandoff(fb, li, topk, r2t)       # the indexer finished each row
        for i in range(fb.batch_size):
            handoff.row_done(i)
        events.append(("attention", who, li))
        return backend.forward_decode(q, None, None, layer(li), fb, save_kv_cache=False, topk_indices=topk)


def _run(split: bool):
    g = torch.Generator().manual_seed(7)
    req_pool, alloc = shared_pools()
    runner = fake_runner(req_pool, alloc, LAYERS)
    place_requests(req_pool, ROWS, [p + STEPS for p in PROMPTS])
    r2t = req_pool.req_to_token
    for li in range(LAYERS):
        for r, p in zip(ROWS, PROMPTS):
            write_rows(runner, li, r2t[r, :p], g)
    primary = create_ess_backend(runner)
    adapter = primary.ess
    store = adapter.store
    events, rings = [], {}
    plan, land = store.plan, store.land

    def plan_rec(layer_id, *a, micro_batch=0, **kw):
        step = plan(layer_id, *a, micro_batch=micro_batch, **kw)
        events.append(("issue", micro_batch, layer_id))
        rings.setdefault(micro_batch, set()).update(step.ring_dst[step.ring_dst >= 0].tolist())
        return step

    def land_rec(step):
        if not step.landed:
            events.append(("await", step.micro_batch, step.layer))
        return land(step)

    store.plan, store.land = plan_rec, land_rec
    tbo = TboAttnBackend(primary, [create_ess_backend(runner), create_ess_backend(runner)]) if split else None
    qpos = [p - 4 + j for p in PROMPTS for j in range(4)]        # prefill: last 4 tokens, opens + warms
    fb = forward_batch("EXTEND", ROWS, PROMPTS, torch.cat([r2t[r, p - 4:p] for r, p in zip(ROWS, PROMPTS)]),
                       extend_lens=[4] * len(ROWS))
    for li in range(LAYERS):
        primary.forward_extend(query(g, len(qpos)), None, None, layer(li), fb, save_kv_cache=False,
                               topk_indices=causal_topk(g, qpos))
    events.clear()
    outs = []
    for step in range(STEPS):
        seq = [p + step + 1 for p in PROMPTS]
        loc = torch.stack([r2t[r, s - 1] for r, s in zip(ROWS, seq)])
        for li in range(LAYERS):
            write_rows(runner, li, loc, g)
        fb = forward_batch("DECODE", ROWS, seq, loc)
        q = [query(g, len(ROWS)) for _ in range(LAYERS)]
        topk = [causal_topk(g, [s - 1 for s in seq]) for _ in range(LAYERS)]
        if not split:
            primary.init_forward_metadata(fb)
            outs.append([_indexer_then_attention(primary, fb, li, q[li], topk[li], r2t, events, "whole")
                         for li in range(LAYERS)])
            continue
        a, b = slice(0, SPLIT), slice(SPLIT, len(ROWS))
        fb.tbo_children = [forward_batch("DECODE", ROWS[s], seq[s], loc[s], tbo_range=(s.start, s.stop))
                           for s in (a, b)]
        tbo.init_forward_metadata(fb)
        per_layer = []
        for li in range(LAYERS):
            parts = [_indexer_then_attention(child, cfb, li, q[li][s], topk[li][s], r2t, events, name)
                     for child, cfb, s, name in zip(tbo.children, fb.tbo_children, (a, b), ("a", "b"))]
            per_layer.append(torch.cat(parts))
        outs.append(per_layer)
    store.engine.drain()
    return outs, events, rings, store.hot.slot_to_token.clone(), tbo


@pytest.mark.parametrize("level", ["none", "da", "dba"])
def test_split_batch_equals_whole_batch(ess_env, server_args, level):
    # the worker engine: with the inline one (synchronous) every level runs as 'none'
    ess_env(hot_slots_per_request=24, prefetch_overlap_level=level, prefetch_engine="worker")
    whole, _, _, state_whole, _ = _run(split=False)
    split, events, rings, state_split, tbo = _run(split=True)
    assert [c.micro_batch_base for c in tbo.children] == [0, 2] and tbo.primary.micro_batch_base == 0
    for step, (w, s) in enumerate(zip(whole, split)):
        for li in range(LAYERS):
            assert torch.equal(w[li], s[li]), f"step {step} layer {li}: split != whole"
    assert torch.equal(state_whole, state_split)
    own = {"a": {0, 1}, "b": {2, 3}}                   # micro-batch ids (= ring groups per layer parity)
    used = {mb for kind, mb, _ in events if kind == "issue"}
    assert used <= own["a"] | own["b"] and used & own["a"] and used & own["b"]
    ring_a = set().union(*(rings.get(m, set()) for m in own["a"]))
    ring_b = set().union(*(rings.get(m, set()) for m in own["b"]))
    assert ring_a and ring_b and not ring_a & ring_b, "the micro-batches shared ring rows"
    # per layer and child: every fetch is issued before the child's attention starts (from the
    # indexer hand-off; at level none right at its start), and awaited after it started
    current = None
    for kind, who, li in events:
        if kind == "attention":
            current = (who, li)
            continue
        child = "a" if who in own["a"] else "b"
        if kind == "await":
            assert current == (child, li), f"await of micro-batch {who} layer {li} outside its attention"
        elif level != "none":
            assert current != (child, li), f"micro-batch {who} layer {li} issued inside its attention"
    print(f"\nTBO issue/await order, level {level}, first step:", events[:LAYERS * (6 if level == "dba" else 4)])
