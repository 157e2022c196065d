"""Shared-index layers (GLM-5.2 indexer_types "shared", issue 34 item 3) at store level: a group of
layers that see their anchor's top-k keeps one LRU slot table, resolved once per step at the anchor
(`reserve_group` / `plan_group`), and reads exactly the bytes the per-layer design (one LRU per
layer, every layer planned on its own with the same top-k) reads, step for step and layer by layer.
"""
import pytest
import torch

from sgl_ess.store import StoreConfig
from sgl_ess.store.config import StoreConfigError
from tests.unit.store.helpers import make_store, token_rows

# 7 layers, 3 groups: 0-2, 3-5 (anchors 0, 3), 6 alone
ANCHORS = (0, 0, 0, 3, 3, 3, 6)
LAYERS, K, N, ROW = len(ANCHORS), 8, 24, 16
CONTEXTS = [40, 90, 17]          # one request fits in N (the slot = position fast path)
STEPS = 40


def _host_rows(store, table, rid, layer):
    locs = table.host_locs(rid)
    store.write_host(layer, locs, token_rows(locs, ROW, salt=layer))


def _run(grouped: bool, engine: str = "inline"):
    """Warm up, then STEPS decode steps; returns the bytes every layer read per step, the per-layer
    hits/misses and the resolver calls per step."""
    kw = {"layer_anchors": ANCHORS} if grouped else {}
    store, table = make_store(layers=LAYERS, row_bytes=ROW, n=N, k=K, max_requests=4, max_context=512,
                              host_tokens=1024, engine=engine, warmup_window=4, ring_slots=K, **kw)
    g = torch.Generator().manual_seed(7)
    ids = ["a", "b", "c"]
    for rid, ctx in zip(ids, CONTEXTS):
        table.add(rid, ctx)
        for layer in range(LAYERS):
            _host_rows(store, table, rid, layer)
    rows, lens = table.indices(ids), table.seq_lens(ids)
    warm = {}
    for layer in range(LAYERS):
        if ANCHORS[layer] == layer:       # a shared layer reuses its anchor's top-k sets
            warm[layer] = torch.stack([torch.stack([torch.randperm(c, generator=g)[:K] for _ in range(4)])
                                       for c in CONTEXTS])
        store.warmup(layer, rows, lens, warm[ANCHORS[layer]], table.req_to_host)
    reads, calls = [], []
    for _ in range(STEPS):
        pos = table.extend(ids)
        rows, lens = table.indices(ids), table.seq_lens(ids)
        for layer in range(LAYERS):
            locs = table.req_to_host[rows, pos]
            store.write_host(layer, locs, token_rows(locs, ROW, salt=layer))
        before = store.resolver_calls
        step_reads = []
        plans = {}
        for layer in range(LAYERS):
            anchor = ANCHORS[layer]
            new = token_rows(table.req_to_host[rows, pos], ROW, salt=layer)
            if layer == anchor:
                topk = torch.stack([torch.cat([p.view(1), torch.randperm(int(s) - 1, generator=g)[:K - 1]])
                                    for p, s in zip(pos, lens)])
                plans["topk"] = topk
                if grouped:
                    group = store.cfg.group_layers(anchor)
                    for lay, r in zip(group, store.reserve_group(anchor, rows, pos)):
                        store.write_slots(r, token_rows(table.req_to_host[rows, pos], ROW, salt=lay))
                    for lay, st in zip(group, store.plan_group(anchor, rows, lens, topk, table.req_to_host)):
                        plans[lay] = st
            if not grouped:
                store.write_slots(store.reserve(layer, rows, pos), new)
                plans[layer] = store.plan(layer, rows, lens, plans["topk"], table.req_to_host)
            st = plans[layer]
            store.land(st)
            slots = st.read_slots.long()
            got = torch.where((slots >= 0).unsqueeze(-1), store.slot_rows[slots.clamp(min=0)], 0)
            step_reads.append(got.clone())
            # the bytes are the right token's: each entry reads row (token, layer)
            want = token_rows(table.req_to_host[rows.unsqueeze(1), plans["topk"]], ROW, salt=layer)
            assert torch.equal(got, want.view_as(got)), f"layer {layer} read wrong rows"
            store.commit(st)
        store.engine.drain()
        calls.append(store.resolver_calls - before)
        reads.append(step_reads)
    snap = store.counters.snapshot()
    out = dict(reads=reads, hits=snap["layer_hits"], misses=snap["layer_misses"], calls=calls,
               rows_h2d=snap["rows_h2d"], lru=[store.lru_tokens(int(r)) for r in rows], store=store)
    return out


def test_group_equals_per_layer_design_and_resolves_once_per_anchor():
    per_layer, grouped = _run(False), _run(True)
    for s in range(STEPS):
        for layer in range(LAYERS):
            assert torch.equal(per_layer["reads"][s][layer], grouped["reads"][s][layer]), (s, layer)
    assert per_layer["hits"] == grouped["hits"] and per_layer["misses"] == grouped["misses"]
    assert per_layer["rows_h2d"] == grouped["rows_h2d"]
    assert sum(grouped["misses"]) > 0 and sum(grouped["hits"]) > 0, "the trace must both hit and miss"
    anchors = len(set(ANCHORS))
    assert grouped["calls"] == [anchors] * STEPS
    assert per_layer["calls"] == [LAYERS] * STEPS
    # the exported LRU state (PD) is per layer and the same in both designs
    for a, b in zip(per_layer["lru"], grouped["lru"]):
        assert torch.equal(a, b)
    # one slot table per group: the LRU state allocated for anchors only
    cfg = grouped["store"].cfg
    assert grouped["store"].hot.slot_to_token.shape[0] == anchors == cfg.slot_tables
    assert cfg.device_allocation()["lru_state"] * LAYERS == per_layer["store"].cfg.device_allocation()["lru_state"] * anchors


def test_group_with_worker_engine_equals_inline():
    """A prefetch worker process (a real second process, as on a >= 4-core CPU): same bytes read."""
    a, b = _run(True, "inline"), _run(True, "worker")
    try:
        for s in range(STEPS):
            for layer in range(LAYERS):
                assert torch.equal(a["reads"][s][layer], b["reads"][s][layer]), (s, layer)
    finally:
        a["store"].shutdown()
        b["store"].shutdown()


def test_per_layer_calls_refused_on_a_shared_table():
    store, table = make_store(layers=LAYERS, row_bytes=ROW, n=N, k=K, max_requests=4, max_context=512,
                              host_tokens=1024, layer_anchors=ANCHORS)
    table.add("a", 40)
    rows, pos = table.indices(["a"]), torch.tensor([39])
    topk = torch.arange(K).view(1, K)
    with pytest.raises(NotImplementedError, match="plan_group"):
        store.plan(1, rows, torch.tensor([40]), topk, table.req_to_host)
    with pytest.raises(NotImplementedError, match="reserve_group"):
        store.reserve(0, rows, pos)
    with pytest.raises(ValueError, match="shared-index layer"):
        store.plan_group(4, rows, torch.tensor([40]), topk, table.req_to_host)
    # a group of one keeps the per-layer calls
    store.reserve(6, rows, pos)


@pytest.mark.parametrize("bad", [(0, 0), (1, 1, 2, 3, 4, 5, 6), (0, 0, 0, 3, 0, 3, 6), (0, 1, 0, 3, 3, 3, 6)])
def test_bad_layer_anchors_refused(bad):
    with pytest.raises(StoreConfigError, match="layer_anchors"):
        StoreConfig(num_layers=LAYERS, row_bytes=ROW, host_capacity_tokens=64, hot_slots_per_request=N,
                    max_requests=2, topk=K, layer_anchors=bad)
