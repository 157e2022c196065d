"""Speculative verify steps on the store, step by step against an oracle.

Each step, per request: the verify window (n draft tokens at positions c .. c+n-1, c = committed)
is written to the host pool with bytes unique to the step, so a rejected draft token's row and
the row that later takes its position differ. Every query token selects a top-k among positions
<= c + j (committed entries overlapping across draft tokens, window entries, padding). Then a
chosen accept pattern advances c. Checked at every step and layer against plain-Python oracles:

  * every entry reads exactly the bytes the host holds for that position now (committed rows as
    accepted, window rows of this step) - hot slot, ring row or host, whichever served it;
  * the hot buffer of every (layer, request) holds exactly the positions an `LruOracle` holds
    after the same sequence (admission of the accepted rows, then the union as one set), and each
    resident slot holds the bytes of its accepted row; nothing at or beyond `committed` is ever
    resident, so rejected rows never become visible;
  * hits/misses equal the oracle's; entries past the hot buffer's capacity are exactly the
    union's distinct values beyond the first N (the overflow, read from the host);
  * host rows of accepted tokens keep the bytes written when they were accepted.
"""
import pytest
import torch

from sgl_ess.core.lru_oracle import LruOracle
from sgl_ess.store.verify import (CommittedRows, check_window, compact_union, distinct_ranks, gather_rows,
                                  plan_union)
from sgl_ess.store.verify_slots import slot_table
from tests.unit.store.helpers import make_store, token_rows

ROW, LAYERS, K, NDRAFT, STEPS = 16, 2, 8, 4, 14
CONTEXTS = [90, 64, 130, 75]
# accept_len per step (1 = only the bonus token; NDRAFT = every draft token accepted)
ACCEPT = [[1] * STEPS,
          [NDRAFT] * STEPS,
          [2, 1, 4, 3, 1, 2, 4, 1, 1, 3, 2, 4, 1, 2],
          [3, 4, 1, 2, 2, 1, 3, 4, 2, 1, 4, 1, 3, 3]]


def _bytes(loc: int, step: int, layer: int) -> torch.Tensor:
    return token_rows(torch.tensor([loc]), ROW, salt=1 + 1000 * step + 7 * layer)[0]


def _topk(g, c: int, prev: list[int]) -> list[list[int]]:
    """n query tokens' top-k: a shared committed core (locality with the previous step), a few
    fresh committed positions each, window positions <= c + j, and -1 padding."""
    pool = list(range(c))
    core = [p for p in prev if p < c][:K - 3]
    while len(core) < K - 3:
        p = int(torch.randint(c, (1,), generator=g))
        if p not in core:
            core.append(p)
    rows = []
    for j in range(NDRAFT):
        row = list(core)
        for _ in range(2):
            p = pool[int(torch.randint(c, (1,), generator=g))]
            if p not in row:
                row.append(p)
        w = c + int(torch.randint(j + 1, (1,), generator=g))      # a window position <= c + j
        if w not in row:
            row.append(w)
        row = row[:K] + [-1] * (K - len(row))
        perm = torch.randperm(K, generator=g).tolist()
        rows.append([row[i] for i in perm])
    return rows


def _run(n_slots: int, seed: int = 0, engine: str = "inline", watcher=None, by_slot: bool = False):
    """`engine` "stream_gpu_fake": the CUDA side-stream engine, streams late and out of order, and
    the store's part of each step (admission, union plan, land, gather, commit) run unvalidated
    under `watcher` (tests/host_reads.py), as the CUDA backend runs it. `by_slot`: the store has MTP
    scratch rows and every step's slot table (store/verify_slots.py, what the CUDA kernels read) is
    checked to address exactly the bytes the gathered rows hold."""
    import contextlib

    g = torch.Generator().manual_seed(seed)
    b = len(CONTEXTS)
    fake = engine == "stream_gpu_fake"
    scratch = NDRAFT + max(0, NDRAFT * K - n_slots) if by_slot else 0
    store, table = make_store(layers=LAYERS, row_bytes=ROW, host_tokens=4096, n=n_slots, max_requests=8, k=K,
                              max_context=1024, engine="inline" if fake else engine,
                              verify_rows_per_request=scratch)
    if fake:
        from sgl_ess.prefetch.stream_engine import StreamEngine
        from tests.stream_doubles import LateStreams

        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=LateStreams(seed),
                                    zero_backend="torch")
    watching = watcher if watcher is not None else contextlib.nullcontext()
    ids = [f"r{i}" for i in range(b)]
    for rid, ctx in zip(ids, CONTEXTS):
        table.add(rid, ctx + (STEPS + 1) * NDRAFT)          # window slots allocated ahead, as SGLang does
    reqs = table.indices(ids)
    r2h = table.req_to_host
    committed = list(CONTEXTS)
    truth = {}                                              # (layer, i, pos) -> bytes of the final row
    for layer in range(LAYERS):
        for i, rid in enumerate(ids):
            locs = r2h[int(reqs[i]), :CONTEXTS[i]]
            rows = token_rows(locs, ROW, salt=7 * layer)
            store.host.rows[layer][locs] = rows
            for p in range(CONTEXTS[i]):
                truth[(layer, i, p)] = rows[p]
    rows_of = CommittedRows(LAYERS, 8, store.device)
    for layer in range(LAYERS):
        rows_of.reset(layer, reqs, torch.tensor(committed))
    oracle = {(layer, i): LruOracle(n_slots) for layer in range(LAYERS) for i in range(b)}
    hits = {key: 0 for key in oracle}
    misses = {key: 0 for key in oracle}
    admitted_from = list(committed)
    prev = [[] for _ in range(b)]
    overflow_seen = window_seen = 0
    for step in range(STEPS):
        c = torch.tensor(committed)
        topk_l = [_topk(g, committed[i], prev[i]) for i in range(b)]
        prev = [t[0] for t in topk_l]
        topk = torch.tensor(topk_l, dtype=torch.int64)                   # [b, n, k]
        for layer in range(LAYERS):
            window = {}
            for i in range(b):                                           # verify writes its window first
                for j in range(NDRAFT):
                    pos = committed[i] + j
                    loc = int(r2h[int(reqs[i]), pos])
                    window[(i, pos)] = _bytes(loc, step, layer)
                    store.host.rows[layer][loc] = window[(i, pos)]
            with watching:
                rows_of.admit(store, layer, reqs, c, r2h, NDRAFT)
                plan = plan_union(store, layer, reqs, c, topk, r2h, validate=not fake)
                store.land(plan.step)
                got, valid = gather_rows(store, plan, layer)
                if by_slot:
                    slots = slot_table(store, plan, layer, reqs, c, topk, r2h)
            if by_slot:         # the slot table reads every entry's bytes from the slot space, nothing else
                assert torch.equal(slots >= 0, valid) and slots.dtype == torch.int32
                assert torch.equal(store.slot_rows[slots.long().clamp(min=0)][valid], got[valid])
            for i in range(b):                                           # oracle: admission, oldest first
                oracle[(layer, i)].access(range(admitted_from[i], committed[i]))
            assert torch.equal(valid, (topk >= 0).reshape(b * NDRAFT, K))
            for i in range(b):
                union = []
                for j in range(NDRAFT):
                    for e in range(K):
                        pos = int(topk[i, j, e])
                        if pos < 0:
                            continue
                        want = window[(i, pos)] if pos >= committed[i] else truth[(layer, i, pos)]
                        assert torch.equal(got[i * NDRAFT + j, e], want), \
                            f"step {step} layer {layer} req {i} query {j}: position {pos} read wrong bytes"
                        if pos < committed[i] and pos not in union:
                            union.append(pos)
                fits, over = union[:n_slots], set(union[n_slots:])
                o = oracle[(layer, i)].access(fits)
                hits[(layer, i)] += len(o.hits)
                misses[(layer, i)] += len(o.misses)
                flags = plan.overflow[i * NDRAFT:(i + 1) * NDRAFT]
                marked = {int(topk[i, j, e]) for j in range(NDRAFT) for e in range(K) if flags[j, e]}
                assert marked == over, f"step {step} req {i}: overflow entries {marked} != oracle {over}"
                overflow_seen += len(over)
            window_seen += int(plan.window.sum())
            with watching:
                store.commit(plan.step)
        store.engine.drain()
        for layer in range(LAYERS):                                      # hot buffers vs the oracle
            slot_rows = store.layer_rows(layer)
            for i in range(b):
                r = int(reqs[i])
                s2t = store.hot.slot_to_token[layer, r].tolist()
                resident = {p for p in s2t if p >= 0}
                assert resident == oracle[(layer, i)].resident(), f"step {step} layer {layer} req {i}: LRU state"
                assert all(p < committed[i] for p in resident), "a row at or past `committed` became resident"
                for s, p in enumerate(s2t):
                    if p >= 0:
                        assert torch.equal(slot_rows[r * n_slots + s], truth[(layer, i, p)]), \
                            f"step {step} layer {layer} req {i}: slot {s} holds stale bytes for position {p}"
                assert int(store.counters.hits[layer, r]) == hits[(layer, i)]
                assert int(store.counters.misses[layer, r]) == misses[(layer, i)]
        admitted_from = list(committed)
        for i in range(b):                                               # the chosen accept pattern
            acc = ACCEPT[i][step]
            for layer in range(LAYERS):
                for pos in range(committed[i], committed[i] + acc):
                    truth[(layer, i, pos)] = _bytes(int(r2h[int(reqs[i]), pos]), step, layer)
            committed[i] += acc
        for layer in range(LAYERS):                                      # host rows of accepted tokens
            for i in range(b):
                locs = r2h[int(reqs[i]), :committed[i]]
                want = torch.stack([truth[(layer, i, p)] for p in range(committed[i])])
                assert torch.equal(store.host.rows[layer][locs], want)
    return overflow_seen, window_seen, rows_of.rows_admitted


def test_union_fits_hot_buffer():
    """N = 40 >= the union of 4 top-8 sets: nothing overflows; every step exact."""
    overflow, window, admitted = _run(n_slots=40)
    assert overflow == 0 and window > 0 and admitted > 0


def test_union_overflows_hot_buffer():
    """N = 12 < the union (up to 32 distinct): the overflow is read from the host; still exact."""
    overflow, window, admitted = _run(n_slots=12, seed=1)
    assert overflow > 0 and window > 0 and admitted > 0


@pytest.mark.parametrize("n_slots", [40, 12])
def test_gpu_fake_stream_engine_exact_and_no_host_read(n_slots, monkeypatch):
    """GPU fake (issue 16): the same steps on the CUDA side-stream engine, its streams late and out
    of order; the store's verify bookkeeping reads no device value on the host (it used to read the
    admitted-row count and the union's overflow, a sync per layer on CUDA)."""
    from tests.host_reads import watch

    watcher = watch(monkeypatch)
    overflow, window, admitted = _run(n_slots=n_slots, seed=3, engine="stream_gpu_fake", watcher=watcher)
    assert window > 0 and admitted > 0 and (overflow > 0) == (n_slots < NDRAFT * K)
    assert watcher.seen == [], f"host reads in the verify path: {sorted(set(watcher.seen))}"


@pytest.mark.parametrize("n_slots", [40, 12])
def test_slot_table_addresses_the_gathered_bytes(n_slots):
    """Issue 35 item 2: the CUDA kernels read an MTP forward's union by slot (hot slots, ring rows, and the
    window / overflow rows copied into the slot space's MTP scratch rows), not as gathered rows: at every
    step and layer each valid entry's slot holds exactly the bytes gather_rows reads, padding is -1."""
    overflow, window, _ = _run(n_slots=n_slots, seed=4, by_slot=True)
    assert window > 0 and (overflow > 0) == (n_slots < NDRAFT * K)


def test_slot_table_refuses_a_store_without_room():
    """A store sized for fewer draft tokens than the forward has: a clear error naming the fix."""
    store, table = make_store(layers=1, row_bytes=ROW, host_tokens=512, n=40, max_requests=4, k=K, max_context=256,
                              verify_rows_per_request=NDRAFT - 1)
    table.add("r", 100)
    reqs = table.indices(["r"])
    c = torch.tensor([90])
    topk = torch.full((1, NDRAFT, K), -1, dtype=torch.int64)
    topk[0, :, 0] = 5
    plan = plan_union(store, 0, reqs, c, topk, table.req_to_host)
    store.land(plan.step)
    with pytest.raises(RuntimeError, match="speculative-num-draft-tokens"):
        slot_table(store, plan, 0, reqs, c, topk, table.req_to_host)
    store.commit(plan.step)


def test_worker_engine():
    """The same steps through the prefetch worker process (fetches land asynchronously)."""
    _run(n_slots=12, seed=2, engine="worker")


def test_compact_union_first_occurrence_order():
    x = torch.tensor([[5, 3, 5, -1, 7, 3, 9], [-1, -1, 2, 2, 2, 1, 0]])
    rank, first = distinct_ranks(x)
    assert rank.tolist() == [[0, 1, 0, -1, 2, 1, 3], [-1, -1, 0, 0, 0, 1, 2]]
    assert first.tolist() == [[True, True, False, False, True, False, True],
                              [False, False, True, False, False, True, True]]
    row, col = compact_union(x, 3)
    assert row.tolist() == [[5, 3, 7], [2, 1, 0]]
    assert col.tolist() == [[0, 1, 0, -1, 2, 1, -1], [-1, -1, 0, 0, 0, 1, 2]]


def test_causal_bound_is_enforced():
    """A draft token selecting past its own position means predictions and cache indices drifted."""
    topk = torch.tensor([[[0, 1, 5], [0, 6, -1]]])      # committed 5: token 0 may see <= 5, token 1 <= 6
    check_window(topk, torch.tensor([5]), "t")
    with pytest.raises(IndexError, match="out of step"):
        check_window(torch.tensor([[[0, 6, -1], [0, 1, 2]]]), torch.tensor([5]), "t")
