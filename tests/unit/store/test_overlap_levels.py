"""The asynchronous data path on the store: every overlap level (none / da / dba) and ring size
gives the all-resident reference's attention at every step; staged rows are verified by their
ring tags; nothing leaks when requests finish."""
import pytest
import torch

from sgl_ess.attention.latent_layout import LatentLayout
from sgl_ess.attention.overlap import decode_layer, plan_layer
from sgl_ess.attention.reference import dense_topk_reference, sparse_mla_decode
from tests.unit.store.helpers import make_store

LAY = LatentLayout("fp32", 32, 8)
SCALE = 0.15
LAYERS, K, N, STEPS = 3, 16, 40, 25
CONTEXTS = [300, 120, 500, 64, 260]


def _attend(q, rows, slots):
    return sparse_mla_decode(q, rows, slots, LAY, SCALE)


def _run(mode, ring_slots=0, engine="inline", corrupt_tags=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    store, table = make_store(layers=LAYERS, row_bytes=LAY.row_bytes, host_tokens=sum(CONTEXTS) + 8 * STEPS,
                              n=N, max_requests=8, k=K, max_context=1024, ring_slots=ring_slots)
    if engine != "inline":
        store.engine.close()
        store.engine = store._make_engine(engine)
    ids = [f"r{i}" for i in range(len(CONTEXTS))]
    full = {}
    for rid, ctx in zip(ids, CONTEXTS):
        table.add(rid, ctx)
        full[rid] = [torch.randn(ctx + STEPS, LAY.dim, generator=g) for _ in range(LAYERS)]
        for layer in range(LAYERS):
            store.write_host(layer, table.host_locs(rid), LAY.encode(full[rid][layer][:ctx]))
    events = []
    staged_total = 0
    for step in range(STEPS):
        pos = table.extend(ids)
        reqs, lens = table.indices(ids), table.seq_lens(ids)
        q = torch.randn(len(ids), 4, LAY.dim, generator=g)
        for layer in range(LAYERS):
            new = torch.stack([full[rid][layer][int(pos[i])] for i, rid in enumerate(ids)])
            store.append(layer, reqs, pos, LAY.encode(new), table.req_to_host)
            topk = torch.stack([torch.cat([pos[i:i + 1], torch.randperm(int(lens[i]) - 1, generator=g)[:K - 1]])
                                for i in range(len(ids))])
            steps = plan_layer(store, mode, layer, reqs, lens, topk, table.req_to_host)
            staged_total += sum(int(s.staged.sum()) for s in steps)
            if corrupt_tags and step == 3:
                for s in steps:          # a late completion of another plan overwrote the tags
                    s_ring = s.ring_dst[s.ring_dst >= 0]
                    store.engine.drain()
                    store.slots.ring_tags[s_ring - store.slots.ring_base] = s.seq + 1000
            out = decode_layer(store, mode, q, steps, _attend, on_event=lambda what, s: events.append(what))
            ref, _ = dense_topk_reference(q, [full[r][layer] for r in ids], topk, 32, SCALE)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    snap = store.counters.snapshot()
    for rid in ids:
        table.release(rid)
    store.engine.drain()
    u = store.usage()
    assert u["host_tokens_used"] == 0 and u["hot_slots_used"] == 0
    assert int(store.slot_rows[:store.slots.ring_base].sum()) == 0
    store.shutdown()
    return snap, events, staged_total


@pytest.mark.parametrize("mode", ["none", "da", "dba"])
def test_every_level_matches_all_resident_reference(mode):
    snap, events, staged = _run(mode)
    assert sum(snap["layer_misses"]) > 0 and staged > 0
    if mode == "none":
        assert "attn0" not in events
    else:  # Attn0 runs before the wait, Attn1 after it
        i = events.index("attn0")
        assert events[i + 1] == "wait" and events[i + 2] == "attn1"


def test_dba_plans_both_halves_before_attending():
    _, events, _ = _run("dba")
    # per layer: attn0(h0) wait attn1 commit attn0(h1) wait attn1 commit
    assert events[:8] == ["attn0", "wait", "attn1", "commit", "attn0", "wait", "attn1", "commit"]


def test_tiny_ring_overflows_into_hot_slots_and_stays_exact():
    snap, _, _ = _run("da", ring_slots=3)
    assert sum(snap["layer_misses"]) > 3


def test_stale_ring_tags_are_refetched_not_read():
    snap, _, _ = _run("none", corrupt_tags=True)
    assert sum(snap["refetch_rows"]) > 0
