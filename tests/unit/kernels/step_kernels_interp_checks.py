"""Child process (TRITON_INTERPRET=1): the store's fused step kernels against their torch
references - the plan epilogue (sgl_ess/kernels/plan_epilogue_triton.py vs
sgl_ess/store/step_plan.plan_epilogue_torch: read rows, staged, hot / ring / fetch indices, host
sources and the counters, entry for entry; the scratch left zero) and the commit move
(flashtrans.move_rows: copy then zero the sources, with its row count). Run by
test_step_kernels_triton.py."""
import torch

from sgl_ess.kernels.flashtrans import copy_rows, move_rows
from sgl_ess.kernels.plan_epilogue_triton import plan_epilogue_triton
from sgl_ess.obs.counters import StoreCounters
from sgl_ess.store.step_plan import plan_epilogue_torch
from tests.unit.kernels.interp_runner import report

N, K, R, C = 24, 10, 6, 64


def resolver_like(g, b: int, pad_rows: int = 0, n_slots: int = N, k: int = K, ctx: int = C):
    """What the resolver hands the epilogue: per row distinct tokens and distinct LRU slots, each
    entry a hit or a miss, -1 padding (slot -1, neither) at the end of some rows and whole rows."""
    slots = torch.full((b, k), -1, dtype=torch.int64)
    tokens = torch.full((b, k), -1, dtype=torch.int64)
    miss = torch.zeros((b, k), dtype=torch.bool)
    for i in range(b - pad_rows):
        n = int(torch.randint(k // 2, k + 1, (1,), generator=g))
        slots[i, :n] = torch.randperm(n_slots, generator=g)[:n]
        tokens[i, :n] = torch.randperm(ctx, generator=g)[:n]
        miss[i, :n] = torch.rand(n, generator=g) < 0.6
    hit = (slots >= 0) & ~miss
    return slots, miss, hit, tokens


def epilogue_case(seed: int, b: int, ring_cap: int, pad_rows: int = 0, device: str = "cpu", n_slots: int = N,
                  k: int = K, rows: int = R, ctx: int = C):
    """Also run at the paper's shapes on a GPU (tests/gpu/test_step_kernels_cuda.py)."""
    g = torch.Generator().manual_seed(seed)
    N, R = n_slots, rows                                       # noqa: N806 - the shapes of this case
    slots, miss, hit, tokens = (t.to(device) for t in resolver_like(g, b, pad_rows, N, k, ctx))
    reqs = torch.randperm(R, generator=g)[:b].to(device)
    groups = torch.randperm(R, generator=g)[:b].to(device)    # hot buffers are not request rows
    if pad_rows:                                               # padded batch rows: -1, as the store passes them
        reqs[b - pad_rows:], groups[b - pad_rows:] = -1, -1
    r2h = torch.randperm(R * ctx, generator=g).view(R, ctx).to(device)
    kw = dict(hot_base=3 * R * N, n_slots=N, ring_first=7 * R * N, ring_cap=ring_cap)
    ref_c, tri_c = StoreCounters(4, R, 656, device), StoreCounters(4, R, 656, device)
    for c in (ref_c, tri_c):                                   # counters already carry earlier steps
        c.hits[2] += 5
        c.step_counts[2] += 7
    ref = plan_epilogue_torch(slots, miss, hit, tokens, reqs, groups, r2h, ref_c, 2, **kw)
    red = torch.zeros((R, N + 1), dtype=torch.int32, device=device)
    got = plan_epilogue_triton(slots, miss, hit, tokens, reqs, groups, r2h, red, hits_row=tri_c.hits[2],
                               misses_row=tri_c.misses[2], layer_counts=tri_c.step_counts[2], **kw)
    names = ("read", "staged", "hot_dst", "ring_dst", "host_src", "fetch_dst")
    for name, a, t in zip(names, ref, got):
        assert a.dtype == t.dtype and a.shape == t.shape, (name, a.dtype, t.dtype, a.shape, t.shape)
        assert torch.equal(a, t), f"{name}: torch {a.tolist()} triton {t.tolist()}"
    for name in ("hits", "misses", "step_counts", "layer_hits", "layer_misses", "rows_h2d"):
        assert torch.equal(getattr(ref_c, name), getattr(tri_c, name)), name
    assert int(red.abs().sum()) == 0, "the scratch was not left zero"
    n_miss = int(miss.sum())
    assert int((ref[3] >= 0).sum()) == min(n_miss, ring_cap)   # the case really is what it says
    if ring_cap < n_miss:
        assert int(((ref[5] >= 0) & (ref[3] < 0)).sum()) == n_miss - ring_cap
    return {"misses": n_miss, "in_ring": int((ref[3] >= 0).sum())}


def move_case(seed: int, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 256, (40, 656), dtype=torch.uint8, generator=g).to(device)
    perm = torch.randperm(40, generator=g)
    src, dst = perm[:12].clone(), perm[12:24].clone()          # disjoint, each source once
    src[3], dst[7] = -1, -1
    src, dst = src.to(device), dst.to(device)
    want, got = rows.clone(), rows.clone()
    cw, cg = (torch.zeros((), dtype=torch.int64, device=device) for _ in range(2))
    move_rows(want, src, dst, "torch", count=cw)
    move_rows(got, src, dst, "triton", count=cg)
    assert torch.equal(want, got) and int(cw) == int(cg) == 10
    live = (src >= 0) & (dst >= 0)
    assert int(want[src[live]].sum()) == 0 and torch.equal(want[dst[live]], rows[src[live]])
    c2 = torch.zeros((), dtype=torch.int64, device=device)
    out = torch.zeros_like(rows)
    copy_rows(rows, src, out, dst, "triton", count=c2)
    assert int(c2) == 10 and torch.equal(out[dst[live]], rows[src[live]])
    return int(cg)


if __name__ == "__main__":
    report("plan_epilogue:ring_fits", lambda: epilogue_case(1, 5, ring_cap=1000))
    report("plan_epilogue:ring_overflows", lambda: epilogue_case(2, 5, ring_cap=7))
    report("plan_epilogue:padding_rows", lambda: epilogue_case(3, 4, ring_cap=9, pad_rows=2))
    report("plan_epilogue:one_row", lambda: epilogue_case(4, 1, ring_cap=3))
    report("plan_epilogue:no_ring", lambda: epilogue_case(5, 3, ring_cap=0))
    report("move_rows", lambda: move_case(6))
