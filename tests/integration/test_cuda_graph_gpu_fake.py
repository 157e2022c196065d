"""GPU fake (issue 16): ESS decode steps captured in a CUDA graph (``--ess-cuda-graph``) by the CUDA
backend class that ships on a GPU, on this CPU, through SGLang's own graph hooks on it
(``init_cuda_graph_state``, ``init_forward_metadata_out_graph`` before the capture and before each
replay, ``on_after_cuda_graph_warmup``). The graph is tests/graph_double.py's: the step's tensor ops
are recorded once and replayed on the same tensors, with no Python of ours running at replay, and a
capture refuses host reads, data-dependent shapes and side-stream work it did not fork and join
(CaptureStreams: the stream engine's streams completing work late and out of order, plus a
capture's stream rules). FlashMLA is the torch reference (tests/integration/_cuda_fake.py).

Each replay's outputs are compared with the dense reference over the true rows, while requests
change between replays as SGLang's do: fewer requests (padding rows), a finished request's row
reused by a new one, rows in another order, and an eager step between replays.
"""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.cuda_backend import _around_indexer_forward_cuda, backend_class  # noqa: E402
from sgl_ess.kernels import flashtrans  # noqa: E402
from sgl_ess.prefetch.stream_engine import StreamEngine  # noqa: E402
from tests.graph_double import CaptureStreams, Graph  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import (copy_rows_static, cuda_batch, cuda_layer, cuda_runner, install_gpu_fakes,  # noqa: E402
                         reference, split_bound)
from ._spec_fixtures import ess_env  # noqa: E402,F401

LAYERS, CHUNK, BS = 2, 16, 4
BF16_ULP = 2.0 ** -8


@pytest.fixture(params=[("flashmla_kv", "da"), ("flashmla_sparse", "da"), ("flashmla_kv", "none"), ("flashmla_sparse", "dba")],
                ids=["flashmla_kv-da", "flashmla_sparse-da", "flashmla_kv-none", "flashmla_sparse-dba"])
def graph_fakes(request, ess_env, monkeypatch):
    """make() -> (backend, runner, streams): a CUDA backend class on its own pools and store, any number.
    Overlap level da: the indexer's hand-off plans each layer (early plans); dba: one early plan per half
    batch (each its own fetch), DA per half; none: attention does. da and dba split FlashMLA's attention
    into calls merged by LSE (flashmla_lse.py)."""
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
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=rt, zero_backend="torch")
        store.resolver_backend = "torch"                 # the Triton resolver's reference (numba is the CPU's)
        backend.ess.validate = False                     # as on CUDA (the fake's device is the CPU)
        current["backend"] = backend                     # SGLang's forward context: the backend running now
        return backend, runner, rt

    def use(backend):
        current["backend"] = backend
    make.use = use
    with get_parallel().override(attn_dcp_rank=0):
        yield make
    ov.restore()


@pytest.fixture
def graph_fake(graph_fakes):
    return graph_fakes()


def _bound(want: torch.Tensor) -> float:
    return float(want.abs().max()) * BF16_ULP + 1e-6


def _start(backend, runner, rows, prompts, gen, first_loc=fr.PAGE):
    """New requests: their rows written, then the last CHUNK tokens prefilled (eager), which opens
    and warms their hot buffers."""
    r2t = runner.req_to_token_pool.req_to_token
    fr.place_requests(runner.req_to_token_pool, rows, [p + 16 for p in prompts], first_loc=first_loc)
    for li in range(LAYERS):
        for r, p in zip(rows, prompts):
            fr.write_rows(runner, li, r2t[r, :p + 16], gen)
    fb = cuda_batch("EXTEND", rows, prompts, torch.cat([r2t[r, p - CHUNK:p] for r, p in zip(rows, prompts)]),
                    extend_lens=[CHUNK] * len(rows), prefix_lens=[p - CHUNK for p in prompts])
    backend.init_forward_metadata(fb)
    qpos = [p - CHUNK + j for p in prompts for j in range(CHUNK)]
    for li in range(LAYERS):
        backend.forward_extend(fr.query(gen, len(qpos)), None, None, cuda_layer(li), fb, save_kv_cache=False,
                               topk_indices=fr.causal_topk(gen, qpos))


def _eager_step(backend, runner, rows, seq, gen):
    r2t = runner.req_to_token_pool.req_to_token
    fb = cuda_batch("DECODE", rows, seq, torch.stack([r2t[r, s - 1] for r, s in zip(rows, seq)]).long())
    backend.init_forward_metadata(fb)
    for li in range(LAYERS):
        topk = fr.causal_topk(gen, [s - 1 for s in seq])
        q = fr.query(gen, len(rows))
        out = backend.forward_decode(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
        want, st = reference(runner, li, q, torch.tensor(rows), topk, fp8=backend.dsa_decode_impl == "flashmla_kv",
                             stats=True)
        assert float((out.float().reshape(want.shape) - want).abs().max()) <= split_bound(want, st)


class CapturedStep:
    """SGLang's decode graph runner, reduced to what the attention backend sees: static input
    buffers of BS rows, the capture batch over them, one step of every layer (the indexer's
    hand-off, then attention) captured once and replayed with new contents."""

    layers = LAYERS
    view_extra: dict = {}          # fields SGLang's padded view carries for a subclass's backend (TBO's)

    def __init__(self, backend, runner, bs: int = BS):
        self.backend, self.runner, self.bs = backend, runner, bs
        self.req_pool_indices = torch.zeros(bs, dtype=torch.int64)
        self.seq_lens = torch.ones(bs, dtype=torch.int64)          # SGLang's fill value for padding rows
        self.out_cache_loc = torch.zeros(bs, dtype=torch.int64)
        self.q = [torch.zeros(bs, fr.HEADS * fr.KV_DIM, dtype=fr.DTYPE) for _ in range(self.layers)]
        self.topk = [torch.full((bs, fr.TOPK), -1, dtype=torch.int32) for _ in range(self.layers)]
        fb = cuda_batch("DECODE", [0] * bs, [1] * bs, torch.zeros(bs, dtype=torch.int64))
        fb.req_pool_indices, fb.seq_lens, fb.out_cache_loc = self.req_pool_indices, self.seq_lens, self.out_cache_loc
        fb.seq_lens_cpu = self.seq_lens
        self.fb = fb
        self.outs: list[torch.Tensor] = []

    def forward(self) -> list[torch.Tensor]:
        outs = []
        for li in range(LAYERS):
            topk = _around_indexer_forward_cuda(lambda *a, _t=self.topk[li]: _t, None, None, None, None, self.fb, li)
            outs.append(self.backend.forward_decode(self.q[li], None, None, cuda_layer(li), self.fb,
                                                    save_kv_cache=False, topk_indices=topk))
        return outs

    def capture(self, graph: Graph, init_state: bool = True) -> None:
        b = self.backend
        if init_state:                                  # once per runner, at the largest size
            b.init_cuda_graph_state(self.bs, self.bs)
        b.init_forward_metadata_out_graph(self.fb, in_capture=True)
        for _ in range(2):                              # SGLang's two warm-up runs (eager, padding rows only)
            self.forward()
            b.on_after_cuda_graph_warmup()
        self.outs = graph.capture(self.forward)

    def load(self, rows, seq, gen):
        """SGLang's load_batch: the real rows first, the padded tail reset to 0 (fill value for seq_lens)."""
        n, r2t, BS = len(rows), self.runner.req_to_token_pool.req_to_token, self.bs  # noqa: N806
        self.req_pool_indices.zero_()
        self.out_cache_loc.zero_()
        self.seq_lens.fill_(1)
        self.req_pool_indices[:n] = torch.tensor(rows)
        self.seq_lens[:n] = torch.tensor(seq)
        self.out_cache_loc[:n] = torch.stack([r2t[r, s - 1] for r, s in zip(rows, seq)]).long()
        for li in range(self.layers):
            self.q[li].copy_(fr.query(gen, BS))
            self.topk[li].fill_(-1)
            self.topk[li][:n] = fr.causal_topk(gen, [s - 1 for s in seq])
        view = SimpleNamespace(batch_size=BS, num_padding=BS - n, forward_mode=self.fb.forward_mode,
                               actual_forward_mode=self.fb.forward_mode, req_pool_indices=self.req_pool_indices,
                               seq_lens=self.seq_lens, seq_lens_cpu=self.seq_lens, out_cache_loc=self.out_cache_loc,
                               spec_info=None, seq_lens_sum=int(self.seq_lens.sum()), **self.view_extra)
        self.replay_prep(view)

    def replay_prep(self, view) -> None:
        self.backend.init_forward_metadata_out_graph(view)      # SGLang's replay-side prep, then ESS's hook

    def check(self, rows) -> None:
        n, BS = len(rows), self.bs  # noqa: N806
        for li in range(LAYERS):
            out = self.outs[li].float().reshape(BS, fr.HEADS, fr.KV_LORA)
            want, st = reference(self.runner, li, self.q[li][:n], torch.tensor(rows), self.topk[li][:n],
                                 fp8=self.backend.dsa_decode_impl == "flashmla_kv", stats=True)
            err = float((out[:n] - want).abs().max())
            assert err <= split_bound(want, st), f"layer {li}, rows {rows}: {err:.3g} from the reference over the true rows"
            assert not out[n:].any(), f"layer {li}: padding rows' outputs are not zero"


def test_gpu_fake_a_captured_decode_step_replays_exactly_as_requests_come_and_go(graph_fake):
    backend, runner, rt = graph_fake
    gen = torch.Generator().manual_seed(31)
    prompts = {1: 150, 2: 90, 3: 120}
    _start(backend, runner, [1, 2, 3], list(prompts.values()), gen)
    seq = {r: p + 1 for r, p in prompts.items()}
    _eager_step(backend, runner, [1, 2, 3], [seq[r] for r in (1, 2, 3)], gen)
    ess = backend.ess

    def plans():
        return ess.plans_early + ess.plans_late, ess.store.engine.tiers.data["immediate"]["plans"]
    plans_before = plans()
    # two captured sizes, as SGLang captures several (largest first); each replays the batches it fits
    big, small = CapturedStep(backend, runner, 4), CapturedStep(backend, runner, 2)
    graphs = {id(big): Graph(rt), id(small): Graph(rt)}
    big.capture(graphs[id(big)])
    small.capture(graphs[id(small)], init_state=False)

    counters = backend.ess.store.counters

    def looked_up():
        return (counters.layer_hits + counters.layer_misses).clone()

    def replay(rows):
        for r in rows:
            seq[r] += 1
        step = small if len(rows) <= small.bs else big
        step.load(rows, [seq[r] for r in rows], gen)
        before = looked_up()
        graphs[id(step)].replay()                        # side streams have run nothing since the last step
        step.check(rows)
        # the replay counted each real row's top-k entries once per layer (device counters), padding nothing
        want = torch.stack([(step.topk[li][:len(rows)] >= 0).sum() for li in range(LAYERS)])
        assert torch.equal(looked_up() - before, want), (looked_up() - before, want)
        rt.progress(3)                                   # ...and now run some of it, out of order
    replay([1, 2, 3])
    replay([1, 2, 3])
    backend.ess.close_rows([2])                          # request 2 finished: one padding row more
    replay([1, 3])
    # a new request in row 2 (the finished one's row), on other host rows, then in another order
    _start(backend, runner, [2], [70], gen, first_loc=fr.PAGE + 2048)
    seq[2] = 71
    replay([3, 2, 1])
    _eager_step(backend, runner, [1, 2, 3], [seq[r] + 1 for r in (1, 2, 3)], gen)   # a step the graph does not hold
    for r in (1, 2, 3):
        seq[r] += 1
    replay([2, 3])
    usage = backend.ess.path_usage()
    assert usage["graph_captures"] == 2 and usage["graph_replays"] == 5 and usage["graph_rows"] == 3 + 3 + 2 + 3 + 2
    # host counters: one plan per layer per step that ran - 2 warm-ups x 2 sizes, 5 replays (counted by the
    # replay hook: no Python of ours ran), 1 eager step; the captures' own runs moved no device and are not counted
    # (dba: one plan per half batch, every batch here has two rows or more)
    ran = (2 * 2 + 5 + 1) * LAYERS * (2 if ess.mode(0) == "dba" else 1)
    assert plans() == (plans_before[0] + ran, plans_before[1] + ran), (plans(), plans_before, ran)


def test_gpu_fake_the_eager_decode_path_is_not_graph_safe(graph_fake):
    """Why decode graphs need --ess-cuda-graph (the launcher refuses a decode graph flag without it):
    the eager step decides its real rows on the host once per batch, so a capture of it freezes the
    warm-up run's answer (padding only) and every replay serves nobody."""
    backend, runner, rt = graph_fake
    gen = torch.Generator().manual_seed(32)
    _start(backend, runner, [1, 2], [100, 80], gen)
    step = CapturedStep(backend, runner)
    backend.init_cuda_graph_state(BS, BS)            # no init_forward_metadata_out_graph(in_capture=True)
    step.forward()
    backend.on_after_cuda_graph_warmup()
    graph = Graph(rt)
    step.outs = graph.capture(step.forward)
    step.load([1, 2], [101, 81], gen)
    graph.replay()
    with pytest.raises(AssertionError, match="from the reference"):
        step.check([1, 2])


def test_the_static_flashtrans_stand_in_equals_the_reference():
    """copy_rows_static (the GPU fake's FlashTrans with static shapes) against copy_rows_torch."""
    gen = torch.Generator().manual_seed(5)
    for trial in range(20):
        src = torch.randint(0, 256, (40, 24), dtype=torch.uint8, generator=gen)
        dst = torch.randint(0, 256, (30, 24), dtype=torch.uint8, generator=gen)
        m = 16
        dst_idx = torch.randperm(30, generator=gen)[:m]               # distinct destinations, row 0 included
        src_idx = torch.randint(0, 40, (m,), generator=gen)
        skip = torch.rand(m, generator=gen) < 0.4
        src_idx = torch.where(skip & (torch.rand(m, generator=gen) < 0.5), -1, src_idx)
        dst_idx = torch.where(skip & (src_idx >= 0), -1, dst_idx)
        want, got = dst.clone(), dst.clone()
        flashtrans.copy_rows_torch(src, src_idx, want, dst_idx)
        copy_rows_static(src, src_idx, got, dst_idx)
        assert torch.equal(got, want), trial


def test_gpu_fake_graph_replays_leave_the_store_as_eager_steps_do(graph_fakes):
    """The same requests and steps through two stores, one replaying a captured step and one running
    every step eagerly: the same outputs, and afterwards the same LRU state, hot-slot bytes and
    counters - a replay does all of a step's bookkeeping that lives on the device."""
    make = graph_fakes
    (gb, grun, grt), (eb, erun, _) = make(), make()
    gens = {id(gb): torch.Generator().manual_seed(41), id(eb): torch.Generator().manual_seed(41)}
    prompts = {1: 130, 2: 95, 3: 60}
    for b, run in ((gb, grun), (eb, erun)):
        make.use(b)
        _start(b, run, [1, 2, 3], list(prompts.values()), gens[id(b)])
    make.use(gb)
    step = CapturedStep(gb, grun)
    graph = Graph(grt)
    step.capture(graph)
    seq = {r: p for r, p in prompts.items()}
    r2t = erun.req_to_token_pool.req_to_token
    for n, rows in enumerate(([1, 2, 3], [3, 1], [2, 3, 1], [1])):
        for r in rows:
            seq[r] += 1
        make.use(gb)
        step.load(rows, [seq[r] for r in rows], gens[id(gb)])
        graph.replay()
        make.use(eb)
        fb = cuda_batch("DECODE", rows, [seq[r] for r in rows],
                        torch.stack([r2t[r, seq[r] - 1] for r in rows]).long())
        eb.init_forward_metadata(fb)
        k = len(rows)
        for li in range(LAYERS):
            out = eb.forward_decode(step.q[li][:k].clone(), None, None, cuda_layer(li), fb, save_kv_cache=False,
                                    topk_indices=step.topk[li][:k].clone())
            assert torch.equal(out.reshape(k, -1), step.outs[li].reshape(BS, -1)[:k]), (n, li)
    eb.ess.store.engine.drain()
    eb.ess.store.engine.rt.finish()
    gb.ess.store.engine.drain()
    grt.finish()
    sg, se = gb.ess.store, eb.ess.store
    assert torch.equal(sg.hot.slot_to_token, se.hot.slot_to_token)
    assert torch.equal(sg.hot.lru_order, se.hot.lru_order)
    assert torch.equal(sg.slots.rows[:sg.slots.ring_base], se.slots.rows[:se.slots.ring_base])
    assert torch.equal(sg.counters.step_counts, se.counters.step_counts)
    assert torch.equal(sg.counters.hits, se.counters.hits) and torch.equal(sg.counters.misses, se.counters.misses)
    assert int(sg.counters.layer_misses.sum()) > 0 and int(sg.counters.layer_hits.sum()) > 0


def test_gpu_fake_without_ordering_eager_work_before_a_replay_it_reads_wrong_rows(graph_fake):
    """Why the replay hook joins the side streams before every replay: a request prefilled between two
    replays has its warm rows still queued on a side stream, and the graph reads its hot buffer first."""
    backend, runner, rt = graph_fake
    gen = torch.Generator().manual_seed(33)
    _start(backend, runner, [1, 2], [110, 90], gen)
    step = CapturedStep(backend, runner)
    graph = Graph(rt)
    step.capture(graph)
    step.load([1, 2], [111, 91], gen)
    graph.replay()
    step.check([1, 2])
    backend.ess.close_rows([2])
    _start(backend, runner, [2], [70], gen, first_loc=fr.PAGE + 2048)
    backend.ess.store.graph_boundary = lambda: None      # the hook orders nothing now
    step.load([1, 2], [112, 71], gen)
    graph.replay()
    with pytest.raises(AssertionError, match="from the reference"):
        step.check([1, 2])
