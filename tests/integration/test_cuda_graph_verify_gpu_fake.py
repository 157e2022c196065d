"""GPU fake (issue 35 item 3): an EAGLE/MTP TARGET_VERIFY step of the ESS CUDA backend captured in a CUDA
graph and replayed, through SGLang's own graph hooks on the backend (``init_cuda_graph_state``,
``init_forward_metadata_out_graph`` before the capture and before each replay, ``on_after_cuda_graph_warmup``),
on the H200 default (FP8 656-byte rows, flashmla_kv: SGLang's decode kernel over the store's slot table).

The step is captured through the backend's ``forward_extend`` (as SGLang's model runs it), which for a
capture batch (one handed to ``init_forward_metadata_out_graph`` with ``in_capture=True``) dispatches to
``cuda_graph.graph_verify`` (``StoreForward._extend_graph``): the store's union over the whole padded batch,
padding requests -1 found on the device, committed lengths read from the device. The graph is tests/graph_double.py's
(ops recorded once, replayed on the same tensors, no Python of ours at replay; a capture refuses host reads,
data-dependent shapes, host values copied in, and side-stream work it did not fork and join: CaptureStreams).

The eager twin is a second backend on its own pools and store, fed the same requests, window rows, queries
and top-k, running SGLang's eager TARGET_VERIFY (``forward_extend``): every replay's outputs over the real
tokens equal the eager step's bit for bit, and afterwards both stores hold the same LRU state, hot-slot bytes,
admission frontier and counters. Requests change between replays as SGLang's do: fewer requests (padding
rows), different accept lengths, rows in another order. Two hot-buffer sizes: the union of the draft tokens'
top-k sets fits the hot buffer, or overflows it (overflow rows through the MTP scratch rows).

The negative control: a batch the backend was not told is a capture batch takes the eager verify, which the
capture refuses (it reads the committed lengths on the host). Checked on CPU with the graph double only; no
TARGET_VERIFY step of ESS has been captured on a GPU.
"""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.cuda_backend import backend_class  # noqa: E402
from sgl_ess.kernels import flashtrans  # noqa: E402
from sgl_ess.prefetch.stream_engine import StreamEngine  # noqa: E402
from tests.graph_double import CaptureStreams, Graph, GraphCaptureError  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import copy_rows_static, cuda_batch, cuda_layer, cuda_runner, install_gpu_fakes  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401

LAYERS, CHUNK, NDRAFT, BS = 2, 16, 4, 4


@pytest.fixture(params=[48, 12], ids=["union-fits", "union-overflows"])
def mtp_fakes(request, ess_env, monkeypatch):
    """make() -> (backend, runner, streams): a CUDA backend class (EAGLE target, NDRAFT draft tokens) on its
    own FP8 pools and store, with the stream engine on CaptureStreams."""
    from sglang.srt.runtime_context import get_parallel

    ess_env(hot_slots_per_request=request.param, cuda_graph=True, prefetch_overlap_level="none")
    _, ov = install_gpu_fakes(monkeypatch, decode_impl="flashmla_kv", prefill_impl="flashmla_auto",
                              speculative_algorithm="EAGLE", speculative_num_draft_tokens=NDRAFT,
                              speculative_eagle_topk=1, speculative_num_steps=NDRAFT - 1)
    monkeypatch.setattr(flashtrans, "copy_rows_torch", copy_rows_static)   # FlashTrans with static shapes

    def make():
        req_pool, alloc = fr.shared_pools()
        runner = cuda_runner(req_pool, alloc, LAYERS, fp8_pool=True)
        backend = backend_class()(runner)
        store = backend.ess.store
        rt = CaptureStreams(seed=5)
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=rt, zero_backend="torch")
        store.resolver_backend = "torch"
        backend.ess.validate = False                     # as on CUDA (the fake's device is the CPU)
        return backend, runner, rt
    with get_parallel().override(attn_dcp_rank=0):
        yield make
    ov.restore()


def _write(runner, layers, locs, gen):
    """Latent rows through the pool's writer (SGLang's FP8 quantizer)."""
    pool = runner.token_to_kv_pool
    for li in layers:
        x = torch.randn(locs.numel(), fr.KV_DIM, generator=gen) * torch.rand(locs.numel(), 1, generator=gen) * 4
        pool.set_mla_kv_buffer(cuda_layer(li), locs, x[:, :fr.KV_LORA].to(torch.bfloat16),
                               x[:, fr.KV_LORA:].to(torch.bfloat16))


def _prefill(backend, runner, rows, prompts, gen):
    """Rows placed and written, the last CHUNK tokens prefilled (eager): opens and warms the hot buffers."""
    r2t = runner.req_to_token_pool.req_to_token
    fr.place_requests(runner.req_to_token_pool, rows, [p + 64 for p in prompts])
    _write(runner, range(LAYERS), torch.cat([r2t[r, :p] for r, p in zip(rows, prompts)]).long(), gen)
    fb = cuda_batch("EXTEND", rows, prompts, torch.cat([r2t[r, p - CHUNK:p] for r, p in zip(rows, prompts)]),
                    extend_lens=[CHUNK] * len(rows), prefix_lens=[p - CHUNK for p in prompts])
    backend.init_forward_metadata(fb)
    qpos = [p - CHUNK + j for p in prompts for j in range(CHUNK)]
    for li in range(LAYERS):
        backend.forward_extend(fr.query(gen, len(qpos)), None, None, cuda_layer(li), fb, save_kv_cache=False,
                               topk_indices=fr.causal_topk(gen, qpos))


def _verify_batch(rows, committed, loc):
    fb = cuda_batch("TARGET_VERIFY", rows, committed, loc)
    fb.spec_info = SimpleNamespace(draft_token_num=NDRAFT)
    return fb


class CapturedVerify:
    """SGLang's decode graph runner in capture mode TARGET_VERIFY, reduced to what the attention backend
    sees: static buffers of BS requests x NDRAFT tokens, the capture batch over them, one verify step of
    every layer (the layer's fence, then attention) captured once and replayed with new contents."""

    layers = LAYERS
    view_extra: dict = {}          # fields SGLang's padded view carries for a subclass's backend (TBO's)

    @staticmethod
    def batch(rows, committed, loc):
        return _verify_batch(rows, committed, loc)

    def __init__(self, backend, runner):
        self.backend, self.runner = backend, runner
        t = BS * NDRAFT
        self.req_pool_indices = torch.zeros(BS, dtype=torch.int64)
        self.seq_lens = torch.ones(BS, dtype=torch.int64)             # SGLang's fill value for padding rows
        self.out_cache_loc = torch.zeros(t, dtype=torch.int64)
        self.q = [torch.zeros(t, fr.HEADS * fr.KV_DIM, dtype=fr.DTYPE) for _ in range(self.layers)]
        self.topk = [torch.full((t, fr.TOPK), -1, dtype=torch.int32) for _ in range(self.layers)]
        fb = self.batch([0] * BS, [1] * BS, torch.zeros(t, dtype=torch.int64))
        fb.req_pool_indices, fb.seq_lens, fb.out_cache_loc = self.req_pool_indices, self.seq_lens, self.out_cache_loc
        fb.seq_lens_cpu = self.seq_lens
        self.fb = fb
        self.outs: list[torch.Tensor] = []

    def forward(self) -> list[torch.Tensor]:
        """The model's attention calls of one TARGET_VERIFY step: the backend's forward_extend per layer."""
        return [self.backend.forward_extend(self.q[li], None, None, cuda_layer(li), self.fb, save_kv_cache=False,
                                            topk_indices=self.topk[li]) for li in range(LAYERS)]

    def capture(self, graph: Graph, in_capture: bool = True) -> None:
        """SGLang's capture of one size. `in_capture` False: the batch's metadata prepared as for an eager
        batch (SGLang's init_forward_metadata), so the backend is never told it is a capture batch."""
        b = self.backend
        b.init_cuda_graph_state(BS, BS * NDRAFT)
        if in_capture:
            b.init_forward_metadata_out_graph(self.fb, in_capture=True)
        else:
            b.init_forward_metadata(self.fb)
        for _ in range(2):                           # SGLang's two warm-up runs (eager, padding rows only)
            self.forward()
            b.on_after_cuda_graph_warmup()
        self.outs = graph.capture(self.forward)

    def load(self, rows, committed, q, topk, gen):
        """SGLang's load_batch: the real requests first, the padded tail reset (0; seq_lens 1). The padding
        tokens' queries and top-k hold junk (SGLang's indexer runs over them too)."""
        n, t, r2t = len(rows), len(rows) * NDRAFT, self.runner.req_to_token_pool.req_to_token
        self.req_pool_indices.zero_()
        self.out_cache_loc.zero_()
        self.seq_lens.fill_(1)
        self.req_pool_indices[:n] = torch.tensor(rows)
        self.seq_lens[:n] = torch.tensor(committed)
        self.out_cache_loc[:t] = torch.cat([r2t[r, c:c + NDRAFT] for r, c in zip(rows, committed)]).long()
        for li in range(self.layers):
            self.q[li].copy_(fr.query(gen, BS * NDRAFT))
            self.q[li][:t] = q[li]
            self.topk[li].copy_(torch.randint(0, 40, self.topk[li].shape, generator=gen, dtype=torch.int32))
            self.topk[li][:t] = topk[li]
        view = SimpleNamespace(batch_size=BS, num_padding=BS - n, forward_mode=self.fb.forward_mode,
                               actual_forward_mode=self.fb.forward_mode, req_pool_indices=self.req_pool_indices,
                               seq_lens=self.seq_lens, seq_lens_cpu=self.seq_lens, out_cache_loc=self.out_cache_loc,
                               spec_info=self.fb.spec_info, seq_lens_sum=int(self.seq_lens.sum()), **self.view_extra)
        self.backend.init_forward_metadata_out_graph(view)      # SGLang's replay-side prep, then ESS's hook


def _state(backend):
    s, ess = backend.ess.store, backend.ess
    ess.store.engine.drain()
    ess.store.engine.rt.finish()
    return {"slot_to_token": s.hot.slot_to_token.clone(), "lru_order": s.hot.lru_order.clone(),
            "slot_rows": s.slots.rows.clone(),     # hot slots, rings, MTP scratch "hits": s.counters.hits.clone(),
            "misses": s.counters.misses.clone(), "step_counts": s.counters.step_counts.clone(),
            "rows_h2d": s.counters.rows_h2d.clone(), "frontier": ess._mtp_rows.frontier.clone(),
            "admitted": ess._mtp_rows.rows_admitted, "window": int(ess.mtp_window_entries),
            "overflow": int(ess.mtp_overflow_entries)}


def test_gpu_fake_a_captured_mtp_verify_step_replays_as_its_eager_twin_bit_for_bit(mtp_fakes):
    make = mtp_fakes
    (gb, grun, grt), (eb, erun, ert) = make(), make()
    rows, prompts = [1, 7, 3], [150, 90, 200]         # row 7: the last request row (a padding row's -1 wraps to it)
    for b, run in ((gb, grun), (eb, erun)):            # the same requests and bytes in both
        _prefill(b, run, rows, prompts, torch.Generator().manual_seed(51))
    step = CapturedVerify(gb, grun)
    graph = Graph(grt)
    step.capture(graph)
    hot = gb.ess.store_cfg.hot_slots_per_request
    gen = torch.Generator().manual_seed(52)
    committed = dict(zip(rows, prompts))
    r2t = erun.req_to_token_pool.req_to_token
    schedule = [([1, 7, 3], [1, 4, 2]), ([3, 1], [4, 1]), ([7, 3, 1], [3, 3, 4]), ([7], [2]), ([1, 3, 7], [1, 2, 1])]
    for it, (batch, accept) in enumerate(schedule):
        com = [committed[r] for r in batch]
        win = torch.cat([r2t[r, c:c + NDRAFT] for r, c in zip(batch, com)]).long()
        wseed = 1000 + it
        for run in (grun, erun):                       # the window's rows written (new bytes every iteration)
            _write(run, range(LAYERS), win, torch.Generator().manual_seed(wseed))
        qpos = [c + j for c in com for j in range(NDRAFT)]
        q = [fr.query(gen, len(qpos)) for _ in range(LAYERS)]
        topk = [fr.causal_topk(gen, qpos) for _ in range(LAYERS)]
        step.load(batch, com, q, topk, gen)
        graph.replay()
        fb = _verify_batch(batch, com, win)
        eb.init_forward_metadata(fb)
        t = len(batch) * NDRAFT
        for li in range(LAYERS):
            want = eb.forward_extend(q[li].clone(), None, None, cuda_layer(li), fb, save_kv_cache=False,
                                     topk_indices=topk[li].clone())
            got = step.outs[li].reshape(BS * NDRAFT, -1)
            assert torch.equal(got[:t], want.reshape(t, -1)), (it, li)
            assert not got[t:].any(), f"iteration {it}, layer {li}: the padding tokens' outputs are not zero"
        for r, a in zip(batch, accept):
            committed[r] += a
        grt.progress(3)                                # side streams run some of it, out of order
        ert.progress(3)
    g, e = _state(gb), _state(eb)
    for key in g:
        assert (torch.equal(g[key], e[key]) if isinstance(g[key], torch.Tensor) else g[key] == e[key]), key
    assert g["window"] > 0 and g["admitted"] > 0 and int(g["misses"].sum()) > 0
    assert (g["overflow"] > 0) == (hot < NDRAFT * fr.TOPK)
    # host counts: the replay hook counts what no Python ran (MTP steps per layer; the warm-ups ran eagerly)
    gu, eu = gb.ess.path_usage(), eb.ess.path_usage()
    assert gu["graph_captures"] == 1 and gu["graph_replays"] == len(schedule)
    assert gu["graph_rows"] == sum(len(b) for b, _ in schedule)
    assert eu["mtp_steps"] == len(schedule) * LAYERS
    assert gu["mtp_steps"] == (2 + len(schedule)) * LAYERS, gu
    assert gb.ess.store.resolver_calls == eb.ess.store.resolver_calls + 2 * LAYERS   # + the warm-ups' plans


def test_gpu_fake_a_replay_counts_the_verify_windows_host_writes(mtp_fakes):
    """SGLang's writer stores NDRAFT latent rows per real request and layer inside the graph: the replay
    hook counts them (n_real x NDRAFT per layer), as the eager path counts each forward's writes."""
    backend, runner, rt = mtp_fakes()
    _prefill(backend, runner, [1, 2], [120, 80], torch.Generator().manual_seed(53))
    step = CapturedVerify(backend, runner)
    step.capture(Graph(rt))
    gen = torch.Generator().manual_seed(54)
    counters = backend.ess.store.counters
    before = counters.snapshot()["bytes_d2h"]
    qpos = [c + j for c in (120, 80) for j in range(NDRAFT)]
    step.load([1, 2], [120, 80], [fr.query(gen, len(qpos)) for _ in range(LAYERS)],
              [fr.causal_topk(gen, qpos) for _ in range(LAYERS)], gen)
    after = counters.snapshot()["bytes_d2h"]
    assert after - before == 2 * NDRAFT * LAYERS * backend.ess.row_bytes, (before, after)


def test_gpu_fake_a_verify_batch_not_announced_as_a_capture_batch_is_refused_by_the_capture(mtp_fakes):
    """The negative control of the dispatch: the same forward_extend calls on a batch the backend was not told
    is a capture batch (no init_forward_metadata_out_graph(in_capture=True)) take the eager verify, which reads
    the committed lengths on the host and copies host data into the step: a capture refuses it."""
    backend, runner, rt = mtp_fakes()
    _prefill(backend, runner, [1, 2], [100, 70], torch.Generator().manual_seed(55))
    step = CapturedVerify(backend, runner)
    with pytest.raises(GraphCaptureError, match="host value|host read"):
        step.capture(Graph(rt), in_capture=False)


def test_gpu_fake_a_replay_whose_window_locations_are_out_of_step_asserts_on_the_device(mtp_fakes):
    """The captured step checks, on the device (no host read), that the locations SGLang writes are those of
    each request's window positions; padding requests are not checked. Here one request's locations are
    shifted by one: the replay's device-side assertion fires (on CPU, at once)."""
    backend, runner, rt = mtp_fakes()
    _prefill(backend, runner, [1, 2], [120, 80], torch.Generator().manual_seed(56))
    step = CapturedVerify(backend, runner)
    graph = Graph(rt)
    step.capture(graph)
    gen = torch.Generator().manual_seed(57)
    qpos = [c + j for c in (120, 80) for j in range(NDRAFT)]
    q, topk = [fr.query(gen, len(qpos)) for _ in range(LAYERS)], [fr.causal_topk(gen, qpos) for _ in range(LAYERS)]
    step.load([1, 2], [120, 80], q, topk, gen)
    graph.replay()                                       # in step: no assertion
    step.load([1, 2], [120, 80], q, topk, gen)
    step.out_cache_loc[NDRAFT:2 * NDRAFT] += 1           # request 2's window one location off
    with pytest.raises(RuntimeError, match="out of step"):
        graph.replay()
