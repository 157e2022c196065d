"""Issue 16, defect 5: with an engine that completes work late (here: only when waited on, newest
first), a background warmup still in flight must land before `reserve` hands one of its slots to
the newest token -- else the warmup's copy overwrites the newest row after the caller wrote it.

The engine double (tests/engine_doubles.py) is the store's stand-in for an asynchronous engine (the prefetch worker, a
device stream): it runs nothing at submit and runs pending plans in reverse order at wait/drain.
"""
import torch

from tests.engine_doubles import LateOutOfOrderEngine

from .helpers import make_store, token_rows


def test_reserve_waits_for_the_layers_warmup_before_evicting_into_it():
    n, k, ctx, rb = 16, 8, 100, 16
    store, table = make_store(n=n, k=k, row_bytes=rb, layers=1)
    store.engine = LateOutOfOrderEngine(store.memory)
    req = table.add("a", ctx)
    store.write_host(0, table.host_locs("a"), token_rows(table.host_locs("a"), rb))
    reqs = table.indices(["a"])
    gen = torch.Generator().manual_seed(3)
    warm = torch.stack([torch.randperm(ctx, generator=gen)[:k] for _ in range(4)]).unsqueeze(0)   # [1, W=4, k]
    assert store.warmup(0, reqs, table.seq_lens(["a"]), warm, table.req_to_host) > 0
    table.extend(["a"])                                   # the newest token, position ctx
    newest = torch.full((1, rb), 0xAB, dtype=torch.uint8)
    rows = store.reserve(0, reqs, torch.tensor([ctx]))
    store.slot_rows.index_copy_(0, rows, newest)
    topk = torch.cat([torch.tensor([ctx]), warm[0, -1, : k - 1]]).unsqueeze(0)
    step = store.plan(0, reqs, table.seq_lens(["a"]), topk, table.req_to_host)
    store.land(step)
    store.engine.drain()
    assert torch.equal(store.slot_rows[rows], newest), \
        "the warmup landed in the newest token's slot after its row was written"
    assert req == int(reqs[0])
