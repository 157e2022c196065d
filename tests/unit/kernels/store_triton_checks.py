"""Child process (TRITON_INTERPRET=1): the store's CUDA code path run on this CPU - the Triton
resolver, Triton FlashTrans for every row move, and the Triton sparse MLA decode over the slot
space - in lockstep with the torch path (torch resolver, torch copies, torch reference attention)
on one decode trace with misses, ring overflow and DA. The `stream` variants run the Triton store on
the CUDA side-stream engine (prefetch/stream_engine.StreamEngine) with its Triton FlashTrans copy and
move kernels and streams that complete work late and out of order (tests/stream_doubles.LateStreams),
the slot bytes compared once every stream has run. Run by test_store_triton_path.py."""
import torch

from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.attention.overlap import decode_layer, plan_layer
from sgl_ess.attention.reference import sparse_mla_decode
from sgl_ess.kernels.sparse_mla_triton import sparse_mla_decode_triton
from sgl_ess.store import LatentStore, RequestTable, StoreConfig
from tests.unit.kernels.attention_bounds import plan_reference
from tests.unit.kernels.interp_runner import report

LAY = LatentLayout("fp8_flashmla", 128, 16)
K, N, LAYERS, STEPS, SCALE = 8, 12, 2, 6, 0.2
CONTEXTS = [40, 9, 25]


def make(backend):
    cfg = StoreConfig(num_layers=LAYERS, row_bytes=LAY.row_bytes, host_capacity_tokens=200, hot_slots_per_request=N,
                      max_requests=4, topk=K, max_context_tokens=64, resolver_backend=backend, ring_slots=5)
    store = LatentStore(cfg, transfer_backend=backend, engine="inline")
    return store, RequestTable(store)


def lockstep(mode, stream=False):
    g = torch.Generator().manual_seed(3)
    (s_t, tab_t), (s_k, tab_k) = make("torch"), make("triton")
    rt = None
    if stream:
        from sgl_ess.prefetch.stream_engine import StreamEngine
        from tests.stream_doubles import LateStreams

        rt = LateStreams(seed=11)
        s_k.engine = StreamEngine(s_k.memory, "triton", device="cpu", runtime=rt, zero_backend="triton")
    ids = list(range(len(CONTEXTS)))
    lat = {i: [torch.randn(c + STEPS, LAY.dim, generator=g) for _ in range(LAYERS)] for i, c in zip(ids, CONTEXTS)}
    for store, tab in ((s_t, tab_t), (s_k, tab_k)):
        for i, c in zip(ids, CONTEXTS):
            tab.add(i, c)
            for layer in range(LAYERS):
                store.write_host(layer, tab.host_locs(i), LAY.encode(lat[i][layer][:c]))
    for step in range(STEPS):
        q = torch.randn(len(ids), 2, LAY.dim, generator=g)
        pos = [tab.extend(ids) for tab in (tab_t, tab_k)]
        reqs, lens = tab_k.indices(ids), tab_k.seq_lens(ids)
        for layer in range(LAYERS):
            new = LAY.encode(torch.stack([lat[i][layer][int(pos[1][j])] for j, i in enumerate(ids)]))
            topk = torch.stack([torch.cat([pos[1][j:j + 1], torch.randperm(int(lens[j]) - 1, generator=g)[:K - 1]])
                                for j in range(len(ids))])
            outs = []
            for store, tab, kern in ((s_t, tab_t, False), (s_k, tab_k, True)):
                store.append(layer, reqs, pos[1], new, tab.req_to_host)
                steps = plan_layer(store, mode, layer, reqs, lens, topk, tab.req_to_host, validate=False)
                outs.append((steps, store))
            (st_t, store_t), (st_k, store_k) = outs
            for a, b in zip(st_t, st_k):
                assert torch.equal(a.read_slots, b.read_slots), f"step {step} layer {layer}: slot tables differ"
                assert torch.equal(a.staged, b.staged)
            wants, start = [], 0
            for sp in st_t:                    # each plan: the unsplit torch reference and its fp32 bound, read
                store_t.land(sp)               # after its rows landed and before the commit clears the ring rows
                b = sp.reqs.numel()
                wants.append(plan_reference(LAY, q[start:start + b], store_t.slot_rows, sp.read_slots,
                                            sp.staged, SCALE, dual=mode != "none"))
                start += b
            ref = decode_layer(store_t, mode, q, st_t, lambda qq, rows, sl: sparse_mla_decode(qq, rows, sl, LAY, SCALE))
            got = decode_layer(store_k, mode, q, st_k,
                               lambda qq, rows, sl: sparse_mla_decode_triton(qq, rows, sl, LAY, SCALE))
            if rt is not None:
                rt.progress(3)             # some side-stream work completes now, some later
                rt.finish()                # every stream has run: the bytes must be the torch path's
            assert torch.equal(store_t.slot_rows, store_k.slot_rows), f"step {step} layer {layer}: slot bytes differ"
            start = 0
            for sp, (want, _, tol) in zip(st_t, wants):
                b = sp.reqs.numel()
                err = (got[start:start + b].double() - want.double()).abs()
                assert bool((err <= tol).all()), f"step {step} layer {layer}: attention error {float(err.max()):.3e}"
                start += b
            assert got.shape == ref.shape and got.dtype == ref.dtype
    if rt is not None:                 # the copy kernels counted every fetched row: one per miss
        fetched = int(s_k.engine.stats()["tiers"]["immediate"]["rows"])
        misses = int(s_k.counters.layer_misses.sum())
        assert misses > 0 and fetched == misses == int(s_t.counters.layer_misses.sum()), (fetched, misses)
    for store, tab in ((s_t, tab_t), (s_k, tab_k)):
        for i in ids:
            tab.release(i)
        assert store.usage()["hot_slots_used"] == 0


if __name__ == "__main__":
    for mode in ("none", "da", "dba"):
        report(f"store_triton_path:{mode}", lambda m=mode: lockstep(m))
    for mode in ("none", "da"):
        report(f"store_triton_path:{mode}:stream", lambda m=mode: lockstep(m, stream=True))
