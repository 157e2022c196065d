"""CUDA checks of the two Triton kernels at the paper's shapes (batch 64, k 2048, N 6400,
128 heads, 576-wide latent, 656-byte FP8 rows): the resolver against the LRU oracle and in
lockstep with the torch path (identical state), including padded rows and CUDA-graph replay;
the sparse MLA decode against the torch reference with the fp32 bounds of
tests/unit/kernels/attention_bounds.py. Skipped without CUDA (tests/conftest.py)."""
import pytest
import torch

from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.attention.reference import merge_lse, sparse_mla_decode
from sgl_ess.core.lru_oracle import LruOracle
from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.resolver import assign
from tests.unit.kernels.attention_bounds import decode_bounds, merge_bounds
from tests.unit.kernels.lru_scenarios import SCENARIOS, run_scenario

pytestmark = pytest.mark.gpu
triton = pytest.importorskip("triton")

B, K, N, CTX = 64, 2048, 6400, 32768


def _locality_trace(g, steps, b=B, k=K, ctx=CTX, keep=0.85):
    """[steps, b, k] int64: each step keeps `keep` of the previous set (positions may repeat)."""
    cur = torch.stack([torch.randperm(ctx, generator=g)[:k] for _ in range(b)])
    out = [cur]
    fresh = k - int(keep * k)
    for _ in range(steps - 1):
        cur = cur.clone()
        cols = torch.stack([torch.randperm(k, generator=g)[:fresh] for _ in range(b)])
        cur.scatter_(1, cols, torch.randint(ctx, (b, fresh), generator=g))
        out.append(cur)
    return torch.stack(out)


def _same_state(a, b):
    return torch.equal(a.slot_to_token, b.slot_to_token) and torch.equal(a.lru_order, b.lru_order)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_resolver_kernel_scenarios_on_cuda(name):
    run_scenario(name, backends=("triton", "torch"), device="cuda", lockstep=True)


def test_resolver_kernel_paper_shapes_vs_oracle_and_torch():
    g = torch.Generator().manual_seed(0)
    tr = _locality_trace(g, steps=6)
    kern = DeviceHotBuffer(1, B, N, "cuda", max_context_tokens=CTX)
    ref = DeviceHotBuffer(1, B, N, "cuda", max_context_tokens=CTX)
    reqs = torch.arange(B, device="cuda")
    lens = torch.full((B,), CTX, device="cuda")
    checked = range(0, B, 8)                       # the Python oracle is slow: 8 of 64 requests
    oracles = {i: LruOracle(N) for i in checked}
    for s in range(tr.shape[0]):
        tokens = tr[s].cuda()
        a = assign(kern, 0, reqs, lens, tokens, backend="triton")
        w = assign(ref, 0, reqs, lens, tokens, backend="torch")
        assert torch.equal(a.slots, w.slots) and torch.equal(a.miss, w.miss) and torch.equal(a.hit, w.hit)
        assert _same_state(kern, ref), f"step {s}: kernel and torch state differ"
        assert int(kern.token_map.abs().sum()) == 0
        miss = a.miss.cpu()
        for i in checked:
            want = oracles[i].access(tr[s, i].tolist())
            assert sorted(tr[s, i][miss[i]].tolist()) == sorted(want.misses), f"step {s} req {i}"
            s2t = kern.slot_to_token[0, i].cpu()
            order = kern.lru_order[0, i].cpu().long()
            assert [int(s2t[j]) for j in order if s2t[j] >= 0] == list(oracles[i]._order)


def test_resolver_kernel_replays_in_a_cuda_graph_with_padded_rows():
    """Captured once, replayed each step on new top-k: equal to the torch path run eagerly.
    Rows past num_real_reqs (a padded graph batch) name real requests and must change nothing."""
    g = torch.Generator().manual_seed(1)
    b_graph, real = 16, 12
    tr = _locality_trace(g, steps=5, b=b_graph)
    kern = DeviceHotBuffer(1, b_graph, N, "cuda", max_context_tokens=CTX)
    ref = DeviceHotBuffer(1, b_graph, N, "cuda", max_context_tokens=CTX)
    reqs = torch.arange(b_graph, device="cuda")
    reqs[real:] = torch.arange(b_graph - real, device="cuda")   # padding names requests 0..3
    lens = torch.full((b_graph,), CTX, device="cuda")
    num_real = torch.tensor([real], device="cuda")
    tokens = tr[0].cuda().clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):                             # compile outside the capture
        scratch = DeviceHotBuffer(1, b_graph, N, "cuda", max_context_tokens=CTX)
        assign(scratch, 0, reqs, lens, tokens, backend="triton", num_real_reqs=num_real)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = assign(kern, 0, reqs, lens, tokens, backend="triton", num_real_reqs=num_real)
    for s in range(tr.shape[0]):
        tokens.copy_(tr[s].cuda())
        graph.replay()
        w = assign(ref, 0, reqs[:real], lens[:real], tokens[:real], backend="torch")
        assert torch.equal(out.slots[:real], w.slots) and torch.equal(out.miss[:real], w.miss)
        assert bool((out.slots[real:] == -1).all()) and not bool(out.miss[real:].any())
        assert _same_state(kern, ref), f"replay {s}: state differs from the eager torch path"


def _fp8_case(g, t_tokens, heads=128, k=K, rows_total=B * N, q_dtype=torch.bfloat16):
    lay = LatentLayout("fp8_flashmla", 512, 64)
    rows = lay.encode(torch.randn(rows_total, lay.dim, generator=g).cuda())
    q = torch.randn(t_tokens, heads, lay.dim, generator=g).to(q_dtype).cuda()
    slots = torch.randint(0, rows_total, (t_tokens, k), generator=g, dtype=torch.int32)
    slots[torch.rand(slots.shape, generator=g) < 0.05] = -1
    slots[-1] = -1                                         # one token selected nothing
    return lay, q, rows, slots.cuda(), lay.dim ** -0.5


def _check_decode(lay, q, rows, slots, sm, mask=None, block_kv=16):
    from sgl_ess.kernels.sparse_mla_triton import sparse_mla_decode_triton
    want_o, want_l = sparse_mla_decode(q, rows, slots, lay, sm, mask=mask)
    got_o, got_l = sparse_mla_decode_triton(q, rows, slots, lay, sm, mask=mask, block_kv=block_kv)
    keep = (slots >= 0) if mask is None else (slots >= 0) & mask
    kv = lay.decode(rows[slots.clamp(min=0).long()])
    tol_o, tol_l = decode_bounds(q.float(), kv, keep, sm, lay.kv_lora_rank, want_l, block_kv, False)
    fin = torch.isfinite(want_l)
    assert torch.equal(torch.isfinite(got_l), fin)
    assert bool(((got_l - want_l).abs().double().where(fin, 0.0) <= tol_l).all()), "lse beyond the fp32 bound"
    assert bool(((got_o - want_o).abs().double() <= tol_o).all()), "out beyond the fp32 bound"
    assert bool((got_o[~keep.any(dim=1)] == 0).all())
    return got_o, got_l, tol_o, tol_l


@pytest.mark.parametrize("t_tokens", [64, 128])        # batch 64, and 64 x 2 MTP verify tokens
def test_sparse_decode_fp8_paper_shapes(t_tokens):
    _check_decode(*_fp8_case(torch.Generator().manual_seed(t_tokens), t_tokens))


@pytest.mark.parametrize("kind", ["bf16", "fp32"])
def test_sparse_decode_other_layouts(kind):
    g = torch.Generator().manual_seed(3)
    lay = LatentLayout(kind, 512, 64)
    rows = lay.encode(torch.randn(20000, lay.dim, generator=g).cuda())
    q = torch.randn(16, 128, lay.dim, generator=g).cuda()
    slots = torch.randint(-1, 20000, (16, K), generator=g, dtype=torch.int32).cuda()
    _check_decode(lay, q, rows, slots, lay.dim ** -0.5)


def test_sparse_decode_da_split_merges_to_full():
    g = torch.Generator().manual_seed(4)
    lay, q, rows, slots, sm = _fp8_case(g, 32, rows_total=50000)
    hit = (torch.rand(slots.shape, generator=g) < 0.8).cuda()
    hit[0] = True
    hit[1] = False
    o0, l0, to0, tl0 = _check_decode(lay, q, rows, slots, sm, mask=hit)
    o1, l1, to1, tl1 = _check_decode(lay, q, rows, slots, sm, mask=~hit)
    mo, ml = merge_lse(o0, l0, o1, l1)
    want_o, want_l = sparse_mla_decode(q, rows, slots, lay, sm)
    v_max = lay.decode(rows[slots.clamp(min=0).long()])[..., :512].abs().amax(dim=(1, 2)).double().unsqueeze(1)
    tol_o, tol_l = merge_bounds(to0, tl0, to1, tl1, v_max, want_l)
    fin = torch.isfinite(want_l)
    assert bool(((ml - want_l).abs().double().where(fin, 0.0) <= tol_l).all())
    assert bool(((mo - want_o).abs().double() <= tol_o).all())
