"""GPU fake (issue 35 item 3): a Two-Batch-Overlap decode step captured in a CUDA graph (``--ess-cuda-graph``
with ``--enable-two-batch-overlap``) through SGLang's own ``TboAttnBackend`` over three CUDA backend
classes (its primary and two children), on this CPU, with tests/graph_double.py's graph and streams.

What SGLang 0.5.23 does, and this test does the same way:
  * capture (decode_cuda_graph_runner.capture_one_shape -> TboCudaGraphRunnerPlugin.capture_one_batch_size
    -> TboForwardBatchPreparer.filter_batch): the capture batch gets two children whose request and
    location tensors are slices of the graph's static buffers (split at bs // 2, ``tbo_parent_token_range``
    set); ``TboAttnBackend.init_forward_metadata_out_graph(in_capture=True)`` hands the primary the whole
    batch and each child its own; ``on_after_cuda_graph_warmup`` reaches all three;
  * the step: the first dense layers run on the primary with the whole batch (deepseek_v2's
    ``first_k_dense_replace``), the others per micro-batch in TBO's decode order (operations_strategy's
    blog decode strategy, two stages apart: a's indexer and attention of a layer, then b's), each child
    with its batch and as the forward context's backend (so the indexer hook sees the child);
  * replay: ``TboAttnBackend.init_forward_metadata_out_graph(view)`` hands the primary SGLang's padded view
    and each child a slice of it without ``num_padding`` (``_build_tbo_child_replay_fb_view``).
The eager twin runs the same requests through a second store as SGLang's eager TBO does (split at
n // 2 of the real rows, no padding): outputs equal bit for bit, the same LRU state and hot bytes after;
the children plan in their own ring groups (micro-batches 0-1 and 2-3) and never share a ring row; one
replay is counted once, not once per child.
"""


import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.batch_overlap.two_batch_overlap import compute_split_seq_index  # noqa: E402
from sglang.srt.layers.attention.tbo_backend import TboAttnBackend  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from sgl_ess.integration.sglang.backends.cuda_backend import _around_indexer_forward_cuda, backend_class  # noqa: E402
from sgl_ess.kernels import flashtrans  # noqa: E402
from sgl_ess.prefetch.stream_engine import StreamEngine  # noqa: E402
from tests.graph_double import CaptureStreams, Graph  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import copy_rows_static, cuda_batch, cuda_layer, cuda_runner, install_gpu_fakes  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401
from .test_cuda_graph_gpu_fake import CapturedStep  # noqa: E402

LAYERS, DENSE, CHUNK, BS = 3, 1, 16, 4     # layer 0 dense (the whole batch), layers 1-2 per micro-batch


def _split(n: int) -> int:
    """SGLang's decode split of n requests: the first ones go to micro-batch a."""
    return compute_split_seq_index(forward_mode=ForwardMode.DECODE, num_tokens=n, extend_lens=None,
                                   token_num_per_seq=1)


@pytest.fixture(params=[("flashmla_kv", "da"), ("flashmla_sparse", "dba"), ("flashmla_kv", "none")],
                ids=["flashmla_kv-da", "flashmla_sparse-dba", "flashmla_kv-none"])
def tbo_fakes(request, ess_env, monkeypatch):
    """make() -> (tbo, runner, streams): SGLang's TboAttnBackend over three CUDA backend classes sharing
    their runner's store, any number of them (each on its own pools and store)."""
    from sglang.srt.model_executor import forward_context
    from sglang.srt.runtime_context import get_parallel

    decode_impl, level = request.param
    ess_env(hot_slots_per_request=24, cuda_graph=True, prefetch_overlap_level=level)
    _, ov = install_gpu_fakes(monkeypatch, decode_impl=decode_impl)
    monkeypatch.setattr(flashtrans, "copy_rows_torch", copy_rows_static)
    current = {}
    monkeypatch.setattr(forward_context, "get_attn_backend", lambda: current["backend"])
    monkeypatch.setattr(forward_context, "get_req_to_token_pool", lambda: current["backend"].req_to_token_pool)

    def make():
        req_pool, alloc = fr.shared_pools()
        runner = cuda_runner(req_pool, alloc, LAYERS)
        cls = backend_class()
        tbo = TboAttnBackend(cls(runner), [cls(runner), cls(runner)])
        store = tbo.primary.ess.store
        assert all(c.ess is tbo.primary.ess for c in tbo.children)      # one store per runner
        rt = CaptureStreams(seed=5)
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=rt, zero_backend="torch")
        store.resolver_backend = "torch"
        tbo.primary.ess.validate = False
        return tbo, runner, rt

    make.current = current
    with get_parallel().override(attn_dcp_rank=0):
        yield make
    ov.restore()


def _run_layer(make, backend, fb, li, q, topk):
    """One layer of one (micro-)batch: the indexer's hand-off (ESS's hook), then attention, with `backend`
    as the forward context's (SGLang's operations set each child's)."""
    make.current["backend"] = backend
    topk = _around_indexer_forward_cuda(lambda *a, _t=topk: _t, None, None, None, None, fb, li)
    return backend.forward_decode(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)


def _start(make, tbo, runner, rows, prompts, gen, first_loc=fr.PAGE):
    """New requests prefilled eagerly (their last CHUNK tokens): hot buffers opened and warmed."""
    r2t = runner.req_to_token_pool.req_to_token
    fr.place_requests(runner.req_to_token_pool, rows, [p + 16 for p in prompts], first_loc=first_loc)
    for li in range(LAYERS):
        for r, p in zip(rows, prompts):
            fr.write_rows(runner, li, r2t[r, :p + 16], gen)
    fb = cuda_batch("EXTEND", rows, prompts, torch.cat([r2t[r, p - CHUNK:p] for r, p in zip(rows, prompts)]),
                    extend_lens=[CHUNK] * len(rows), prefix_lens=[p - CHUNK for p in prompts])
    make.current["backend"] = tbo
    tbo.init_forward_metadata(fb)
    qpos = [p - CHUNK + j for p in prompts for j in range(CHUNK)]
    for li in range(LAYERS):
        tbo.forward_extend(fr.query(gen, len(qpos)), None, None, cuda_layer(li), fb, save_kv_cache=False,
                           topk_indices=fr.causal_topk(gen, qpos))


def _eager_tbo_step(make, tbo, runner, rows, seq, q, topk):
    """SGLang's eager TBO decode step: children split at n // 2 of the real rows. Returns per layer
    [n, H, R] (the micro-batches' outputs in row order)."""
    r2t = runner.req_to_token_pool.req_to_token
    n, s = len(rows), _split(len(rows))
    loc = torch.stack([r2t[r, x - 1] for r, x in zip(rows, seq)]).long()
    fb = cuda_batch("DECODE", rows, seq, loc)
    parts = [slice(0, s), slice(s, n)]
    fb.tbo_children = [cuda_batch("DECODE", rows[p], seq[p], loc[p]) for p in parts]
    for c, p in zip(fb.tbo_children, parts):
        c.tbo_parent_token_range = (p.start, p.stop)
    make.current["backend"] = tbo
    tbo.init_forward_metadata(fb)
    outs = []
    for li in range(LAYERS):
        if li < DENSE:
            outs.append(_run_layer(make, tbo, fb, li, q[li], topk[li]))
            continue
        outs.append(torch.cat([_run_layer(make, child, cfb, li, q[li][p], topk[li][p])
                               for child, cfb, p in zip(tbo.children, fb.tbo_children, parts) if cfb.batch_size]))
    return outs


class TboCapturedStep(CapturedStep):
    """SGLang's decode graph runner with TBO, reduced to what the attention backends see: static buffers of
    BS rows, the capture batch and its two children over slices of them, one step of every layer (the
    buffers, SGLang's capture and load_batch are test_cuda_graph_gpu_fake's, TboAttnBackend the backend:
    its out_graph hook gives the children their slices of the padded view)."""

    layers = LAYERS
    view_extra = {"max_seq_len_override": None}

    def __init__(self, make, tbo, runner, bs: int = BS):
        super().__init__(tbo, runner, bs)
        self.make, self.tbo = make, tbo
        s = _split(bs)                                             # capture_one_batch_size: bs // 2
        self.parts = [slice(0, s), slice(s, bs)]
        self.fb.tbo_children = [self._over(p) for p in self.parts]
        for c, p in zip(self.fb.tbo_children, self.parts):
            c.tbo_parent_token_range = (p.start, p.stop)          # filter_batch's

    def _over(self, p: slice):
        m = p.stop - p.start
        fb = cuda_batch("DECODE", [0] * m, [1] * m, torch.zeros(m, dtype=torch.int64))
        fb.req_pool_indices, fb.seq_lens = self.req_pool_indices[p], self.seq_lens[p]
        fb.out_cache_loc, fb.seq_lens_cpu = self.out_cache_loc[p], self.seq_lens[p]
        return fb

    def forward(self):
        self.tbo.init_forward_metadata_in_graph(self.fb)
        outs = []
        for li in range(LAYERS):
            if li < DENSE:
                outs.append(_run_layer(self.make, self.tbo, self.fb, li, self.q[li], self.topk[li]))
                continue
            outs.append(torch.cat([_run_layer(self.make, child, cfb, li, self.q[li][p], self.topk[li][p])
                                   for child, cfb, p in zip(self.tbo.children, self.fb.tbo_children, self.parts)]))
        return outs

    def replay_prep(self, view) -> None:
        self.make.current["backend"] = self.tbo
        self.tbo.init_forward_metadata_out_graph(view)


def _record_plans(store, make, tbo):
    """store.plan recording (who planned: 'a' / 'b' / 'whole', its micro-batch, the StepPlan)."""
    seen, plan = [], store.plan
    names = {id(tbo.children[0]): "a", id(tbo.children[1]): "b"}

    def rec(layer, *a, micro_batch=0, **kw):
        step = plan(layer, *a, micro_batch=micro_batch, **kw)
        seen.append((names.get(id(make.current["backend"]), "whole"), micro_batch, step))
        return step
    store.plan = rec
    return seen


def test_gpu_fake_a_tbo_decode_step_replays_as_its_eager_twin(tbo_fakes):
    make = tbo_fakes
    (gt, grun, grt), (et, erun, _) = make(), make()
    # the requests' rows, the same in both stores; each step's queries and top-k drawn once (the graph's load)
    gens = {id(gt): torch.Generator().manual_seed(51), id(et): torch.Generator().manual_seed(51)}
    draw = torch.Generator().manual_seed(52)
    # row 7, the last request row: a padding row (-1) indexed as if it were a request would land on its buffers
    prompts = {1: 130, 2: 95, 3: 160, 7: 70}
    for t, run in ((gt, grun), (et, erun)):
        _start(make, t, run, list(prompts), list(prompts.values()), gens[id(t)])
    junk = torch.Generator().manual_seed(53)
    for li in range(LAYERS):        # location 0 holds what SGLang's padding rows wrote there: junk, not zeros
        fr.write_rows(grun, li, torch.zeros(1, dtype=torch.int64), junk)
    gstore = gt.primary.ess.store
    plans = _record_plans(gstore, make, gt)
    step = TboCapturedStep(make, gt, grun)
    graph = Graph(grt)
    step.capture(graph)
    captured = [(who, mb, st) for who, mb, st in plans]
    assert {who for who, _, _ in captured} == {"whole", "a", "b"}, "the step did not run per micro-batch"
    own = {"whole": {0, 1}, "a": {0, 1}, "b": {2, 3}}
    for who, mb, _ in captured:
        assert mb in own[who], f"micro-batch {who} planned in micro-batch {mb}, not its own {sorted(own[who])}"
    seq = dict(prompts)
    rings = {"a": set(), "b": set()}
    replays = [[1, 2, 3, 7], [3, 1], [2, 7, 1], [1], "swap", [7, 2, 3]]
    for n_step, rows in enumerate(replays):
        if rows == "swap":      # request 2 finished; a new request takes its row, on other host rows
            for t, run in ((gt, grun), (et, erun)):
                t.primary.ess.close_rows([2])
                _start(make, t, run, [2], [60], gens[id(t)], first_loc=fr.PAGE + 2048)
            seq[2] = 60
            continue
        for r in rows:
            seq[r] += 1
        step.load(rows, [seq[r] for r in rows], draw)
        graph.replay()
        grt.progress(3)
        k = len(rows)
        outs = _eager_tbo_step(make, et, erun, rows, [seq[r] for r in rows],
                               [q[:k].clone() for q in step.q], [t[:k].clone() for t in step.topk])
        for li in range(LAYERS):
            got = step.outs[li].reshape(BS, -1)
            assert torch.equal(outs[li].reshape(k, -1), got[:k]), (n_step, rows, li)
            assert not got[k:].any(), f"layer {li}: padding rows' outputs are not zero"
        for who, _, st in captured:        # this replay's ring rows (the plans' outputs, rewritten by it)
            if who in rings:
                rings[who].update(st.ring_dst[st.ring_dst >= 0].tolist())
    assert rings["a"] and rings["b"] and not rings["a"] & rings["b"], "the micro-batches shared ring rows"
    usage = gt.primary.ess.path_usage()
    real = [r for r in replays if r != "swap"]
    assert usage["graph_captures"] == 1 and usage["graph_replays"] == len(real), usage
    assert usage["graph_rows"] == sum(len(r) for r in real), "a replay was counted per child"
    for t in (gt, et):
        t.primary.ess.store.engine.drain()
    grt.finish()
    et.primary.ess.store.engine.rt.finish()
    sg, se = gstore, et.primary.ess.store
    assert torch.equal(sg.hot.slot_to_token, se.hot.slot_to_token)
    assert torch.equal(sg.hot.lru_order, se.hot.lru_order)
    assert torch.equal(sg.slots.rows[:sg.slots.ring_base], se.slots.rows[:se.slots.ring_base])
    assert torch.equal(sg.counters.hits, se.counters.hits) and torch.equal(sg.counters.misses, se.counters.misses)
    assert int(sg.counters.layer_misses.sum()) > 0 and int(sg.counters.layer_hits.sum()) > 0
