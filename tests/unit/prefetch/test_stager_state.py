"""The stager inside a real store: predictor state lives per request and goes with close / reopen,
and each request of a plan gets at most its share of the speculative rows."""
import torch

from sgl_ess.store import LatentStore, RequestTable, StoreConfig
from tests.unit.store.helpers import locality_trace

K, N, SPEC = 8, 20, 6


def test_predictor_state_is_per_request_and_dropped_on_close_and_reopen():
    cfg = StoreConfig(num_layers=2, row_bytes=8, host_capacity_tokens=2000, hot_slots_per_request=N, max_requests=4,
                      topk=K, max_context_tokens=512, spec_slots=SPEC)
    store = LatentStore(cfg, transfer_backend="torch", speculative="score_ema")
    table = RequestTable(store)
    g = torch.Generator().manual_seed(0)
    ids = ["a", "b"]
    for rid in ids:
        table.add(rid, 300)
    traces = [locality_trace(g, 300, K, 12, 0.3, grow=False) for _ in ids]
    reqs, lens = table.indices(ids), table.seq_lens(ids)
    per_request = []
    for _ in range(12):
        topk = torch.stack([next(t)[1] for t in traces])
        for layer in range(2):
            store.resolve(layer, reqs, lens, topk, table.req_to_host)
            for keys, _, _ in store.spec.pending.values():
                per_request.append(torch.bincount(keys[keys >= 0] // cfg.max_context_tokens, minlength=2).max().item())
    pred = store.spec.predictor
    assert set(pred.tables) == {0, 1} and set(pred.tables[0]) == {0, 1}
    assert store.spec.rows_staged > 0 and max(per_request) <= SPEC // 2
    table.release("a")                                   # request index 0 closes
    assert 0 not in pred.tables and 1 in pred.tables and not store.spec.pending
    store.resolve(0, reqs[1:], lens[1:], topk[1:], table.req_to_host)
    store.open(1)                                        # an index reused without a close: state goes too
    assert 1 not in pred.tables
    s = store.usage()["prefetch"]["speculative"]
    assert s["predictor"] == "score_ema" and s["predict_calls"] > 0 and s["gate"]["mode"] in ("live", "lru_fallback")
    store.shutdown()
