"""The asynchronous data path on the store: every overlap level (none / da / dba) and ring size
gives the all-resident reference's attention at every step; staged rows are verified by their
ring tags; nothing leaks when requests finish."""
import pytest
import torch

from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.attention.overlap import decode_layer, plan_layer
from sgl_ess.attention.reference import dense_topk_reference, sparse_mla_decode
from tests.unit.store.helpers import make_store

LAY = LatentLayout("fp32", 32, 8)
SCALE = 0.15
LAYERS, K, N, STEPS = 3, 16, 40, 25
CONTEXTS = [300, 120, 500, 64, 260]


def _attend(q, rows, slots):
    return sparse_mla_decode(q, rows, slots, LAY, SCALE)


def _run(mode, ring_slots=0, engine="inline", corrupt_tags=False, seed=0, speculative="off", cross_layer=0.0,
         corrupt_spec=False, progress=3, host_lag=0, hot_groups=0, request_rows=8, wrap_engine=None):
    g = torch.Generator().manual_seed(seed)
    store, table = make_store(layers=LAYERS, row_bytes=LAY.row_bytes, host_tokens=sum(CONTEXTS) + 8 * STEPS,
                              n=N, max_requests=request_rows, k=K, max_context=1024, ring_slots=ring_slots,
                              spec_slots=64 if speculative != "off" else 0, hot_groups=hot_groups,
                              engine="inline" if engine == "stream_gpu_fake" else engine, speculative=speculative)
    if hot_groups:                      # request rows scattered over the pool, hot buffers by opening order
        perm = torch.randperm(request_rows, generator=g).tolist()
        table._free_indices = perm
    streams = None
    if engine == "stream_gpu_fake":     # the CUDA StreamEngine, its streams late and out of order, torch kernels
        from sgl_ess.prefetch.stream_engine import StreamEngine
        from tests.stream_doubles import LaggedStreams, LateStreams

        streams = LaggedStreams(seed, host_lag) if host_lag else LateStreams(seed)
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=streams, zero_backend="torch")
    if wrap_engine is not None:         # e.g. prefetch/split_fetch.SplitFetch (tests/unit/prefetch/test_split_fetch.py)
        store.engine = wrap_engine(store.engine)
    ids = [f"r{i}" for i in range(len(CONTEXTS))]
    full = {}
    for rid, ctx in zip(ids, CONTEXTS):
        table.add(rid, ctx)
        full[rid] = [torch.randn(ctx + STEPS, LAY.dim, generator=g) for _ in range(LAYERS)]
        for layer in range(LAYERS):
            store.write_host(layer, table.host_locs(rid), LAY.encode(full[rid][layer][:ctx]))
    events = []
    staged_total = 0
    spec_used_by_mb = [0, 0]      # misses read from speculative rows, per micro-batch (DBA half)
    spec_shared_rows = 0          # speculative rows pending for two micro-batches at once
    for step in range(STEPS):
        pos = table.extend(ids)
        reqs, lens = table.indices(ids), table.seq_lens(ids)
        q = torch.randn(len(ids), 4, LAY.dim, generator=g)
        for layer in range(LAYERS):
            new = torch.stack([full[rid][layer][int(pos[i])] for i, rid in enumerate(ids)])
            store.append(layer, reqs, pos, LAY.encode(new), table.req_to_host)
            topk = torch.stack([torch.cat([pos[i:i + 1], torch.randperm(int(lens[i]) - 1, generator=g)[:K - 1]])
                                for i in range(len(ids))])
            if layer > 0 and cross_layer:      # a share of the previous layer's selection repeats
                keep = torch.rand(topk.shape, generator=g) < cross_layer
                topk = torch.where(keep, prev_topk, topk)
                topk = torch.stack([_dedup(t, int(lens[i]), g) for i, t in enumerate(topk)])
            prev_topk = topk
            steps = plan_layer(store, mode, layer, reqs, lens, topk, table.req_to_host)
            staged_total += sum(int(s.staged.sum()) for s in steps)
            for s in steps:
                spec_used_by_mb[s.micro_batch] += 0 if s.spec_dst is None else int((s.spec_dst >= 0).sum())
            if store.spec is not None:
                held = [set(rows.tolist()) for _, rows, _ in store.spec.pending.values()]
                spec_shared_rows += sum(len(a & b) for i, a in enumerate(held) for b in held[i + 1:])
            if corrupt_spec:                      # the speculative staging never landed
                store.engine.drain()
                for _, rows, _ in store.spec.pending.values():
                    store.slots.ring_tags[rows - store.slots.ring_base] = -7
            if corrupt_tags and step == 3:
                for s in steps:          # a late completion of another plan overwrote the tags
                    s_ring = s.ring_dst[s.ring_dst >= 0]
                    store.engine.drain()
                    store.slots.ring_tags[s_ring - store.slots.ring_base] = s.seq + 1000
            if streams is not None:
                streams.progress(progress)     # some of the side streams' work finishes meanwhile
            out = decode_layer(store, mode, q, steps, _attend, on_event=lambda what, s: events.append(what))
            ref, _ = dense_topk_reference(q, [full[r][layer] for r in ids], topk, 32, SCALE)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    snap = store.counters.snapshot()
    snap["prefetch"] = store.usage()["prefetch"]
    snap["spec_used_by_mb"], snap["spec_shared_rows"] = spec_used_by_mb, spec_shared_rows
    for rid in ids:
        table.release(rid)
    store.engine.drain()
    u = store.usage()
    assert u["host_tokens_used"] == 0 and u["hot_slots_used"] == 0
    assert int(store.slot_rows[:store.slots.ring_base].sum()) == 0
    store.shutdown()
    return snap, events, staged_total


def _dedup(t, seq_len, g):
    """Replace repeated positions with fresh ones (a top-k set has distinct entries)."""
    seen, out = set(), []
    for v in t.tolist():
        while v in seen:
            v = int(torch.randint(seq_len, (1,), generator=g))
        seen.add(v)
        out.append(v)
    return torch.tensor(out)


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


@pytest.mark.parametrize("mode", ["none", "da", "dba"])
def test_speculative_next_layer_staging_is_used_and_stays_exact(mode):
    snap, _, _ = _run(mode, speculative="next_layer", cross_layer=0.7)
    spec = snap["prefetch"]["speculative"]
    assert spec["rows_staged"] > 0 and spec["rows_used"] > 0          # predictions were staged and used
    assert 0 < spec["precision"] <= 1
    assert snap["prefetch"]["tiers"]["speculative"]["plans"] > 0


def test_dba_each_half_uses_the_speculative_rows_staged_for_it():
    """DBA plans a layer as two micro-batches one after the other: half 1's staging for the next
    layer must not replace half 0's nor land in the same rows, and at the next layer each half
    claims its own, so DBA uses about as many staged rows as DA does for the same batch."""
    dba, _, _ = _run("dba", speculative="next_layer", cross_layer=0.7)
    da, _, _ = _run("da", speculative="next_layer", cross_layer=0.7)
    used = dba["spec_used_by_mb"]
    assert used[0] > 0 and used[1] > 0                       # both halves read staged rows
    assert sum(used) == dba["prefetch"]["speculative"]["rows_used"]
    assert dba["spec_shared_rows"] == 0                      # no speculative row staged for both halves
    assert dba["prefetch"]["speculative"]["precision"] >= 0.8 * da["prefetch"]["speculative"]["precision"]


def test_speculative_staging_that_never_lands_is_not_read():
    """Speculative rows whose tags do not match (dropped or late) are ignored: still exact."""
    snap, _, _ = _run("da", speculative="next_layer", cross_layer=0.7, corrupt_spec=True)
    assert snap["prefetch"]["speculative"]["rows_used"] == 0


@pytest.mark.parametrize("mode", ["none", "da", "dba"])
@pytest.mark.parametrize("ring_slots", [0, 3])
def test_gpu_fake_stream_engine_stays_exact(mode, ring_slots):
    """GPU fake: the CUDA StreamEngine itself (stream_engine.py), its streams swapped for ones that
    complete work late and out of order (tests/stream_doubles.py) and its kernels for torch. No ring
    tag is checked on a device stream: only the engine's stream ordering makes this exact."""
    snap, _, staged = _run(mode, ring_slots=ring_slots, engine="stream_gpu_fake", seed=2)
    assert staged > 0 and snap["prefetch"]["engine"] == "stream"
    assert sum(snap["refetch_rows"]) == 0


@pytest.mark.parametrize("mode", ["none", "da", "dba"])
@pytest.mark.parametrize("predictor", ["next_layer", "last_step", "score_ema"])
def test_gpu_fake_speculative_tier_stays_exact(mode, predictor):
    """GPU fake (issue 19, predictors on CUDA): the speculative tier on the side-stream engine,
    its streams late and out of order. Claimed rows are read after the plan's wait (a staging is
    queued before it on the same stream), no ring tag is read, and a host predictor learns from
    each plan's top-k through an asynchronous copy (store/host_feed.py). The side streams make no
    progress of their own: only the waits order their work."""
    snap, _, _ = _run(mode, engine="stream_gpu_fake", seed=2, speculative=predictor, cross_layer=0.7, progress=0)
    spec = snap["prefetch"]["speculative"]
    assert snap["prefetch"]["engine"] == "stream" and spec["predict_calls"] > 0
    assert sum(snap["refetch_rows"]) == 0
    if predictor == "next_layer":                 # the device top-k itself, no host copy
        assert spec["rows_used"] > 0 and "lagged_inputs" not in spec
    else:
        assert spec["lagged_inputs"]["predicted"] > 0
    if predictor == "score_ema":
        assert spec["rows_staged"] > 0


@pytest.mark.parametrize("mode", ["none", "dba"])
def test_prefetch_worker_process_engine_stays_exact(mode):
    """The same loop with a real prefetch worker process moving the rows (shared memory, ZMQ)."""
    snap, _, staged = _run(mode, engine="worker", speculative="next_layer", cross_layer=0.5)
    assert staged > 0
    assert snap["prefetch"]["engine"] == "worker"
    assert snap["prefetch"]["tiers"]["immediate"]["done"] > 0


@pytest.mark.parametrize("mode", ["none", "da", "dba"])
@pytest.mark.parametrize("engine", ["inline", "stream_gpu_fake"])
def test_fewer_hot_buffers_than_request_rows_stays_exact(mode, engine):
    """Issue 18: 5 hot buffers for 24 request rows (a PD decode node's pre-allocated rows need none),
    the rows scattered, so row r does not own buffer r: every level equals the all-resident
    reference, with next_layer staging too, and the device holds 5 buffers' slots."""
    snap, _, _ = _run(mode, engine=engine, hot_groups=len(CONTEXTS), request_rows=24, speculative="next_layer")
    assert sum(snap["layer_misses"]) > 0 and sum(snap["layer_hits"]) > 0
