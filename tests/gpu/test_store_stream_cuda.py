"""The store on CUDA end to end (skipped without CUDA): host pool in a shared segment page-locked
in place (chunked cudaHostRegister), slot space on the device, the Triton resolver, FlashTrans
over zero-copy views, the side-stream engine with event ordering, and the Triton sparse decode:
attention equals the all-resident reference for none / da / dba; released host rows read zero
after the fence; nothing syncs the host inside a step (checked by running a step under
torch.cuda.set_sync_debug_mode('error'))."""
import pytest
import torch

from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.attention.overlap import plan_layer
from sgl_ess.kernels.sparse_mla_triton import sparse_mla_decode_triton
from sgl_ess.store import LatentStore, RequestTable, StoreConfig
from tests.gpu.decode_check import decode_matches_reference

pytestmark = pytest.mark.gpu

LAY = LatentLayout("fp8_flashmla", 512, 64)
K, N, LAYERS, STEPS, SCALE = 256, 600, 3, 6, 0.05
CONTEXTS = [4000, 700, 2500, 300]


def _store():
    cfg = StoreConfig(num_layers=LAYERS, row_bytes=LAY.row_bytes, host_capacity_tokens=sum(CONTEXTS) + 64,
                      hot_slots_per_request=N, max_requests=8, topk=K, max_context_tokens=8192,
                      device="cuda", ring_slots=300)
    store = LatentStore(cfg, engine="auto")
    assert store.engine.name == "stream" and store.resolver_backend == "triton" and store.host.pinned
    return store, RequestTable(store)


@pytest.mark.parametrize("mode", ["none", "da", "dba"])
def test_decode_on_cuda_matches_reference(mode):
    """The body is shared with the CPU run through the stream double (tests/gpu/decode_check.py)."""
    store, tab = _store()
    decode_matches_reference(store, tab, LAY, mode, lambda q, rows, sl: sparse_mla_decode_triton(q, rows, sl, LAY, SCALE),
                             torch.cuda.synchronize, contexts=CONTEXTS, steps=STEPS, k=K, scale=SCALE)
    store.shutdown()


def test_a_planned_step_does_not_sync_the_host():
    store, tab = _store()
    tab.add("a", 3000)
    reqs, lens = tab.indices(["a"]), tab.seq_lens(["a"])
    topk = torch.randperm(3000)[:K].reshape(1, K).cuda()
    plan_layer(store, "da", 0, reqs, lens, topk, tab.req_to_host, validate=False)   # warm (allocations)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        steps = plan_layer(store, "da", 0, reqs, lens, topk, tab.req_to_host, validate=False)
        for s in steps:
            store.land(s)
            store.commit(s)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    store.shutdown()


def test_released_rows_are_zeroed_in_stream_order():
    store, tab = _store()
    tab.add("a", 500)
    store.write_host(0, tab.host_locs("a"), torch.full((500, LAY.row_bytes), 7, dtype=torch.uint8, device="cuda"))
    locs = tab.host_locs("a").clone()
    store.clear_host(locs)          # a zero plan on the side stream, after the write above
    store.fence_host()              # later writes wait for it
    torch.cuda.synchronize()
    assert int(store.host.rows[:, locs.cpu()].sum()) == 0
    store.shutdown()


def test_a_released_request_leaves_no_row_behind_on_the_stream_engine():
    """Hot slots of a closed request, the staging rings (zeroed by each commit) and its host rows
    all read zero once the side stream is drained; the other request keeps its rows."""
    store, tab = _store()
    g = torch.Generator().manual_seed(5)
    for rid in ("a", "b"):
        tab.add(rid, 1000)
        for layer in range(LAYERS):
            store.write_host(layer, tab.host_locs(rid), torch.randint(1, 256, (1000, LAY.row_bytes), generator=g,
                                                                    dtype=torch.uint8).cuda())
    reqs, lens = tab.indices(["a", "b"]), tab.seq_lens(["a", "b"])
    for _ in range(3):
        for layer in range(LAYERS):
            topk = torch.stack([torch.randperm(1000, generator=g)[:K] for _ in range(2)]).cuda()
            store.resolve(layer, reqs, lens, topk.to(torch.int32), tab.req_to_host)
    ia, ib = tab.index("a"), tab.index("b")
    a_locs = tab.host_locs("a").clone()
    store.close(ia)
    store.clear_host(a_locs)
    store.fence_host()
    store.engine.drain()
    torch.cuda.synchronize()
    s = store.slots
    hot = s.rows[:s.ring_base].view(LAYERS, store.cfg.max_requests, N, LAY.row_bytes)
    assert int(hot[:, ia].count_nonzero()) == 0 and int(hot[:, ib].count_nonzero()) > 0
    assert int(s.rows[s.ring_base:].count_nonzero()) == 0
    assert int(store.host.rows[:, a_locs.cpu()].count_nonzero()) == 0
    assert int(store.host.rows[:, tab.host_locs("b").cpu()].count_nonzero()) > 0
    store.shutdown()


@pytest.mark.parametrize("predictor", ["next_layer", "score_ema"])
def test_speculative_tier_does_not_sync_the_host(predictor):
    """Issue 19: the speculative tier on the side-stream engine (tested on CPU as GPU fakes in
    tests/unit/store/test_speculative_gpu_fake.py) - planning, staging and claiming across layers
    run under the sync debugger."""
    cfg = StoreConfig(num_layers=LAYERS, row_bytes=LAY.row_bytes, host_capacity_tokens=sum(CONTEXTS) + 64,
                      hot_slots_per_request=N, max_requests=8, topk=K, max_context_tokens=8192,
                      device="cuda", ring_slots=300, spec_slots=512)
    store = LatentStore(cfg, engine="auto", speculative=predictor)
    tab = RequestTable(store)
    tab.add("a", 3000)
    reqs, lens = tab.indices(["a"]), tab.seq_lens(["a"])
    topk = torch.randperm(3000)[:K].reshape(1, K).cuda()

    def step():
        for layer in range(LAYERS):
            for s in plan_layer(store, "da", layer, reqs, lens, topk, tab.req_to_host, validate=False):
                store.land(s)
                store.commit(s)

    step()                                  # warm (allocations, first predictions)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert store.spec.predict_calls > 0
    store.shutdown()
