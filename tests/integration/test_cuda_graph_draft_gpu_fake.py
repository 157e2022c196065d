"""GPU fake (issue 35 item 3): the EAGLE draft decode steps of the ESS CUDA backend captured in ONE CUDA graph
(as SGLang's draft graph runner captures the whole multi-step draft forward) and replayed, through SGLang's own
hooks on the multi-step draft backend (``init_cuda_graph_state``, ``init_forward_metadata_out_graph`` before the
capture and before each replay, ``on_after_cuda_graph_warmup``) and each step's ``forward_decode``. The
container is ESS's subclass of SGLang's ``DeepseekSparseAttnMultiStepBackend`` (cuda_multistep.py, installed by
REPLACE; here built directly, its step backends ESS's CUDA class as the REPLACE of the DSA class makes them): it
registers the capture batch with every step, so each step's forward_decode goes to ``cuda_graph.graph_draft``
(the store's committed-rows decode over the whole padded batch, padding rows -1 found on the device, the step's
own speculative row neither read nor admitted), and calls the store's warm-up and replay hooks once.

The graph is tests/graph_double.py's (ops recorded once, replayed on the same tensors, no Python of ours at
replay; a capture refuses host reads, data-dependent shapes, host values copied in, and side-stream work it did
not fork and join: CaptureStreams).

The eager twin is a second draft runner on its own pools and store, fed the same requests, rows, queries and
top-k, running each step eagerly (``forward_decode``): every replay's outputs over the real rows equal the eager
steps' bit for bit, and afterwards both stores hold the same LRU state, slot-space bytes, admission frontier and
counters. Requests change between replays as SGLang's do: fewer requests (padding rows), accept lengths, order.

Negative controls: with SGLang's own container (not ESS's) the capture is refused with a clear error (the steps
never see the batch they run with), and a capture whose batch is not registered freezes the warm-up's answer
(the eager step). Checked on CPU with the graph double only; no draft step of ESS has been captured on a GPU.
"""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.attention.overlap import split_halves  # noqa: E402
from sgl_ess.integration.sglang.backends.cuda_backend import backend_class  # noqa: E402
from sgl_ess.integration.sglang.backends.cuda_multistep import multistep_class  # noqa: E402
from sgl_ess.kernels import flashtrans  # noqa: E402
from sgl_ess.prefetch.stream_engine import StreamEngine  # noqa: E402
from tests.graph_double import CaptureStreams, Graph  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import copy_rows_static, cuda_batch, cuda_layer, cuda_runner, install_gpu_fakes  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401

CHUNK, NDRAFT, STEPS, BS = 16, 4, 3, 4       # STEPS - 1 draft decode forwards per iteration


@pytest.fixture(params=[("flashmla_sparse", "da"), ("flashmla_kv", "dba"), ("flashmla_sparse", "none")],
                ids=["flashmla_sparse-da", "flashmla_kv-dba", "flashmla_sparse-none"])
def draft_fakes(request, ess_env, monkeypatch):
    """make(container=None) -> (extend backend, multi-step container, runner, streams): EAGLE's draft runner (one
    layer) with the CUDA class's draft-extend backend and the multi-step draft container (ESS's unless
    `container` names another class) whose per-step decode backends are ESS's CUDA class, its store on
    CaptureStreams. flashmla_kv: FP8 656-byte rows."""
    from sglang.srt.layers.attention import dsa_backend
    from sglang.srt.runtime_context import get_parallel

    impl, level = request.param
    ess_env(hot_slots_per_request=24, cuda_graph=True, prefetch_overlap_level=level)
    _, ov = install_gpu_fakes(monkeypatch, decode_impl=impl, prefill_impl="flashmla_auto",
                              speculative_algorithm="EAGLE", speculative_num_draft_tokens=NDRAFT,
                              speculative_eagle_topk=1, speculative_num_steps=STEPS)
    monkeypatch.setattr(flashtrans, "copy_rows_torch", copy_rows_static)   # FlashTrans with static shapes
    cls = backend_class()
    sglangs = dsa_backend.DeepseekSparseAttnMultiStepBackend
    ours = multistep_class()
    monkeypatch.setattr(dsa_backend, "DeepseekSparseAttnBackend", cls)     # what cuda_backend's REPLACE does

    def make(container=None):
        req_pool, alloc = fr.shared_pools()
        draft = cuda_runner(req_pool, alloc, 1, fp8_pool=impl == "flashmla_kv")
        draft.is_draft_worker = True
        bd = cls(draft, skip_prefill=False)
        ms = (container or ours)(draft, topk=1, speculative_num_steps=STEPS)
        assert all(type(s) is cls for s in ms.attn_backends) and len(ms.attn_backends) == STEPS - 1
        store = bd.ess.store
        rt = CaptureStreams(seed=7)
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=rt, zero_backend="torch")
        store.resolver_backend = "torch"
        bd.ess.validate = False                          # as on CUDA (the fake's device is the CPU)
        return bd, ms, draft, rt
    make.sglangs = sglangs
    with get_parallel().override(attn_dcp_rank=0):
        yield make
    ov.restore()


def _write(runner, locs, gen):
    """Latent rows of the draft's layer through the pool's writer (FP8 pools: SGLang's quantizer)."""
    x = torch.randn(locs.numel(), fr.KV_DIM, generator=gen) * torch.rand(locs.numel(), 1, generator=gen) * 4
    runner.token_to_kv_pool.set_mla_kv_buffer(cuda_layer(0), locs, x[:, :fr.KV_LORA].to(torch.bfloat16),
                                              x[:, fr.KV_LORA:].to(torch.bfloat16))


def _prefill(bd, runner, rows, prompts, gen):
    r2t = runner.req_to_token_pool.req_to_token
    fr.place_requests(runner.req_to_token_pool, rows, [p + 64 for p in prompts])
    _write(runner, torch.cat([r2t[r, :p] for r, p in zip(rows, prompts)]).long(), gen)
    fb = cuda_batch("EXTEND", rows, prompts, torch.cat([r2t[r, p - CHUNK:p] for r, p in zip(rows, prompts)]),
                    extend_lens=[CHUNK] * len(rows), prefix_lens=[p - CHUNK for p in prompts])
    bd.init_forward_metadata(fb)
    qpos = [p - CHUNK + j for p in prompts for j in range(CHUNK)]
    bd.forward_extend(fr.query(gen, len(qpos)), None, None, cuda_layer(0), fb, save_kv_cache=False,
                      topk_indices=fr.causal_topk(gen, qpos))


def _batch(rows, seq, loc):
    fb = cuda_batch("DECODE", rows, seq, loc)
    fb.spec_info = SimpleNamespace(draft_token_num=NDRAFT)
    return fb


class CapturedDraft:
    """SGLang's draft graph runner, reduced to what the draft backends see: static buffers of BS rows (request
    rows, committed lengths, each step's write locations), one batch object the steps run with (SGLang's
    draft_forward swaps its out_cache_loc per step), the multi-step container's graph hooks, every draft step's
    forward_decode captured in one graph."""

    def __init__(self, ms, runner):
        self.ms, self.steps, self.runner = ms, ms.attn_backends, runner
        self.req_pool_indices = torch.zeros(BS, dtype=torch.int64)
        self.seq_lens = torch.ones(BS, dtype=torch.int64)             # SGLang's fill value for padding rows
        self.locs = torch.zeros(STEPS - 1, BS, dtype=torch.int64)
        self.q = [torch.zeros(BS, fr.HEADS * fr.KV_DIM, dtype=fr.DTYPE) for _ in self.steps]
        self.topk = [torch.full((BS, fr.TOPK), -1, dtype=torch.int32) for _ in self.steps]
        fb = _batch([0] * BS, [1] * BS, torch.zeros(BS, dtype=torch.int64))
        fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu = self.req_pool_indices, self.seq_lens, self.seq_lens
        fb.out_cache_loc = self.locs.reshape(-1)                      # SGLang's: every step's locations
        self.fb = fb
        self.outs: list[torch.Tensor] = []

    def forward(self) -> list[torch.Tensor]:
        """SGLang's run_once as the attention backends see it: the container's in-graph metadata hook, then
        draft_forward: per step, the batch's out_cache_loc set to the step's locations and the step backend's
        forward_decode."""
        self.ms.init_forward_metadata_in_graph(self.fb)
        outs = []
        for i, s in enumerate(self.steps):
            self.fb.out_cache_loc = self.locs[i]
            outs.append(s.forward_decode(self.q[i], None, None, cuda_layer(0), self.fb, save_kv_cache=False,
                                         topk_indices=self.topk[i]))
        self.fb.out_cache_loc = self.locs.reshape(-1)
        return outs

    def capture(self, graph: Graph, forward=None) -> None:
        """SGLang's capture of one size (eagle_draft_cuda_graph_runner: the container's hooks)."""
        self.ms.init_cuda_graph_state(BS, BS)
        self.ms.init_forward_metadata_out_graph(self.fb, in_capture=True)
        run = forward or self.forward
        warmup = getattr(self.ms, "on_after_cuda_graph_warmup", None)
        for _ in range(2):                               # SGLang's two warm-up runs (eager, padding rows only)
            run()
            if warmup is not None:
                warmup()
        self.outs = graph.capture(run)

    def load(self, rows, committed, q, topk, gen):
        """SGLang's replay: the real rows first, the padded tail reset (0; seq_lens 1), padding rows' queries and
        top-k junk; then the container's replay hook with SGLang's view (num_padding)."""
        n, r2t = len(rows), self.runner.req_to_token_pool.req_to_token
        self.req_pool_indices.zero_()
        self.seq_lens.fill_(1)
        self.locs.zero_()
        self.req_pool_indices[:n] = torch.tensor(rows)
        self.seq_lens[:n] = torch.tensor(committed)
        for i in range(STEPS - 1):
            self.locs[i, :n] = torch.stack([r2t[r, c + i] for r, c in zip(rows, committed)]).long()
            self.q[i].copy_(fr.query(gen, BS))
            self.q[i][:n] = q[i]
            self.topk[i].copy_(torch.randint(0, 40, self.topk[i].shape, generator=gen, dtype=torch.int32))
            self.topk[i][:n] = topk[i]
        view = SimpleNamespace(**vars(self.fb), num_padding=BS - n)
        view.seq_lens_sum = int(self.seq_lens.sum())
        self.ms.init_forward_metadata_out_graph(view)


def _state(ess):
    s = ess.store
    s.engine.drain()
    s.engine.rt.finish()
    return {"slot_to_token": s.hot.slot_to_token.clone(), "lru_order": s.hot.lru_order.clone(),
            "slot_rows": s.slots.rows.clone(), "hits": s.counters.hits.clone(), "misses": s.counters.misses.clone(),
            "step_counts": s.counters.step_counts.clone(), "rows_h2d": s.counters.rows_h2d.clone(),
            "frontier": ess._mtp_rows.frontier.clone(), "admitted": ess._mtp_rows.rows_admitted}


def test_gpu_fake_captured_eagle_draft_steps_replay_as_their_eager_twins_bit_for_bit(draft_fakes):
    make = draft_fakes
    (gbd, gms, grun, grt), (ebd, ems, erun, ert) = make(), make()
    esteps = ems.attn_backends
    rows, prompts = [1, 7, 3], [150, 90, 200]             # row 7: the last request row
    for bd, run in ((gbd, grun), (ebd, erun)):
        _prefill(bd, run, rows, prompts, torch.Generator().manual_seed(61))
    step = CapturedDraft(gms, grun)
    graph = Graph(grt)
    step.capture(graph)
    gen = torch.Generator().manual_seed(62)
    committed = dict(zip(rows, prompts))
    r2t = erun.req_to_token_pool.req_to_token
    schedule = [([1, 7, 3], [1, 4, 2]), ([3, 1], [4, 1]), ([7, 3, 1], [3, 3, 4]), ([7], [2]), ([1, 3, 7], [1, 2, 1])]
    for it, (batch, accept) in enumerate(schedule):
        com = [committed[r] for r in batch]
        n = len(batch)
        # the rows at and past the committed length are this iteration's (draft steps write c + i; the ones
        # accepted later become final unchanged): written now, committed rows never again
        locs = torch.cat([r2t[r, c:c + NDRAFT] for r, c in zip(batch, com)]).long()
        for run in (grun, erun):
            _write(run, locs, torch.Generator().manual_seed(2000 + it))
        q = [fr.query(gen, n) for _ in esteps]
        topk = [fr.causal_topk(gen, [c - 1 for c in com]) for _ in esteps]
        step.load(batch, com, q, topk, gen)
        graph.replay()
        for i, s in enumerate(esteps):
            fb = _batch(batch, com, torch.stack([r2t[r, c + i] for r, c in zip(batch, com)]).long())
            s.init_forward_metadata(fb)
            want = s.forward_decode(q[i].clone(), None, None, cuda_layer(0), fb, save_kv_cache=False,
                                    topk_indices=topk[i].clone())
            got = step.outs[i].reshape(BS, -1)
            assert torch.equal(got[:n], want.reshape(n, -1)), (it, i)
            assert not got[n:].any(), f"iteration {it}, step {i}: padding rows' outputs are not zero"
        for r, a in zip(batch, accept):
            committed[r] += a
        grt.progress(3)                                   # side streams run some of it, out of order
        ert.progress(3)
    g, e = _state(gbd.ess), _state(ebd.ess)
    for key in g:
        assert (torch.equal(g[key], e[key]) if isinstance(g[key], torch.Tensor) else g[key] == e[key]), key
    assert g["admitted"] > 0 and int(g["misses"].sum()) > 0 and int(g["hits"].sum()) > 0
    for r, c in committed.items():                        # nothing at or past `committed` became resident
        assert int(gbd.ess.store.hot.slot_to_token[0, r].max()) < c
    gu = gbd.ess.path_usage()
    assert gu["graph_captures"] == 1 and gu["graph_replays"] == len(schedule)
    assert gu["graph_rows"] == sum(len(b) for b, _ in schedule)
    # host counts: plans made inside attention per step (DBA: one per half batch; a graph's batch is BS rows),
    # counted by the replay hook for each replay, and by the two warm-ups, not the capture's own run
    def plans(rows):
        return len(split_halves(rows)) if gbd.ess.mode(0) == "dba" else 1
    assert gbd.ess.plans_late == (2 + len(schedule)) * (STEPS - 1) * plans(BS)
    assert ebd.ess.plans_late == sum(plans(len(b)) for b, _ in schedule) * (STEPS - 1)


def test_gpu_fake_a_replay_counts_the_draft_steps_host_writes(draft_fakes):
    """SGLang's writer stores one latent row per real request, layer and draft step inside the graph: the
    container's replay hook counts them (n_real x the captured steps), as the eager path counts each step's."""
    bd, ms, runner, rt = draft_fakes()
    gen = torch.Generator().manual_seed(64)
    _prefill(bd, runner, [1, 2], [120, 80], gen)
    step = CapturedDraft(ms, runner)
    step.capture(Graph(rt))
    counters = bd.ess.store.counters
    before = counters.snapshot()["bytes_d2h"]
    step.load([1, 2], [120, 80], [fr.query(gen, 2) for _ in ms.attn_backends],
              [fr.causal_topk(gen, [119, 79]) for _ in ms.attn_backends], gen)
    after = counters.snapshot()["bytes_d2h"]
    assert after - before == 2 * (STEPS - 1) * bd.ess.row_bytes, (before, after)


def test_gpu_fake_sglangs_own_draft_container_is_refused_at_capture(draft_fakes):
    """Why ESS replaces SGLang's multi-step container: SGLang's hands its steps a DECODE view at capture, not the
    batch they run with, and calls none of their hooks before a replay. A capture through it is refused at once,
    naming the fix, instead of capturing the eager step."""
    bd, ms, runner, rt = draft_fakes(container=draft_fakes.sglangs)
    assert type(ms) is draft_fakes.sglangs
    _prefill(bd, runner, [1, 2], [100, 70], torch.Generator().manual_seed(65))
    with pytest.raises(RuntimeError, match="SGLang's own DeepseekSparseAttnMultiStepBackend"):
        CapturedDraft(ms, runner).capture(Graph(rt))


def test_gpu_fake_without_the_containers_registration_the_captured_draft_serves_nobody(draft_fakes, monkeypatch):
    """The negative control of the dispatch: the same capture with the container's registration of the capture
    batch removed. Each step's forward_decode then takes the eager draft step, which decides its real rows on the
    host once per batch (padding.py), so the capture freezes the warm-up's answer (padding only) and every
    replay serves nobody."""
    from sgl_ess.integration.sglang.backends.cuda_graph import GraphBatches

    monkeypatch.setattr(GraphBatches, "add", lambda self, fb: None)
    bd, ms, runner, rt = draft_fakes()
    gen = torch.Generator().manual_seed(63)
    _prefill(bd, runner, [1, 2], [100, 70], gen)
    step = CapturedDraft(ms, runner)
    graph = Graph(rt)
    step.capture(graph)
    r2t = runner.req_to_token_pool.req_to_token
    _write(runner, torch.cat([r2t[r, c:c + NDRAFT] for r, c in ((1, 100), (2, 70))]).long(), gen)
    step.load([1, 2], [100, 70], [fr.query(gen, 2) for _ in ms.attn_backends],
              [fr.causal_topk(gen, [99, 69]) for _ in ms.attn_backends], gen)
    graph.replay()
    for out in step.outs:
        assert not out.any(), "the captured eager draft step served a request"
