"""GPU fake: ``--ess-tp-split-fetch`` inside ESS's decode CUDA graphs (issue 35 item 3). The store's engine is
the stream engine wrapped in SplitFetch (prefetch/split_fetch.py) as pool_adapter._split_fetch wraps it on a
GPU; on a device engine its exchange is capped by the store's miss budget (SplitFetch.size_for_store: a
static row count, no host sync), so a step's exchange is the same launches for every batch and is captured
with it. A decode step is captured through SGLang's hooks on the CUDA backend class and replayed with the
graph double (tests/graph_double.py: no Python of ours at replay; host reads and data-dependent shapes
refused at capture) while requests change between replays (fewer rows, a finished request's row reused by a
new one on other host rows, rows reordered): every replay equals the dense reference over the true rows and,
bit for bit, an eager twin on its own store with the same SplitFetch; afterwards both stores' LRU state,
hot-slot bytes, counters and exchange counts agree.

The collective is a stand-in for a group of two ranks in one process (PeerRank): rank 1's share of the plan
being exchanged, read from the host rows by tensor ops, so the double records it and a replay recomputes it
from the replayed plan, as NCCL's all-gather is captured in a CUDA graph. The real collective between two
processes is tests/unit/prefetch/test_split_fetch.py's (eager).
"""
import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.cuda_backend import backend_class  # noqa: E402
from sgl_ess.kernels import flashtrans  # noqa: E402
from sgl_ess.prefetch.split_fetch import SplitFetch  # noqa: E402
from sgl_ess.prefetch.stream_engine import StreamEngine  # noqa: E402
from tests.graph_double import CaptureStreams, Graph  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import copy_rows_static, cuda_batch, cuda_layer, cuda_runner, install_gpu_fakes  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401
from .test_cuda_graph_gpu_fake import LAYERS, CapturedStep, _start  # noqa: E402


class PeerRank:
    """Stand-in for the other rank of a group of two, in this process: `all_gather(send)` returns [this rank's
    rows, the rows rank 1 reads for the plan being exchanged] - rank 1's share of the plan's valid entries (the
    odd ones in order, j -> row j // 2, below the exchange's cap), read from the shared host rows, as SplitFetch
    numbers them on every rank. Tensor ops only, over the plan's own index tensors, so a capture records it and
    a replay recomputes it from the replayed plan (NCCL's all-gather is captured by a CUDA graph the same way).
    `wrap(sf)` notes, through its public submit and wait, which plan each exchange belongs to."""

    def __init__(self):
        self.sf, self.plans, self.current = None, {}, None

    def wrap(self, sf: SplitFetch) -> SplitFetch:
        submit, wait = sf.submit, sf.wait

        def noting_submit(plan):
            ticket = submit(plan)
            self.plans[ticket.plan_id] = plan
            return ticket

        def noting_wait(ticket):
            self.current = self.plans.pop(ticket.plan_id, None)
            wait(ticket)
        sf.submit, sf.wait, self.sf = noting_submit, noting_wait, sf
        return sf

    def all_gather(self, send: torch.Tensor) -> torch.Tensor:
        plan, cap = self.current, send.shape[0]
        valid = (plan.src_idx >= 0) & (plan.dst_idx >= 0)
        j = torch.cumsum(valid.to(torch.int64), 0) - 1
        theirs = valid & (j % 2 == 1) & (j // 2 < cap)
        host = self.sf.mem.host[plan.layer]
        rows = host.index_select(0, torch.where(theirs, plan.src_idx, 0))
        peer = torch.zeros((cap + 1, send.shape[1]), dtype=send.dtype, device=send.device)
        peer.index_copy_(0, torch.where(theirs, j // 2, cap), torch.where(theirs.unsqueeze(1), rows, 0))
        return torch.stack([send, peer[:cap]])


@pytest.fixture(params=[("flashmla_kv", "da"), ("flashmla_sparse", "dba")], ids=["flashmla_kv-da", "flashmla_sparse-dba"])
def split_fakes(request, ess_env, monkeypatch):
    """make() -> (backend, runner, streams): a CUDA backend class whose store fetches through SplitFetch
    (rank 0 of 2) around the stream engine."""
    from sglang.srt.model_executor import forward_context
    from sglang.srt.runtime_context import get_parallel

    decode_impl, level = request.param
    ess_env(hot_slots_per_request=24, cuda_graph=True, prefetch_overlap_level=level)
    _, ov = install_gpu_fakes(monkeypatch, decode_impl=decode_impl)
    monkeypatch.setattr(flashtrans, "copy_rows_torch", copy_rows_static)   # FlashTrans with static shapes
    current = {}
    monkeypatch.setattr(forward_context, "get_attn_backend", lambda: current["backend"])
    monkeypatch.setattr(forward_context, "get_req_to_token_pool", lambda: current["backend"].req_to_token_pool)

    def make():
        req_pool, alloc = fr.shared_pools()
        runner = cuda_runner(req_pool, alloc, LAYERS)
        backend = backend_class()(runner)
        store = backend.ess.store
        rt = CaptureStreams(seed=3)
        inner = StreamEngine(store.memory, "torch", device="cpu", runtime=rt, zero_backend="torch")
        peer = PeerRank()
        store.engine = peer.wrap(SplitFetch(inner, 0, 2, peer.all_gather))   # sized by the store: cap from its ring
        store.resolver_backend = "torch"
        backend.ess.validate = False
        current["backend"] = backend
        return backend, runner, rt

    def use(backend):
        current["backend"] = backend
    make.use = use
    with get_parallel().override(attn_dcp_rank=0):
        yield make
    ov.restore()


def _split(backend) -> dict:
    return backend.ess.store.engine.stats()["split_fetch"]


def test_gpu_fake_split_fetch_replays_equal_the_eager_twin(split_fakes):
    make = split_fakes
    (gb, grun, grt), (eb, erun, _) = make(), make()
    cap = gb.ess.store.engine.cap_rows
    assert cap == -(-gb.ess.store.cfg.ring_slots_per_group // 2)       # the static size, from the config
    gens = {id(gb): torch.Generator().manual_seed(43), id(eb): torch.Generator().manual_seed(43)}
    prompts = {1: 130, 2: 95, 3: 60}
    for b, run in ((gb, grun), (eb, erun)):
        make.use(b)
        _start(b, run, [1, 2, 3], list(prompts.values()), gens[id(b)])
    make.use(gb)
    g0, e0 = _split(gb)["exchanges"], _split(eb)["exchanges"]
    step = CapturedStep(gb, grun)
    graph = Graph(grt)
    step.capture(graph)
    seq = dict(prompts)
    r2t = erun.req_to_token_pool.req_to_token
    steps = ([1, 2, 3], [3, 1], [2, 3, 1], [1], [1, 2, 3])
    for n, rows in enumerate(steps):
        if n == 3:                                   # request 2 finished, a new one in its row (other host rows)
            for b, run in ((gb, grun), (eb, erun)):
                make.use(b)
                b.ess.close_rows([2])
                _start(b, run, [2], [70], torch.Generator().manual_seed(44), first_loc=fr.PAGE + 2048)
            seq[2] = 70
        for r in rows:
            seq[r] += 1
        make.use(gb)
        step.load(rows, [seq[r] for r in rows], gens[id(gb)])
        graph.replay()
        step.check(rows)                             # the dense reference over the true rows
        grt.progress(3)
        make.use(eb)
        fb = cuda_batch("DECODE", rows, [seq[r] for r in rows], torch.stack([r2t[r, seq[r] - 1] for r in rows]).long())
        eb.init_forward_metadata(fb)
        k = len(rows)
        for li in range(LAYERS):
            out = eb.forward_decode(step.q[li][:k].clone(), None, None, cuda_layer(li), fb, save_kv_cache=False,
                                    topk_indices=step.topk[li][:k].clone())
            assert torch.equal(out.reshape(k, -1), step.outs[li].reshape(step.bs, -1)[:k]), (n, li)
    for b in (gb, eb):
        b.ess.store.engine.drain()
        b.ess.store.engine.rt.finish()
    sg, se = gb.ess.store, eb.ess.store
    assert torch.equal(sg.hot.slot_to_token, se.hot.slot_to_token)
    assert torch.equal(sg.hot.lru_order, se.hot.lru_order)
    assert torch.equal(sg.slots.rows[:sg.slots.ring_base], se.slots.rows[:se.slots.ring_base])
    assert torch.equal(sg.counters.hits, se.counters.hits) and torch.equal(sg.counters.misses, se.counters.misses)
    assert int(sg.counters.layer_misses.sum()) > 0
    # one exchange per immediate plan: a plan per layer, per half batch under dba (a batch of two rows or more;
    # a graph's batch is the padded one). The replays' are counted by the replay hook (the capture's own run
    # moved nothing and is not counted): 5 replays + SGLang's 2 warm-ups (eager) of the graph's batch
    g, e = _split(gb), _split(eb)
    halves = 2 if gb.ess.mode(0) == "dba" else 1
    eager = sum(LAYERS * (halves if len(rows) >= 2 else 1) for rows in steps)
    assert e["exchanges"] - e0 == eager and g["exchanges"] - g0 == 7 * LAYERS * halves, (g0, g, e0, e)
    for s in (g, e):
        assert s["rows_exchanged"] == 2 * cap * s["exchanges"] and s["bytes_exchanged"] == s["rows_exchanged"] * sg.cfg.row_bytes
