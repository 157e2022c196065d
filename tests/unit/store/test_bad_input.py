"""Bad input gets an error naming the problem and the setting that fixes it, and the store keeps
working correctly afterwards."""
import pytest
import torch

from sgl_ess.store import HostPoolFullError, StoreConfig, StoreConfigError, hot_slots_for
from tests.unit.store.helpers import make_store, token_rows


def _filled(store, table, rid, n):
    table.add(rid, n)
    locs = table.host_locs(rid)
    for layer in range(store.cfg.num_layers):
        store.write_host(layer, locs, token_rows(locs, store.cfg.row_bytes, layer))


def _check_resolves_correctly(store, table, rid):
    topk = torch.tensor([[0, 3, 5, 7]], dtype=torch.int32)
    slots = store.resolve(1, table.indices([rid]), table.seq_lens([rid]), topk, table.req_to_host)
    got = store.slot_rows[slots[0].long()]
    want = token_rows(table.host_locs(rid)[topk[0].long()], store.cfg.row_bytes, 1)
    assert torch.equal(got, want)


def test_bad_topk_inputs_then_store_still_correct():
    store, table = make_store(k=4, n=8)
    _filled(store, table, "a", 20)
    rows, lens, r2h = table.indices(["a"]), table.seq_lens(["a"]), table.req_to_host
    with pytest.raises(IndexError, match=r"selects position 20 but its context has 20 tokens.*out of sync"):
        store.resolve(0, rows, lens, torch.tensor([[1, 2, 20, 3]], dtype=torch.int32), r2h)
    with pytest.raises(IndexError, match="position -2 is negative; only -1"):
        store.resolve(0, rows, lens, torch.tensor([[1, -2, 3, 4]], dtype=torch.int32), r2h)
    with pytest.raises(TypeError, match="int32 or int64 tensor.*float32"):
        store.resolve(0, rows, lens, torch.tensor([[1.0, 2, 3, 4]]), r2h)
    with pytest.raises(ValueError, match=r"expected shape \[batch=1, k\], got \[4\]"):
        store.resolve(0, rows, lens, torch.tensor([1, 2, 3, 4], dtype=torch.int32), r2h)
    with pytest.raises(IndexError, match="layer 5 out of range: the store has 2 layers"):
        store.resolve(5, rows, lens, torch.tensor([[1, 2, 3, 4]], dtype=torch.int32), r2h)
    _check_resolves_correctly(store, table, "a")


def test_unknown_request_ids_and_indices():
    store, table = make_store(k=4, n=8)
    _filled(store, table, "a", 20)
    with pytest.raises(KeyError, match="request id 'zz' does not exist"):
        table.indices(["zz"])
    with pytest.raises(KeyError, match="request index 3 has no open hot buffer"):
        store.resolve(0, torch.tensor([3]), torch.tensor([20]), torch.tensor([[1, 2, 3, 4]]), table.req_to_host)
    with pytest.raises(KeyError, match=r"request index 99 out of range \[0, 8\).*--max-running-requests"):
        store.open(99)
    with pytest.raises(KeyError, match="already exists"):
        table.add("a", 5)
    table.release("a")
    with pytest.raises(KeyError, match="does not exist"):
        table.release("a")
    _filled(store, table, "b", 12)
    _check_resolves_correctly(store, table, "b")


def test_allocation_beyond_host_capacity_then_store_still_correct():
    store, table = make_store(k=4, n=8, host_tokens=50)
    _filled(store, table, "a", 30)
    with pytest.raises(HostPoolFullError, match="asked for 25 token rows, 20 free of 50.*--ess-memory-pool-size-gb"):
        table.add("b", 25)
    assert "b" not in table and store.usage()["host_tokens_used"] == 30
    _filled(store, table, "c", 20)  # exactly the rest
    with pytest.raises(HostPoolFullError):
        table.extend(["a"])
    _check_resolves_correctly(store, table, "c")
    table.release("a")
    table.extend(["c"])
    assert table.seq_len("c") == 21


def test_bad_rows_for_writes():
    store, table = make_store(k=4, n=8)
    _filled(store, table, "a", 10)
    with pytest.raises(ValueError, match=r"expected uint8 rows \[2, 16\]"):
        store.write_host(0, torch.tensor([0, 1]), torch.zeros((2, 8), dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"expected uint8 rows \[1, 16\]"):
        store.append(0, table.indices(["a"]), torch.tensor([9]), torch.zeros((1, 16)), table.req_to_host)


def test_config_errors_name_the_flag():
    with pytest.raises(StoreConfigError, match="hot_slots_per_request=10 is smaller than topk\\+1=17.*--ess-hot-slots-per-request"):
        StoreConfig(num_layers=1, row_bytes=8, host_capacity_tokens=10, hot_slots_per_request=10,
                     max_requests=1, topk=16)
    with pytest.raises(StoreConfigError, match="host_capacity_tokens=0.*--ess-memory-pool-size-gb"):
        StoreConfig(num_layers=1, row_bytes=8, host_capacity_tokens=0, hot_slots_per_request=20,
                     max_requests=1, topk=16)
    with pytest.raises(StoreConfigError, match="ratio=1.5: expected 0 < r <= 1 .the sparse memory ratio"):
        hot_slots_for(2048, context_tokens=32768, ratio=1.5)


def test_hot_slots_sizing():
    assert hot_slots_for(2048) == 6400                                    # the paper's floor
    assert hot_slots_for(2048, context_tokens=131072, ratio=0.2) == 26215
    assert hot_slots_for(2048, context_tokens=32768, ratio=0.1) == 6400   # floor wins
    assert hot_slots_for(16, context_tokens=100, ratio=0.5, min_slots=0) == 50
    assert hot_slots_for(16, slots=5) == 17                               # never below k+1
