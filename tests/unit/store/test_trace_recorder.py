"""--ess-trace-file: the recorder writes what the store saw, in order, and replaying the recording
gives the store's own miss counts; replay misses equal the plain-Python LRU oracle's."""
import numpy as np
import pytest
import torch

from sgl_ess.prefetch.synthetic_trace import SyntheticTraceConfig, generate
from sgl_ess.prefetch.trace_format import read_trace
from sgl_ess.prefetch.trace_stats import lru_misses
from sgl_ess.store import LatentStore, RequestTable, StoreConfig
from sgl_ess.store.trace_recorder import TraceRecorder
from sgl_ess.store.trace_replay import replay
from tests.unit.store.helpers import locality_trace, token_rows

LAYERS, K, N, RB = 2, 8, 20, 16


def _store(path, **kw):
    cfg = StoreConfig(num_layers=LAYERS, row_bytes=RB, host_capacity_tokens=4000, hot_slots_per_request=N,
                      max_requests=4, topk=K, max_context_tokens=1024)
    return LatentStore(cfg, transfer_backend="torch", trace_file=str(path), **kw)


def test_recorder_writes_what_the_store_saw(tmp_path):
    path = tmp_path / "trace.jsonl"
    store = _store(path, trace_meta={"model": "unit-test"})
    table = RequestTable(store)
    g = torch.Generator().manual_seed(1)
    ids = ["a", "b"]
    for rid, ctx in zip(ids, (200, 120)):
        table.add(rid, ctx)
    reqs, lens = table.indices(ids), table.seq_lens(ids)
    expect = [("open", 0), ("open", 1)]
    for layer in range(LAYERS):
        w = torch.stack([torch.randperm(int(n), generator=g)[:2 * K].view(2, K) for n in lens])
        store.warmup(layer, reqs, lens, w, table.req_to_host)
        expect.append(("warmup", layer, w))
    traces = [locality_trace(g, int(n), K, 4, 0.5) for n in lens]
    for _ in range(4):
        pos = table.extend(ids)
        rows = [next(t) for t in traces]
        lens = table.seq_lens(ids)
        for layer in range(LAYERS):
            store.append(layer, reqs, pos, token_rows(pos, RB), table.req_to_host)
            expect.append(("touch", layer, pos.view(-1, 1)))
            topk = torch.stack([r[1] for r in rows])        # positions below each request's prompt
            store.resolve(layer, reqs, lens, topk, table.req_to_host)
            expect.append(("plan", layer, topk))
    snap = store.counters.snapshot()
    table.release("a")
    expect.append(("close", 0))
    store.shutdown()

    trace = read_trace(str(path))
    h = trace.header
    assert (h["source"], h["num_layers"], h["topk"], h["hot_slots_per_request"], h["model"]) == ("store", 2, K, N,
                                                                                                 "unit-test")
    assert len(trace.events) == len(expect)
    for ev, want in zip(trace.events, expect):
        assert ev["ev"] == want[0]
        if want[0] in ("open", "close"):
            assert ev["req"] == want[1]
            continue
        assert ev["layer"] == want[1] and ev["reqs"].tolist() == [0, 1]
        data = ev["ids"] if want[0] == "warmup" else ev["pos"] if want[0] == "touch" else ev["topk"]
        np.testing.assert_array_equal(data, want[2].numpy())
    res = replay(trace)                                     # the recording reproduces the store's LRU
    assert res.misses_per_layer.tolist() == snap["layer_misses"]


def test_existing_files_are_refused_and_second_stores_get_their_own(tmp_path):
    path = tmp_path / "t-{pid}.jsonl"
    a = _store(path)
    b = _store(path)                                       # e.g. the EAGLE draft runner's store
    real = str(path).replace("{pid}", str(__import__("os").getpid()))
    assert a.trace.path == real and b.trace.path == real + ".store1"
    a.shutdown()
    b.shutdown()
    cfg = a.cfg
    with pytest.raises(FileExistsError, match="--ess-trace-file.*exists"):
        TraceRecorder(real, cfg)


def test_replayed_misses_equal_the_lru_oracle():
    trace = generate(SyntheticTraceConfig(num_layers=4, topk=16, context_tokens=256, steps=25, requests=2,
                                          hot_slots_per_request=40))
    res = replay(trace)
    np.testing.assert_allclose(res.misses_per_layer / res.rows_per_layer, lru_misses(trace))
    assert res.misses > 0
