"""Resolver scenarios shared by the torch-path tests and the Triton-interpreter run: each one is
a list of steps, and `run_scenario` checks every step of the chosen backend(s) against one
`LruOracle` per request (hits, misses, resident set, slot contents, recency order).

A scenario: (max_requests, N, steps) where a step is (reqs int64 [b], seq_lens int64 [b],
tokens int64 [b, k], num_real_reqs int64 [1] or None). Batch rows that are padding (req -1 or
row >= num_real_reqs) must come back as slots -1 / miss False / hit False and change nothing.
"""
from __future__ import annotations

import torch

from sgl_ess.core.lru_oracle import LruOracle
from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.resolver import assign


def _step(reqs, lens, tokens, num_real=None):
    return (torch.as_tensor(reqs, dtype=torch.int64), torch.as_tensor(lens, dtype=torch.int64),
            torch.as_tensor(tokens, dtype=torch.int64),
            None if num_real is None else torch.tensor([num_real], dtype=torch.int64))


def random_sets(seed=0, b=4, k=12, n=20, ctx=200, steps=30):
    g = torch.Generator().manual_seed(seed)
    reqs = torch.arange(2, 2 + b)   # not starting at 0: request offsets must be honoured
    return b + 3, n, [_step(reqs, [ctx] * b, torch.stack([torch.randperm(ctx, generator=g)[:k]
                                                          for _ in range(b)])) for _ in range(steps)]


def locality(seed=7, b=3, k=16, n=40, ctx=400, steps=40, new_per_step=3):
    g = torch.Generator().manual_seed(seed)
    cur = torch.stack([torch.randperm(ctx, generator=g)[:k] for _ in range(b)])
    out = []
    for _ in range(steps):
        cur = cur.clone()
        for i in range(b):
            for j in torch.randperm(k, generator=g)[:new_per_step].tolist():
                fresh = [c for c in torch.randperm(ctx, generator=g)[:k + 1].tolist()
                         if c not in cur[i].tolist()]
                cur[i, j] = fresh[0]
        out.append(_step(torch.arange(b), [ctx] * b, cur))
    return b, n, out


def duplicates_and_padding(seed=3, b=3, k=10, n=14, ctx=50, steps=25):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        t = torch.randint(ctx, (b, k), generator=g)             # duplicates likely
        t[torch.rand((b, k), generator=g) < 0.25] = -1           # padding anywhere
        out.append(_step(torch.tensor([1, 0, 2]), [ctx] * b, t))
    return b, n, out


def k_larger_than_context(steps=4):
    """A 5-token context with k = 8 (three -1 pads per step): the fast path, nothing evicted."""
    t = torch.tensor([[0, 1, 2, 3, 4, -1, -1, -1], [4, 3, -1, 2, -1, 1, 0, -1]])
    return 2, 9, [_step([0, 1], [5, 5], x) for x in (t, t.flip(1), t, t[:, :4])][:steps]


def fast_path(seed=0, n=32, ctx=30, k=8, steps=20):
    g = torch.Generator().manual_seed(seed)
    return 2, n, [_step([0, 1], [ctx, ctx], torch.stack([torch.randperm(ctx, generator=g)[:k]
                                                         for _ in range(2)])) for _ in range(steps)]


def fast_to_slow(seed=5, n=24, k=8, steps=40):
    """Contexts grow one token per step from below N to past it: the fast path hands over to
    eviction with the same state. Each step selects the newest token plus older ones."""
    g = torch.Generator().manual_seed(seed)
    out, lens = [], [n - 12, n - 4]
    for _ in range(steps):
        rows = []
        for L in lens:
            older = torch.randperm(L - 1, generator=g)[:k - 1] if L > 1 else torch.empty(0, dtype=torch.long)
            row = torch.cat([older, torch.tensor([L - 1])])
            rows.append(torch.cat([row, torch.full((k - row.numel(),), -1)]))
        out.append(_step([1, 0], lens, torch.stack(rows)))
        lens = [L + 1 for L in lens]
    return 2, n, out


def k_equals_n(seed=11, n=10, ctx=40, steps=15):
    """k = N distinct misses: every slot is taken in one step, none evicted twice."""
    g = torch.Generator().manual_seed(seed)
    return 2, n, [_step([0, 1], [ctx, ctx], torch.stack([torch.randperm(ctx, generator=g)[:n]
                                                         for _ in range(2)])) for _ in range(steps)]


def padded_rows(seed=2, n=16, k=6, ctx=60, steps=20):
    """Rows 0-1 are real (requests 3 and 0); row 2 is -1; rows 3-4 lie past num_real_reqs=2 and
    name real requests (0 and 3, as a CUDA-graph padded batch may) with garbage tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        t = torch.randint(ctx, (5, k), generator=g)
        out.append(_step([3, 0, -1, 0, 3], [ctx, ctx, ctx, 10, ctx], t, num_real=2))
    return 5, n, out


SCENARIOS = {
    "random_sets": random_sets, "locality": locality, "duplicates_and_padding": duplicates_and_padding,
    "k_larger_than_context": k_larger_than_context, "fast_path": fast_path,
    "fast_to_slow": fast_to_slow, "k_equals_n": k_equals_n, "padded_rows": padded_rows,
}


def _real_rows(reqs, num_real):
    b = reqs.numel()
    return [i for i in range(b) if int(reqs[i]) >= 0 and (num_real is None or i < int(num_real))]


def check_step(buf, oracles, reqs, lens, tokens, num_real, a, where):
    n = buf.slots_per_request
    real = _real_rows(reqs, num_real)
    for i in range(reqs.numel()):
        if i not in real:
            assert bool((a.slots[i] == -1).all()) and not bool(a.miss[i].any()) \
                and not bool(a.hit[i].any()), f"{where}: padded row {i} got slots or flags"
            continue
        r = int(reqs[i])
        want = oracles[r].access(tokens[i].tolist())
        assert sorted(tokens[i][a.hit[i]].tolist()) == sorted(want.hits), f"{where} row {i}: hits"
        assert sorted(tokens[i][a.miss[i]].tolist()) == sorted(want.misses), f"{where} row {i}: misses"
        valid = tokens[i] >= 0
        assert bool((a.slots[i][~valid] == -1).all()), f"{where} row {i}: padding got a slot"
        if int(lens[i]) <= n:
            assert torch.equal(a.slots[i][valid], tokens[i][valid]), f"{where} row {i}: fast path slot"
    for r, o in enumerate(oracles):   # every request, in the batch or not
        s2t = buf.slot_to_token[0, r].cpu()
        order = buf.lru_order[0, r].cpu().long()
        assert sorted(order.tolist()) == list(range(n)), f"{where} req {r}: order is not a permutation"
        assert set(s2t[s2t >= 0].tolist()) == o.resident(), f"{where} req {r}: resident set"
        recency = [int(s2t[s]) for s in order if s2t[s] >= 0]
        assert recency == list(o._order), f"{where} req {r}: LRU order"
    for i in real:                     # each valid entry's slot holds its token
        s2t = buf.slot_to_token[0, int(reqs[i])].cpu()
        valid = tokens[i] >= 0
        assert torch.equal(s2t[a.slots[i][valid]], tokens[i][valid]), f"{where} row {i}: slot contents"


# shorter runs for the Triton interpreter (~0.1-0.2 s per kernel call); each still crosses
# what its scenario is about (eviction, the fast -> slow hand-over at step 12, padding)
INTERP_STEPS = {"random_sets": 10, "locality": 14, "duplicates_and_padding": 10,
                "k_larger_than_context": 4, "fast_path": 6, "fast_to_slow": 20, "k_equals_n": 6,
                "padded_rows": 8}


def run_scenario(name, backends=("torch",), device="cpu", lockstep=False, steps=None):
    """Run scenario `name`. backends: one backend per buffer, or a cycle of backends on one
    buffer (lockstep=False: step s uses backends[s % len]). With lockstep=True, one buffer per
    backend runs every step and their state and outputs must be identical."""
    max_req, n, steps = SCENARIOS[name]() if steps is None else SCENARIOS[name](steps=steps)
    ctx = max(int(s[1].max()) for s in steps) + 1
    bufs = [DeviceHotBuffer(1, max_req, n, device, max_context_tokens=ctx)
            for _ in (backends if lockstep else backends[:1])]
    oracles = [LruOracle(n) for _ in range(max_req)]
    for s, (reqs, lens, tokens, num_real) in enumerate(steps):
        dev = lambda x: None if x is None else x.to(device)  # noqa: E731
        if lockstep:
            outs = [assign(bf, 0, dev(reqs), dev(lens), dev(tokens), backend=be, num_real_reqs=dev(num_real))
                    for bf, be in zip(bufs, backends)]
            for bf, a in zip(bufs[1:], outs[1:]):
                for f in ("slots", "miss", "hit"):
                    assert torch.equal(getattr(a, f), getattr(outs[0], f)), f"{name} step {s}: {f} differ"
                assert torch.equal(bf.slot_to_token, bufs[0].slot_to_token), f"{name} step {s}: slot_to_token differ"
                assert torch.equal(bf.lru_order, bufs[0].lru_order), f"{name} step {s}: lru_order differ"
            a = outs[0]
        else:
            a = assign(bufs[0], 0, dev(reqs), dev(lens), dev(tokens), backend=backends[s % len(backends)],
                       num_real_reqs=dev(num_real))
        for bf in bufs:
            assert int(bf.token_map.abs().sum()) == 0, f"{name} step {s}: token map not cleared"
        a_cpu = type(a)(a.slots.cpu(), a.miss.cpu(), a.hit.cpu())
        check_step(bufs[0], oracles, reqs, lens, tokens, num_real, a_cpu, f"{name} step {s}")
    return len(steps)
