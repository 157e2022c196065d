"""LRU warmup leaves the state an exact LRU ends in after the prefill's last W top-k sets, read
as one access stream (the oracle fed one token per step), and it removes the cold-start burst of
misses on the first decode step."""
import torch

from sgl_ess.core.lru_oracle import LruOracle
from tests.unit.store.helpers import locality_trace, make_store, token_rows


def _setup(n=48, k=16, ctx=500, reqs=3):
    store, table = make_store(n=n, k=k, layers=1)
    ids = [f"r{i}" for i in range(reqs)]
    for rid in ids:
        table.add(rid, ctx)
        locs = table.host_locs(rid)
        store.write_host(0, locs, token_rows(locs, 16))
    return store, table, ids


def test_warm_state_equals_oracle_replay_and_rows_are_fetched():
    store, table, ids = _setup()
    g = torch.Generator().manual_seed(0)
    traces = [[t for _, t in locality_trace(g, 500, 16, 8, 0.6, grow=False)] for _ in ids]
    warm = torch.stack([torch.stack(t) for t in traces])              # [b, W=8, k]
    fetched = store.warmup(0, table.indices(ids), table.seq_lens(ids), warm, table.req_to_host)
    total = 0
    for i, rid in enumerate(ids):
        o = LruOracle(48)
        for t in traces[i]:
            for tok in t.tolist():
                o.access([tok])
        row = table.index(rid)
        s2t = store.hot.slot_to_token[0, row]
        assert set(s2t[s2t >= 0].tolist()) == o.resident()
        st = store.hot.stamps[0, row]
        assert [int(s2t[j]) for j in torch.argsort(st) if st[j] >= 0] == list(o._order)
        # the resident slots hold the right bytes
        slots = torch.nonzero(s2t >= 0).reshape(-1)
        got = store.layer_rows(0)[slots + row * 48]
        want = token_rows(table.host_locs(rid)[s2t[slots]], 16)
        assert torch.equal(got, want)
        total += len(o)
    assert fetched == total


def test_warmup_cuts_first_step_misses():
    misses = {}
    for warm_on in (False, True):
        store, table, ids = _setup(reqs=2)
        gg = torch.Generator().manual_seed(5)
        traces = [[t for _, t in locality_trace(gg, 500, 16, 9, 0.8, grow=False)] for _ in ids]
        if warm_on:
            warm = torch.stack([torch.stack(t[:8]) for t in traces])
            store.warmup(0, table.indices(ids), table.seq_lens(ids), warm, table.req_to_host)
        first = torch.stack([t[8] for t in traces]).to(torch.int32)
        store.resolve(0, table.indices(ids), table.seq_lens(ids), first, table.req_to_host)
        misses[warm_on] = sum(store.counters.snapshot()["layer_misses"])
    assert misses[False] == 2 * 16                 # cold: every entry misses
    assert misses[True] <= 2 * 16 * 0.3            # warm: only what the trace changed


def test_fast_path_request_loads_whole_context_and_never_misses():
    store, table, ids = _setup(n=64, ctx=60, reqs=2)
    store.warmup(0, table.indices(ids), table.seq_lens(ids), torch.full((2, 1, 16), -1), table.req_to_host)
    g = torch.Generator().manual_seed(2)
    for _ in range(5):
        topk = torch.stack([torch.randperm(60, generator=g)[:16] for _ in ids]).to(torch.int32)
        slots = store.resolve(0, table.indices(ids), table.seq_lens(ids), topk, table.req_to_host)
        assert torch.equal(slots.long(), topk.long() + table.indices(ids).unsqueeze(1) * 64)
    assert sum(store.counters.snapshot()["layer_misses"]) == 0


def test_decode_after_warmup_follows_the_oracle_for_fast_slow_and_short_rows():
    """Three rows: context 40 < N (fast: whole context resident, untouched slots oldest, so the
    oracle first touches 0..39), context 500 with W*k > N (the cut falls inside the window),
    and context 500 with one set of duplicates and padding (W*k < N). Decode then grows every
    row past N; each step's misses and the resident sets match the oracle's, and the scratch
    map is all zero after warmup (the Triton resolver relies on it)."""
    n, k = 48, 16
    store, table = make_store(n=n, k=k, layers=1)
    ctxs = {"fast": 40, "slow": 500, "short": 500}
    for rid, c in ctxs.items():
        table.add(rid, c)
    g = torch.Generator().manual_seed(3)
    streams = {"fast": torch.randint(40, (6, k), generator=g),
               "slow": torch.randint(500, (6, k), generator=g),
               "short": torch.full((6, k), -1)}
    streams["short"][5, :10] = torch.tensor([7, 9, 7, 300, 9, 11, 499, 0, 7, 12])
    ids = list(ctxs)
    store.warmup(0, table.indices(ids), table.seq_lens(ids), torch.stack([streams[r] for r in ids]),
                 table.req_to_host)
    assert int(store.hot.token_map.abs().sum()) == 0
    oracles = {r: LruOracle(n) for r in ids}
    for tok in range(40):
        oracles["fast"].access([tok])
    for r in ids:
        for tok in streams[r].reshape(-1).tolist():
            if tok >= 0:
                oracles[r].access([tok])
    for r in ids:
        s2t = store.hot.slot_to_token[0, table.index(r)]
        assert set(s2t[s2t >= 0].tolist()) == oracles[r].resident()
    for step in range(30):
        table.extend(ids)
        lens = table.seq_lens(ids)
        topk = torch.stack([torch.cat([torch.tensor([int(lens[i]) - 1]),
                                       torch.randint(int(lens[i]) - 1, (k - 1,), generator=g)])
                            for i in range(len(ids))])
        before = sum(store.counters.snapshot()["layer_misses"])
        store.resolve(0, table.indices(ids), lens, topk.to(torch.int32), table.req_to_host)
        got = sum(store.counters.snapshot()["layer_misses"]) - before
        want = sum(len(oracles[r].access(topk[i].tolist()).misses) for i, r in enumerate(ids))
        assert got == want, f"step {step}"
        for r in ids:
            s2t = store.hot.slot_to_token[0, table.index(r)]
            assert set(s2t[s2t >= 0].tolist()) == oracles[r].resident(), f"step {step} {r}"
