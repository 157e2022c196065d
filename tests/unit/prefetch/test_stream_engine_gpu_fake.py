"""GPU fake: the CUDA StreamEngine (sgl_ess/prefetch/stream_engine.py) on CPU, its streams swapped
for ones that complete work late and out of order (tests/stream_doubles.py) and its kernels for the
torch references. Issue 16: zeroing released rows (every layer) used to share the one side stream
with the immediate fetches, so a fetch queued behind 61 layers of memset; it now runs on its own
low-priority stream; since issue 32 the release waits for it on the host (a write from outside the
store - a PD transfer - could not be fenced: tests/unit/store/test_release_external_write.py). The
decode loop itself through this engine: tests/unit/store/test_overlap_levels.py (gpu_fake)."""
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


def test_gpu_fake_a_release_is_zeroed_when_it_returns_and_fetches_still_land():
    """Issue 32: the zeroing of released rows is done when clear_host returns (the host waits for the
    zero stream: SGLang's allocator may hand the locations to a writer outside every stream); the
    other request's fetches land their rows as before."""
    store, table, streams = _store()
    try:
        _fill(store, table, ["a", "b"])
        a_locs = table.host_locs("a").clone()
        store.close(table.index("a"))
        store.clear_host(a_locs)
        assert streams.pending(store.engine.zero_stream) == 0
        assert int(store.host.rows[:, a_locs].count_nonzero()) == 0
        reqs, lens = table.indices(["b"]), table.seq_lens(["b"])
        topk = torch.randperm(CTX, generator=torch.Generator().manual_seed(1))[:K].reshape(1, K).to(torch.int32)
        step = store.plan(0, reqs, lens, topk, table.req_to_host)
        store.land(step)
        got = store.slot_rows[step.read_slots.reshape(-1).long()]
        assert torch.equal(got, _rows(table.req_to_host[reqs[0], topk[0].long()], 0))
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
        store.clear_host(a_locs)                           # SGLang's release: the zeroing done on return
        assert streams.pending(store.engine.zero_stream) == 0
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
