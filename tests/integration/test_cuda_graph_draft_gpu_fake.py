"""GPU fake (issue 35 item 3): the EAGLE draft decode steps of the ESS CUDA backend captured in ONE CUDA graph
(as SGLang's draft graph runner captures the whole multi-step draft forward) and replayed, each step through
``cuda_graph.graph_draft``: the store's committed-rows decode over the whole padded batch, padding rows -1 found
on the device, the step's own speculative row neither read nor admitted.

The graph is tests/graph_double.py's (ops recorded once, replayed on the same tensors, no Python of ours at
replay; a capture refuses host reads, data-dependent shapes, host values copied in, and side-stream work it did
not fork and join: CaptureStreams). The store's graph hooks are called as a capture and a replay need them
(``graph_capture_batch`` before the warm-ups, ``graph_capture`` after each, ``graph_replay`` before each
replay), and SGLang's own DSA metadata prep of each step backend (its ``init_forward_metadata_out_graph``);
SGLang's multi-step container itself is not the caller (see the module's last paragraph).

The eager twin is a second draft runner on its own pools and store, fed the same requests, rows, queries and
top-k, running each step eagerly (``forward_decode``): every replay's outputs over the real rows equal the eager
steps' bit for bit, and afterwards both stores hold the same LRU state, slot-space bytes, admission frontier and
counters. Requests change between replays as SGLang's do: fewer requests (padding rows), accept lengths, order.

What is not wired yet: StoreForward.decode refuses a graph batch of a draft step, and SGLang's
DeepseekSparseAttnMultiStepBackend hands its children a DECODE view at capture (not the batch the steps run)
and calls none of their hooks before a replay, so the launcher keeps refusing MTP with --ess-cuda-graph.
"""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.attention.overlap import split_halves  # noqa: E402
from sgl_ess.integration.sglang.backends.cuda_backend import backend_class  # noqa: E402
from sgl_ess.integration.sglang.backends.cuda_graph import graph_draft  # noqa: E402
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
    """make() -> (extend backend, step backends, runner, streams): EAGLE's draft runner (one layer) with the
    CUDA class's draft-extend backend and its per-step decode backends (as SGLang's multi-step container
    builds them), its store on CaptureStreams. flashmla_kv: FP8 656-byte rows."""
    from sglang.srt.runtime_context import get_parallel

    impl, level = request.param
    ess_env(hot_slots_per_request=24, cuda_graph=True, prefetch_overlap_level=level)
    _, ov = install_gpu_fakes(monkeypatch, decode_impl=impl, prefill_impl="flashmla_auto",
                              speculative_algorithm="EAGLE", speculative_num_draft_tokens=NDRAFT,
                              speculative_eagle_topk=1, speculative_num_steps=STEPS)
    monkeypatch.setattr(flashtrans, "copy_rows_torch", copy_rows_static)   # FlashTrans with static shapes

    def make():
        req_pool, alloc = fr.shared_pools()
        draft = cuda_runner(req_pool, alloc, 1, fp8_pool=impl == "flashmla_kv")
        draft.is_draft_worker = True
        cls = backend_class()
        bd = cls(draft, skip_prefill=False)
        steps = [cls(draft, speculative_step_id=i, topk=1, speculative_num_steps=STEPS) for i in range(STEPS - 1)]
        store = bd.ess.store
        rt = CaptureStreams(seed=7)
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=rt, zero_backend="torch")
        store.resolver_backend = "torch"
        bd.ess.validate = False                          # as on CUDA (the fake's device is the CPU)
        return bd, steps, draft, rt
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
    """SGLang's draft graph runner, reduced to what the step backends see: static buffers of BS rows (request
    rows, committed lengths, each step's write locations), one batch object the steps run with (SGLang's
    draft_forward swaps its out_cache_loc per step), every draft step captured in one graph."""

    def __init__(self, steps, runner):
        self.steps, self.runner = steps, runner
        self.req_pool_indices = torch.zeros(BS, dtype=torch.int64)
        self.seq_lens = torch.ones(BS, dtype=torch.int64)             # SGLang's fill value for padding rows
        self.locs = torch.zeros(STEPS - 1, BS, dtype=torch.int64)
        self.q = [torch.zeros(BS, fr.HEADS * fr.KV_DIM, dtype=fr.DTYPE) for _ in steps]
        self.topk = [torch.full((BS, fr.TOPK), -1, dtype=torch.int32) for _ in steps]
        fb = _batch([0] * BS, [1] * BS, torch.zeros(BS, dtype=torch.int64))
        fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu = self.req_pool_indices, self.seq_lens, self.seq_lens
        self.fb = fb
        self.outs: list[torch.Tensor] = []

    @property
    def ess(self):
        return self.steps[0].ess

    def _metadata(self, fb, in_capture=False):
        """SGLang's own DSA metadata prep of every step backend (what its multi-step container runs)."""
        base = type(self.steps[0]).__mro__[1]
        for s in self.steps:
            base.init_forward_metadata_out_graph(s, fb, in_capture=in_capture)

    def forward(self) -> list[torch.Tensor]:
        outs = []
        for i, s in enumerate(self.steps):
            self.fb.out_cache_loc = self.locs[i]
            s.ess.fence_host(0)                          # as forward_decode fences the layer first
            outs.append(graph_draft(s._forward, self.q[i], cuda_layer(0), self.fb,
                                    s._pad_topk_indices(self.topk[i], BS)))
        return outs

    def capture(self, graph: Graph, forward=None) -> None:
        for s in self.steps:
            s.init_cuda_graph_state(BS, BS)
        self._metadata(self.fb, in_capture=True)
        self.ess.graph_capture_batch(BS)
        run = forward or self.forward
        for _ in range(2):                               # SGLang's two warm-up runs (eager, padding rows only)
            run()
            self.ess.graph_capture()
        self.outs = graph.capture(run)

    def load(self, rows, committed, q, topk, gen):
        """The real rows first, the padded tail reset (0; seq_lens 1); padding rows' queries and top-k junk."""
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
        view = SimpleNamespace(batch_size=BS, num_padding=BS - n, forward_mode=self.fb.forward_mode,
                               actual_forward_mode=self.fb.forward_mode, req_pool_indices=self.req_pool_indices,
                               seq_lens=self.seq_lens, seq_lens_cpu=self.seq_lens, out_cache_loc=self.locs[0],
                               spec_info=self.fb.spec_info, seq_lens_sum=int(self.seq_lens.sum()))
        self._metadata(view)
        self.ess.graph_replay(None, BS, n)


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
    (gbd, gsteps, grun, grt), (ebd, esteps, erun, ert) = make(), make()
    rows, prompts = [1, 7, 3], [150, 90, 200]             # row 7: the last request row
    for bd, run in ((gbd, grun), (ebd, erun)):
        _prefill(bd, run, rows, prompts, torch.Generator().manual_seed(61))
    step = CapturedDraft(gsteps, grun)
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


def test_gpu_fake_the_eager_draft_step_is_not_graph_safe(draft_fakes):
    """Why a draft graph needs graph_draft: the eager draft step (forward_decode) decides its real rows on the
    host once per batch (padding.py), so a capture freezes the warm-up's answer (padding only) and every
    replay serves nobody."""
    bd, steps, runner, rt = draft_fakes()
    gen = torch.Generator().manual_seed(63)
    _prefill(bd, runner, [1, 2], [100, 70], gen)
    step = CapturedDraft(steps, runner)

    def eager():
        outs = []
        for i, s in enumerate(steps):
            step.fb.out_cache_loc = step.locs[i]
            outs.append(s.forward_decode(step.q[i], None, None, cuda_layer(0), step.fb, save_kv_cache=False,
                                         topk_indices=step.topk[i]))
        return outs
    graph = Graph(rt)
    step.capture(graph, forward=eager)
    r2t = runner.req_to_token_pool.req_to_token
    _write(runner, torch.cat([r2t[r, c:c + NDRAFT] for r, c in ((1, 100), (2, 70))]).long(), gen)
    step.load([1, 2], [100, 70], [fr.query(gen, 2) for _ in steps],
              [fr.causal_topk(gen, [99, 69]) for _ in steps], gen)
    graph.replay()
    for out in step.outs:
        assert not out.any(), "the captured eager draft step served a request"
