"""8 requests x 4 layers, contexts 1K..16K, 200 decode steps of a synthetic locality trace:
attention through the store equals the all-resident reference at every step, and everything
is returned when requests finish or abort midway."""
import torch

from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.attention.reference import dense_topk_reference, sparse_mla_decode
from tests.unit.store.helpers import make_store

CONTEXTS = [1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
LAYERS, K, N, STEPS, REPEAT = 4, 32, 1100, 200, 0.8
LAY = LatentLayout("fp32", 32, 8)
SCALE = 0.15


def next_topk(g, prev, seq_len):
    """REPEAT of the previous set survives; the rest is fresh; the newest token is always in."""
    newest = seq_len - 1
    keep = prev[torch.randperm(prev.numel(), generator=g)[:int(REPEAT * K)]]
    keep = keep[keep != newest]
    chosen = set(keep.tolist()) | {newest}
    while len(chosen) < K:
        chosen.update(torch.randint(seq_len, (K - len(chosen),), generator=g).tolist())
    out = torch.tensor(sorted(chosen), dtype=torch.int64)
    return out[torch.randperm(K, generator=g)]


def test_store_end_to_end_matches_all_resident_reference():
    g = torch.Generator().manual_seed(0)
    store, table = make_store(layers=LAYERS, row_bytes=LAY.row_bytes, host_tokens=sum(CONTEXTS) + 8 * STEPS,
                              n=N, max_requests=8, k=K, max_context=17000)
    ids = [f"r{i}" for i in range(8)]
    full = {}  # all-resident reference copy of every request's latents, per layer
    prev = {}
    for rid, ctx in zip(ids, CONTEXTS):
        table.add(rid, ctx)
        full[rid] = [torch.randn(ctx + STEPS, LAY.dim, generator=g) for _ in range(LAYERS)]
        for layer in range(LAYERS):
            store.write_host(layer, table.host_locs(rid), LAY.encode(full[rid][layer][:ctx]))
    # LRU warmup from the "prefill's" last W=4 top-k sets
    rows, lens = table.indices(ids), table.seq_lens(ids)
    for layer in range(LAYERS):
        sets = [[torch.randperm(c, generator=g)[:K] for _ in range(4)] for c in CONTEXTS]
        warm = torch.stack([torch.stack(s) for s in sets])
        store.warmup(layer, rows, lens, warm, table.req_to_host)
        for rid, s in zip(ids, sets):
            prev[(rid, layer)] = s[-1]

    live = list(ids)
    for step in range(STEPS):
        if step == 100:  # two requests abort midway
            for rid in ("r2", "r6"):
                table.release(rid)
                live.remove(rid)
        pos = table.extend(live)
        rows, lens = table.indices(live), table.seq_lens(live)
        q = torch.randn(len(live), 4, LAY.dim, generator=g)
        for layer in range(LAYERS):
            new = torch.stack([full[rid][layer][int(pos[i])] for i, rid in enumerate(live)])
            store.append(layer, rows, pos, LAY.encode(new), table.req_to_host)
            topk = torch.stack([next_topk(g, prev[(rid, layer)], int(lens[i])) for i, rid in enumerate(live)])
            for i, rid in enumerate(live):
                prev[(rid, layer)] = topk[i]
            slots = store.resolve(layer, rows, lens, topk.to(torch.int32), table.req_to_host)
            out, lse = sparse_mla_decode(q, store.slot_rows, slots, LAY, SCALE)
            ref_out, ref_lse = dense_topk_reference(q, [full[r][layer] for r in live], topk, 32, SCALE)
            torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)
            s2t = store.hot.slot_to_token[layer, rows]
            for i in range(len(live)):  # no hot buffer exceeds N; no token held twice
                held = s2t[i][s2t[i] >= 0]
                assert held.numel() <= N and held.unique().numel() == held.numel()
    snap = store.counters.snapshot()
    assert sum(snap["layer_misses"]) > 0 and sum(snap["layer_hits"]) > sum(snap["layer_misses"])
    # steady state: with REPEAT=0.8 about 20% of k (minus the newest token) misses per step
    assert snap["hit_rate"] > 0.6
    for rid in live:
        table.release(rid)
    u = store.usage()
    assert u["host_tokens_used"] == 0 and u["hot_slots_used"] == 0 and u["hot_requests_open"] == 0
    assert int(store.host.rows.sum()) == 0 and int(store.slots.layer_rows(0).sum()) == 0 and int(store.slot_rows[:store.slots.ring_base].sum()) == 0  # cleared, not just freed
