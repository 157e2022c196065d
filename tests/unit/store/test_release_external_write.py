"""Issue 32, defect 3: on a PD decode node a released host location may be written next by a writer the
store never sees - the new request's KV arriving by Mooncake / NIXL (RDMA into the host pool) - so no
fence of ours runs before that write. There (`external_host_writer`, set by the adapter for
--disaggregation-mode decode) the zeroing of the released rows is complete when the release returns
(SGLang's allocator frees the locations after our release hook; only then can it hand them to a new
request). Here the external write is a plain store into the host rows right after the release, then
every stream and engine runs to the end: the new bytes must survive, on every engine - the CUDA
StreamEngine with late, out-of-order streams (the GPU fake), the late out-of-order engine double, the
prefetch worker process and inline.

Colocated (no external writer) a release must not make the host wait (it runs on every request finish
and radix eviction, on the scheduler thread): the zeroing stays queued, and a forward's write of a
released location is ordered after it on the device (`fence_host`, layer by layer)."""
import pytest
import torch

from sgl_ess.prefetch.stream_engine import StreamEngine
from tests.engine_doubles import LateOutOfOrderEngine
from tests.stream_doubles import LateStreams
from tests.unit.store.helpers import make_store, token_rows

LAYERS, RB, CTX = 3, 16, 40


def _store(engine: str, external: bool = True):
    store, table = make_store(layers=LAYERS, row_bytes=RB, host_tokens=256, n=12, max_requests=4, k=8,
                              max_context=128, engine="worker" if engine == "worker" else "inline")
    finish = store.engine.drain
    if engine == "stream_gpu_fake":
        streams = LateStreams(seed=4)
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=streams, zero_backend="torch")
        finish = streams.finish
    elif engine == "late":
        store.engine = LateOutOfOrderEngine(store.memory)
        finish = store.engine.drain
    store.external_host_writer = external
    if engine == "stream_gpu_fake":
        return store, table, finish, streams
    return store, table, finish


@pytest.mark.parametrize("engine", ["stream_gpu_fake", "late", "worker", "inline"])
def test_a_transfer_into_a_released_location_is_not_zeroed_after_it_arrived(engine):
    store, table, finish, *_ = _store(engine)
    try:
        table.add("a", CTX)
        locs = table.host_locs("a").clone()
        for layer in range(LAYERS):
            store.write_host(layer, locs, token_rows(locs, RB, salt=layer) | 1)
        store.close(table.index("a"))
        store.clear_host(locs)                             # SGLang's release hook, before its allocator frees
        arrived = [token_rows(locs, RB, salt=layer + 50) | 1 for layer in range(LAYERS)]
        for layer in range(LAYERS):                        # the next owner's KV, written from outside the store
            store.host.rows[layer, locs] = arrived[layer]
        finish()                                           # whatever any stream or worker still had runs now
        for layer in range(LAYERS):
            got = store.host.rows[layer, locs]
            assert torch.equal(got, arrived[layer]), \
                f"layer {layer}: {int((got == 0).all(dim=1).sum())} of {locs.numel()} transferred rows were zeroed"
    finally:
        store.shutdown()


def test_a_colocated_release_does_not_wait_on_the_host_and_a_forwards_write_lands_after_the_zeroing():
    """No external writer: clear_host queues the zeroing (no host sync), and the next forward's write of
    the released locations (write_host fences its layer) is ordered after that layer's memset on the
    device: after every stream ran, the written layer holds the new rows, the others read zeros."""
    store, table, finish, streams = _store("stream_gpu_fake", external=False)
    try:
        table.add("a", CTX)
        locs = table.host_locs("a").clone()
        for layer in range(LAYERS):
            store.write_host(layer, locs, token_rows(locs, RB, salt=layer) | 1)
        store.close(table.index("a"))
        syncs = streams.host_syncs
        store.clear_host(locs)
        assert streams.host_syncs == syncs, "a colocated release made the host wait for the zeroing"
        zs = store.engine.zero_stream
        assert streams.pending(zs) > 0, "the zeroing should still be queued (it ran on the host's wait)"
        new = token_rows(locs, RB, salt=77) | 1
        store.write_host(1, locs, new)                     # the next request's forward, layer 1 only
        assert streams.host_syncs == syncs
        finish()
        assert torch.equal(store.host.rows[1, locs], new), "the zeroing landed after the forward's write"
        for layer in (0, 2):
            assert int(store.host.rows[layer, locs].count_nonzero()) == 0, f"layer {layer} was not zeroed"
    finally:
        store.shutdown()


def test_an_external_writer_release_waits_on_the_host():
    """The PD decode case through the stream double: clear_host synchronizes (and nothing is left queued)."""
    store, table, finish, streams = _store("stream_gpu_fake", external=True)
    try:
        table.add("a", CTX)
        locs = table.host_locs("a").clone()
        store.write_host(0, locs, token_rows(locs, RB, salt=1) | 1)
        store.close(table.index("a"))
        syncs = streams.host_syncs
        store.clear_host(locs)
        assert streams.host_syncs == syncs + 1
        assert int(store.host.rows[:, locs].count_nonzero()) == 0
    finally:
        store.shutdown()
