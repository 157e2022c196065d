"""Zeroing on release holds on every CPU fetch engine (issue 19): inline, the prefetch worker process,
and the late out-of-order double (tests/engine_doubles.py: the stand-in for a device stream; the
StreamEngine itself: as a GPU fake in tests/unit/prefetch/test_stream_engine_gpu_fake.py, and on
CUDA in tests/gpu/test_store_stream_cuda.py). After a request is
released the way SGLang's pool releases it (close the hot buffer, a zero plan for its host rows,
fence), every byte it owned reads zero: host rows in every layer, its hot slots, the staging rings
and the speculative rows; the other request's rows are untouched."""
import pytest
import torch

from tests.engine_doubles import LateOutOfOrderEngine
from tests.unit.store.helpers import make_store, token_rows

LAYERS, RB, N, K, CTX, STEPS = 2, 16, 12, 8, 60, 6


def _nonzero_rows(locs, layer):
    return token_rows(locs, RB, salt=layer) | 1          # every byte nonzero: a leftover can't read as zero


def _store(engine):
    store, table = make_store(layers=LAYERS, row_bytes=RB, host_tokens=512, n=N, max_requests=4, k=K,
                              max_context=256, engine="inline" if engine == "late" else engine,
                              speculative="next_layer", spec_slots=16)
    if engine == "late":
        store.engine = LateOutOfOrderEngine(store.memory)
    return store, table


@pytest.mark.parametrize("engine", ["inline", "worker", "late"])
def test_released_rows_read_zero(engine):
    store, table = _store(engine)
    try:
        ids = ["a", "b"]
        for rid in ids:
            table.add(rid, CTX)
            for layer in range(LAYERS):
                store.write_host(layer, table.host_locs(rid), _nonzero_rows(table.host_locs(rid), layer))
        g = torch.Generator().manual_seed(1)
        rows, lens = table.indices(ids), table.seq_lens(ids)
        for _ in range(STEPS):                            # misses land in ring rows, then move to hot slots
            for layer in range(LAYERS):
                topk = torch.stack([torch.randperm(CTX, generator=g)[:K] for _ in ids]).to(torch.int32)
                store.resolve(layer, rows, lens, topk, table.req_to_host)
        topk = torch.stack([torch.randperm(CTX, generator=g)[:K] for _ in ids]).to(torch.int32)
        store.resolve(0, rows, lens, topk, table.req_to_host)   # stages layer 1's predicted rows
        store.engine.drain()
        ia, ib = table.index("a"), table.index("b")
        a_locs, b_locs = table.host_locs("a").clone(), table.host_locs("b").clone()
        slots = store.slots
        hot = slots.rows[:slots.ring_base].view(LAYERS, store.cfg.max_requests, N, RB)
        assert int(hot[:, ia].count_nonzero()) > 0 and int(hot[:, ib].count_nonzero()) > 0
        assert int(slots.rows[slots.spec_base:slots.spec_base + 2 * slots.spec_slots].count_nonzero()) > 0

        store.close(ia)                                   # what SGLang's release does (pool_adapter)
        store.clear_host(a_locs)
        store.fence_host()
        store.engine.drain()

        assert int(store.host.rows[:, a_locs].count_nonzero()) == 0, "released host rows still hold data"
        assert int(hot[:, ia].count_nonzero()) == 0, "released hot slots still hold data"
        assert int(slots.rows[slots.ring_base:].count_nonzero()) == 0, "staging / speculative rows hold data"
        for layer in range(LAYERS):                        # the other request keeps its rows
            assert torch.equal(store.host.rows[layer, b_locs], _nonzero_rows(b_locs, layer))
        assert int(hot[:, ib].count_nonzero()) > 0

        table.release("a")
        table.release("b")                                # the table's own release path zeroes too
        store.engine.drain()
        assert int(store.host.rows.count_nonzero()) == 0 and int(slots.rows.count_nonzero()) == 0
    finally:
        store.shutdown()
