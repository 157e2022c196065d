"""Fewer hot buffers than request rows (issue 18: a PD decode node pre-allocates request rows for
transfers that have not landed; they must cost no device memory). A row takes a hot buffer when it
opens and gives it back when it closes; a buffer handed to another row carries nothing over."""
import pytest
import torch

from sgl_ess.store import LatentStore, StoreConfig
from sgl_ess.store.config import StoreConfigError
from tests.unit.store.helpers import make_store, token_rows

N, K = 24, 8


def test_rows_beyond_the_hot_buffers_cannot_open_until_one_closes():
    store, table = make_store(n=N, k=K, max_requests=10, hot_groups=3)
    for r in (9, 4, 7):
        store.open(r)
    assert store.open_requests == 3 and store.is_open(4) and not store.is_open(5)
    with pytest.raises(RuntimeError, match="all 3 hot buffers are held.*--max-running-requests"):
        store.open(5)
    assert not store.is_open(5)
    store.open(4)                                  # a reopen keeps its buffer
    store.close(4)
    store.open(5)
    assert store.groups_of(torch.tensor([9, 5, 7])).tolist() == [0, 1, 2]
    assert store.groups_of(torch.tensor([4])).tolist() == [-1]
    with pytest.raises(KeyError, match="request index 4 has no open hot buffer"):
        store.lru_tokens(4)
    store.shutdown()


def test_a_buffer_handed_to_another_row_starts_empty_and_serves_that_rows_bytes():
    store, table = make_store(n=N, k=K, max_requests=10, hot_groups=2, layers=1)
    table._free_indices = [3, 8, 6]                # rows 6, 8, 3 in that order
    a = table.add("a", 200)
    b = table.add("b", 200)
    store.write_host(0, table.host_locs("a"), token_rows(torch.arange(200), 16, salt=1))
    store.write_host(0, table.host_locs("b"), token_rows(torch.arange(200), 16, salt=2))
    topk = torch.arange(K, dtype=torch.int32)[None] * 7
    store.resolve(0, table.indices(["a"]), table.seq_lens(["a"]), topk, table.req_to_host)
    table.release("a")                             # a's buffer is free again
    table._free_indices = [6, 3]                   # the next request takes another row: 3
    c = table.add("c", 200)
    assert (a, b, c) == (6, 8, 3) and store.groups_of(torch.tensor([c])).tolist() == [0]
    store.write_host(0, table.host_locs("c"), token_rows(torch.arange(200), 16, salt=3))
    before = sum(store.counters.snapshot()["layer_misses"])
    rows = store.resolve(0, table.indices(["c"]), table.seq_lens(["c"]), topk, table.req_to_host)
    assert sum(store.counters.snapshot()["layer_misses"]) - before == K     # nothing of a's counts as a hit
    assert torch.equal(store.slot_rows[rows[0].long()], token_rows(topk[0].long(), 16, salt=3))
    table.release("b"), table.release("c")
    store.engine.drain()
    assert store.usage()["hot_slots_used"] == 0 and store.open_requests == 0
    store.shutdown()


def test_the_device_holds_only_the_hot_buffers():
    kw = dict(num_layers=3, row_bytes=40, host_capacity_tokens=64, hot_slots_per_request=20, max_requests=40,
              topk=8, max_context_tokens=300)
    per_row, grouped = StoreConfig(**kw), StoreConfig(**kw, hot_groups=6)
    assert grouped.device_bytes < per_row.device_bytes / 5
    store = LatentStore(grouped, transfer_backend="torch", engine="inline")
    assert store.slots.rows.shape[0] * 40 == grouped.device_allocation()["slot_rows"]
    assert store.hot.slot_to_token.shape == (3, 6, 20) and store.counters.hits.shape == (3, 6)
    store.shutdown()
    with pytest.raises(StoreConfigError, match="hot_groups=41.*--max-running-requests"):
        StoreConfig(**kw, hot_groups=41)
