"""Issue 32, defect 3: a released host location may be written next by a writer the store never sees - a
PD decode node's KV arriving by Mooncake / NIXL (RDMA into the host pool), or SGLang writing rows itself -
so no fence of ours runs before that write. The zeroing of the released rows must therefore be complete
when the release returns (SGLang's allocator frees the locations after our release hook; only then can it
hand them to a new request). Here the external write is a plain store into the host rows right after the
release, then every stream and engine runs to the end: the new bytes must survive, on every engine - the
CUDA StreamEngine with late, out-of-order streams (the GPU fake), the late out-of-order engine double,
the prefetch worker process and inline."""
import pytest
import torch

from sgl_ess.prefetch.stream_engine import StreamEngine
from tests.engine_doubles import LateOutOfOrderEngine
from tests.stream_doubles import LateStreams
from tests.unit.store.helpers import make_store, token_rows

LAYERS, RB, CTX = 3, 16, 40


def _store(engine: str):
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
    return store, table, finish


@pytest.mark.parametrize("engine", ["stream_gpu_fake", "late", "worker", "inline"])
def test_a_transfer_into_a_released_location_is_not_zeroed_after_it_arrived(engine):
    store, table, finish = _store(engine)
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
