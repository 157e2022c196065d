"""The resolver (`assign`, torch path) against the plain OrderedDict LRU oracle, with the hot
buffer built as the store builds it today (no max_context_tokens: the token map grows on
demand). Recency is read through `DeviceHotBuffer.stamps` (derived from the order list).
More scenarios, padded rows and the Triton kernel: tests/unit/kernels/."""
import pytest
import torch

from sgl_ess.core.lru_oracle import LruOracle
from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.resolver import assign


def run_both(traces, n, seq_lens):
    """traces: list over steps of int64 [b, k]. Checks every step against per-row oracles."""
    b = traces[0].shape[0]
    buf = DeviceHotBuffer(num_layers=1, max_requests=b + 2, slots_per_request=n, device="cpu")
    rows = torch.arange(2, 2 + b)  # not starting at 0: row offsets must be honoured
    oracles = [LruOracle(n) for _ in range(b)]
    for step, topk in enumerate(traces):
        a = assign(buf, 0, rows, seq_lens, topk)
        for i in range(b):
            want = oracles[i].access(topk[i].tolist())
            got_hits = topk[i][a.hit[i]].tolist()
            got_miss = topk[i][a.miss[i]].tolist()
            assert sorted(got_hits) == sorted(want.hits), f"step {step} row {i} hits"
            assert sorted(got_miss) == sorted(want.misses), f"step {step} row {i} misses"
            s2t = buf.slot_to_token[0, rows[i]]
            resident = set(s2t[s2t >= 0].tolist())
            assert resident == oracles[i].resident(), f"step {step} row {i} resident set"
            assert len(resident) <= n
            # every valid entry's slot holds its token; padding maps to -1
            valid = topk[i] >= 0
            assert torch.equal(s2t[a.slots[i][valid]], topk[i][valid])
            assert bool((a.slots[i][~valid] == -1).all())
            # recency order of the store equals the oracle's
            st = buf.stamps[0, rows[i]]
            order = [int(s2t[j]) for j in torch.argsort(st) if st[j] >= 0]
            assert order == list(oracles[i]._order), f"step {step} row {i} LRU order"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_traces_match_oracle(seed):
    g = torch.Generator().manual_seed(seed)
    b, k, n, ctx = 4, 12, 20, 200
    traces = [torch.stack([torch.randperm(ctx, generator=g)[:k] for _ in range(b)]) for _ in range(30)]
    run_both(traces, n, torch.full((b,), ctx))


def test_locality_heavy_traces_match_oracle():
    g = torch.Generator().manual_seed(7)
    b, k, n, ctx = 3, 16, 40, 400
    prev = torch.stack([torch.randperm(ctx, generator=g)[:k] for _ in range(b)])
    traces = []
    for _ in range(60):
        cur = prev.clone()
        for i in range(b):  # replace ~20% with fresh positions not already in the row
            for j in torch.randperm(k, generator=g)[:3].tolist():
                while True:
                    c = int(torch.randint(ctx, (1,), generator=g))
                    if c not in cur[i].tolist():
                        cur[i, j] = c
                        break
        traces.append(cur)
        prev = cur
    run_both(traces, n, torch.full((b,), ctx))


def test_duplicates_and_padding_match_oracle():
    g = torch.Generator().manual_seed(3)
    b, k, n, ctx = 3, 10, 14, 50
    traces = []
    for _ in range(25):
        t = torch.randint(ctx, (b, k), generator=g)          # duplicates likely
        t[torch.rand((b, k), generator=g) < 0.25] = -1          # padding anywhere
        traces.append(t)
    run_both(traces, n, torch.full((b,), ctx))


def test_k_larger_than_context():
    # a 5-token context with k=8: three -1 pads every step, nothing ever evicted
    b, k, n = 2, 8, 9
    t = torch.tensor([[0, 1, 2, 3, 4, -1, -1, -1], [4, 3, -1, 2, -1, 1, 0, -1]])
    run_both([t, t.flip(1), t], n, torch.tensor([5, 5]))


def test_fast_path_uses_identity_slots_and_never_evicts():
    buf = DeviceHotBuffer(1, 2, 32, "cpu")
    rows = torch.tensor([0, 1])
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        topk = torch.stack([torch.randperm(30, generator=g)[:8] for _ in range(2)])
        a = assign(buf, 0, rows, torch.tensor([30, 30]), topk)
        assert torch.equal(a.slots, topk)  # slot = token position when the context fits in N
    assert int((buf.slot_to_token[0] >= 0).sum()) <= 60
