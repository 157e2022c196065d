"""GPU fake: the CUDA StreamEngine (sgl_ess/prefetch/stream_engine.py) on CPU, its streams swapped
for ones that complete work late and out of order (tests/stream_doubles.py) and its kernels for the
torch references. Issue 16: zeroing released rows (every layer) used to share the one side stream
with the immediate fetches, so a fetch queued behind 61 layers of memset; it now runs on its own
low-priority stream, and what orders host writes after it is the zero plans' fence (issue 32: the host
waits for it only where a writer outside every stream may reuse the rows, a PD decode node:
tests/unit/store/test_release_external_write.py). The decode loop itself through this engine:
tests/unit/store/test_overlap_levels.py (gpu_fake)."""
import torch

from sgl_ess.prefetch.plan import CopyPlan
from sgl_ess.prefetch.stream_engine import StreamEngine
from tests.stream_doubles import LateStreams
from tests.unit.store.helpers import make_store, token_rows

LAYERS, RB, N, K, CTX = 2, 16, 12, 8, 60


def _store(seed=0):
    store, table = make_store(layers=LAYERS, row_bytes=RB, host_tokens=512, n=N, max_requests=4, k=K,
                              max_context=256)
    streams = LateStreams(seed)
    store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=streams, zero_backend="torch")
    return store, table, streams


def _rows(locs, layer):
    return token_rows(locs, RB, salt=layer) | 1           # every byte nonzero


def _fill(store, table, ids):
    for rid in ids:
        table.add(rid, CTX)
        for layer in range(LAYERS):
            store.write_host(layer, table.host_locs(rid), _rows(table.host_locs(rid), layer))


def test_gpu_fake_an_immediate_fetch_does_not_wait_for_zeroing():
    store, table, streams = _store()
    try:
        _fill(store, table, ["a", "b"])
        a_locs = table.host_locs("a").clone()
        store.close(table.index("a"))
        store.clear_host(a_locs)                           # 2 layers of zeroing, queued
        reqs, lens = table.indices(["b"]), table.seq_lens(["b"])
        topk = torch.randperm(CTX, generator=torch.Generator().manual_seed(1))[:K].reshape(1, K).to(torch.int32)
        step = store.plan(0, reqs, lens, topk, table.req_to_host)
        store.land(step)                                   # the compute stream waits for this fetch only
        assert streams.pending(store.engine.zero_stream) == LAYERS + 1, "the zeroing ran before the fetch could"
        assert int(store.host.rows[:, a_locs].count_nonzero()) > 0
        got = store.slot_rows[step.read_slots.reshape(-1).long()]
        assert torch.equal(got, _rows(table.req_to_host[reqs[0], topk[0].long()], 0))
        store.fence_host()                                 # before anything writes host rows again
        assert streams.pending(store.engine.zero_stream) == 0
        assert int(store.host.rows[:, a_locs].count_nonzero()) == 0
    finally:
        store.shutdown()


def test_gpu_fake_a_reused_location_is_written_after_its_zeroing():
    """SGLang's allocator hands a released location to the next request at once: the store's host
    write fences first, so the late zeroing can never wipe the new request's row."""
    store, table, streams = _store(seed=3)
    try:
        _fill(store, table, ["a"])
        a_locs = table.host_locs("a").clone()
        store.close(table.index("a"))
        store.clear_host(a_locs)                           # SGLang's release: a zero plan, no host sync
        assert streams.pending(store.engine.zero_stream) == LAYERS + 1
        for layer in range(LAYERS):                        # the next request's prefill, same locations
            store.write_host(layer, a_locs, _rows(a_locs, layer + 7))
        streams.finish()                                   # whatever was still queued runs now
        for layer in range(LAYERS):
            assert torch.equal(store.host.rows[layer, a_locs], _rows(a_locs, layer + 7))
    finally:
        store.shutdown()


def test_gpu_fake_drain_orders_both_streams_and_a_release_leaves_nothing():
    store, table, streams = _store(seed=5)
    try:
        _fill(store, table, ["a", "b"])
        g = torch.Generator().manual_seed(2)
        rows, lens = table.indices(["a", "b"]), table.seq_lens(["a", "b"])
        for _ in range(3):
            for layer in range(LAYERS):
                topk = torch.stack([torch.randperm(CTX, generator=g)[:K] for _ in range(2)]).to(torch.int32)
                store.resolve(layer, rows, lens, topk, table.req_to_host)
                streams.progress(2)
        ia, ib = table.index("a"), table.index("b")
        a_locs, b_locs = table.host_locs("a").clone(), table.host_locs("b").clone()
        store.close(ia)
        store.clear_host(a_locs)
        store.engine.drain()                               # no fence: drain alone must order the zeroing
        slots = store.slots
        hot = slots.rows[:slots.ring_base].view(LAYERS, store.cfg.max_requests, N, RB)
        assert int(store.host.rows[:, a_locs].count_nonzero()) == 0
        assert int(hot[:, ia].count_nonzero()) == 0 and int(hot[:, ib].count_nonzero()) > 0
        assert int(slots.rows[slots.ring_base:].count_nonzero()) == 0
        for layer in range(LAYERS):
            assert torch.equal(store.host.rows[layer, b_locs], _rows(b_locs, layer))
        s = store.engine.stats()["tiers"]
        assert s["background"]["rows"] >= a_locs.numel() and s["immediate"]["rows"] > 0
    finally:
        store.shutdown()


def test_gpu_fake_a_layers_write_waits_for_that_layers_zeroing_only():
    """Issue 16: one zero plan covered every layer, so the first layer's host write after a release
    waited for the whole memset (61 layers). The zero plan now records an event after each layer's
    memset and a write to layer l fences layer l only; every layer's new rows still survive."""
    store, table, streams = _store(seed=7)
    try:
        _fill(store, table, ["a"])
        a_locs = table.host_locs("a").clone()
        store.close(table.index("a"))
        store.clear_host(a_locs)
        zs = store.engine.zero_stream
        assert streams.pending(zs) == LAYERS + 1               # the index copy, then one memset per layer
        store.write_host(0, a_locs, _rows(a_locs, 9))          # the next request's layer-0 rows
        assert streams.pending(zs) == LAYERS - 1, "a layer-0 write waited for other layers' zeroing"
        assert int(store.host.rows[1, a_locs].count_nonzero()) > 0     # layer 1's memset still queued
        store.write_host(1, a_locs, _rows(a_locs, 10))
        assert streams.pending(zs) == 0 and not store._host_fence
        streams.finish()
        assert torch.equal(store.host.rows[0, a_locs], _rows(a_locs, 9))
        assert torch.equal(store.host.rows[1, a_locs], _rows(a_locs, 10))
    finally:
        store.shutdown()


def test_gpu_fake_a_release_zeroes_after_a_write_back_queued_before_it():
    """The zero plan runs after every copy submitted before it: a write-back of the released rows still
    queued on the copy stream (slot rows -> host rows) cannot land after the zeroing."""
    store, table, streams = _store(seed=7)
    try:
        _fill(store, table, ["a"])
        a_locs = table.host_locs("a").clone()
        store.slots.rows[:a_locs.numel()] = _rows(a_locs, 9)
        for layer in range(LAYERS):                            # queued on the copy stream, not run yet
            store.engine.submit(CopyPlan("s2h", torch.arange(a_locs.numel()), a_locs, layer=layer))
        assert streams.pending(store.engine.stream) == LAYERS
        store.close(table.index("a"))
        store.clear_host(a_locs)
        streams.finish()
        assert int(store.host.rows[:, a_locs].count_nonzero()) == 0
    finally:
        store.shutdown()
