"""GPU fake (issue 35 item 3): a Two-Batch-Overlap MTP TARGET_VERIFY step captured in a CUDA graph
(``--ess-cuda-graph`` with ``--enable-two-batch-overlap`` and EAGLE/MTP) through SGLang's own
``TboAttnBackend`` over three CUDA backend classes (its primary and two children), on this CPU, with
tests/graph_double.py's graph and streams; FP8 656-byte rows, flashmla_kv (SGLang's decode kernel over the
store's slot table).

What SGLang 0.5.23 does, and this test does the same way:
  * capture (the decode graph runner in capture mode TARGET_VERIFY -> TboCudaGraphRunnerPlugin.
    capture_one_batch_size): ``get_token_num_per_seq`` is the draft token count n, the split is
    ``compute_split_seq_index`` = (bs * n // n) // 2 requests, ``compute_split_token_index`` = that x n
    tokens; filter_batch gives each child the slices of the static buffers (requests, seq_lens, their n
    ``out_cache_loc`` entries each; ``tbo_parent_token_range`` = its token range; ``split_spec_info``);
    ``TboAttnBackend.init_forward_metadata_out_graph(in_capture=True)`` hands the primary the whole batch
    and each child its own; ``on_after_cuda_graph_warmup`` reaches all three;
  * the step: the first dense layers on the primary with the whole batch (``first_k_dense_replace``), the
    others per micro-batch (a's layer, then b's), each child's ``forward_extend`` over its own batch, which
    for a capture batch goes to ``cuda_graph.graph_verify`` on the child's rows of the padded batch, planned
    in the child's ring groups (``micro_batch_base``);
  * replay: ``TboAttnBackend.init_forward_metadata_out_graph(view)`` hands the primary SGLang's padded view
    and each child a slice of it without ``num_padding`` (``_build_tbo_child_replay_fb_view``, which splits
    SGLang's own ``EagleVerifyInput``).
The eager twin runs the same requests through a second store as SGLang's eager TBO does (split at k // 2 of
the k real requests, no padding): outputs equal bit for bit, padding tokens zero, then the same LRU state,
hot-slot bytes, MTP scratch rows, admission frontier and counters. Requests and accept lengths change
between replays; a request finishes and a new one takes its row. Checked on CPU with the graph double only;
no TBO verify step of ESS has been captured on a GPU.
"""


import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.batch_overlap.two_batch_overlap import (  # noqa: E402
    compute_split_seq_index,
    compute_split_token_index,
    split_spec_info,
)
from sglang.srt.layers.attention.tbo_backend import TboAttnBackend  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode  # noqa: E402
from sglang.srt.speculative.eagle_info import EagleVerifyInput  # noqa: E402

from sgl_ess.integration.sglang.backends.cuda_backend import backend_class  # noqa: E402
from sgl_ess.kernels import flashtrans  # noqa: E402
from sgl_ess.prefetch.stream_engine import StreamEngine  # noqa: E402
from tests.graph_double import CaptureStreams, Graph  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import copy_rows_static, cuda_batch, cuda_layer, cuda_runner, install_gpu_fakes  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401
from .test_cuda_graph_verify_gpu_fake import CapturedVerify  # noqa: E402

LAYERS, DENSE, CHUNK, NDRAFT, BS = 3, 1, 16, 4, 4     # layer 0 dense (the whole batch), layers 1-2 per child


def _split(n_req: int) -> tuple[int, int]:
    """SGLang's TARGET_VERIFY split of n_req requests x NDRAFT tokens: (requests, tokens) of micro-batch a."""
    mode = ForwardMode.TARGET_VERIFY
    s = compute_split_seq_index(forward_mode=mode, num_tokens=n_req * NDRAFT, extend_lens=None,
                                token_num_per_seq=NDRAFT)
    return s, compute_split_token_index(split_seq_index=s, forward_mode=mode, extend_seq_lens=None,
                                        token_num_per_seq=NDRAFT)


def _spec(n_req: int) -> EagleVerifyInput:
    """SGLang's verify input of a batch, reduced to what the split and the backends read."""
    return EagleVerifyInput(draft_token=None, custom_mask=None, positions=None, retrieve_index=None,
                            retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
                            spec_steps=NDRAFT - 1, topk=1, draft_token_num=NDRAFT,
                            capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=0, seq_lens_cpu=None)


@pytest.fixture(params=[48, 12], ids=["union-fits", "union-overflows"])
def tbo_mtp_fakes(request, ess_env, monkeypatch):
    """make() -> (tbo, runner, streams): SGLang's TboAttnBackend over three CUDA backend classes (EAGLE target,
    NDRAFT draft tokens) sharing their runner's FP8 pools and store, with the stream engine on CaptureStreams."""
    from sglang.srt.runtime_context import get_parallel

    ess_env(hot_slots_per_request=request.param, cuda_graph=True, prefetch_overlap_level="none")
    _, ov = install_gpu_fakes(monkeypatch, decode_impl="flashmla_kv", prefill_impl="flashmla_auto",
                              speculative_algorithm="EAGLE", speculative_num_draft_tokens=NDRAFT,
                              speculative_eagle_topk=1, speculative_num_steps=NDRAFT - 1)
    monkeypatch.setattr(flashtrans, "copy_rows_torch", copy_rows_static)   # FlashTrans with static shapes

    def make():
        req_pool, alloc = fr.shared_pools()
        runner = cuda_runner(req_pool, alloc, LAYERS, fp8_pool=True)
        cls = backend_class()
        tbo = TboAttnBackend(cls(runner), [cls(runner), cls(runner)])
        assert all(c.ess is tbo.primary.ess for c in tbo.children)      # one store per runner
        store = tbo.primary.ess.store
        rt = CaptureStreams(seed=5)
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=rt, zero_backend="torch")
        store.resolver_backend = "torch"
        tbo.primary.ess.validate = False                 # as on CUDA (the fake's device is the CPU)
        return tbo, runner, rt
    with get_parallel().override(attn_dcp_rank=0):
        yield make
    ov.restore()


def _write(runner, locs, gen):
    """Latent rows of every layer through the pool's writer (SGLang's FP8 quantizer)."""
    pool = runner.token_to_kv_pool
    for li in range(LAYERS):
        x = torch.randn(locs.numel(), fr.KV_DIM, generator=gen) * torch.rand(locs.numel(), 1, generator=gen) * 4
        pool.set_mla_kv_buffer(cuda_layer(li), locs, x[:, :fr.KV_LORA].to(torch.bfloat16),
                               x[:, fr.KV_LORA:].to(torch.bfloat16))


def _prefill(tbo, runner, rows, prompts, gen, first_loc=fr.PAGE):
    """Rows placed and written, the last CHUNK tokens prefilled eagerly: opens and warms the hot buffers."""
    r2t = runner.req_to_token_pool.req_to_token
    fr.place_requests(runner.req_to_token_pool, rows, [p + 64 for p in prompts], first_loc=first_loc)
    _write(runner, torch.cat([r2t[r, :p] for r, p in zip(rows, prompts)]).long(), gen)
    fb = cuda_batch("EXTEND", rows, prompts, torch.cat([r2t[r, p - CHUNK:p] for r, p in zip(rows, prompts)]),
                    extend_lens=[CHUNK] * len(rows), prefix_lens=[p - CHUNK for p in prompts])
    tbo.init_forward_metadata(fb)
    qpos = [p - CHUNK + j for p in prompts for j in range(CHUNK)]
    for li in range(LAYERS):
        tbo.forward_extend(fr.query(gen, len(qpos)), None, None, cuda_layer(li), fb, save_kv_cache=False,
                           topk_indices=fr.causal_topk(gen, qpos))


def _verify_batch(rows, committed, loc):
    fb = cuda_batch("TARGET_VERIFY", rows, committed, loc)
    fb.spec_info = _spec(len(rows))
    return fb


def _child(fb, seqs: slice, toks: slice):
    """filter_batch's child of a TARGET_VERIFY batch: its requests and their tokens (views, not copies)."""
    c = cuda_batch("TARGET_VERIFY", [0] * (seqs.stop - seqs.start), [1] * (seqs.stop - seqs.start),
                   torch.zeros(toks.stop - toks.start, dtype=torch.int64))
    c.req_pool_indices, c.seq_lens, c.seq_lens_cpu = fb.req_pool_indices[seqs], fb.seq_lens[seqs], fb.seq_lens[seqs]
    c.out_cache_loc = fb.out_cache_loc[toks]
    c.spec_info = split_spec_info(spec_info=fb.spec_info, start_seq_index=seqs.start, end_seq_index=seqs.stop,
                                  start_token_index=toks.start, end_token_index=toks.stop)
    c.tbo_parent_token_range = (toks.start, toks.stop)
    return c


def _with_children(fb, n_req: int):
    s, t = _split(n_req)
    parts = [(slice(0, s), slice(0, t)), (slice(s, n_req), slice(t, n_req * NDRAFT))]
    fb.tbo_children = [_child(fb, ps, pt) for ps, pt in parts]
    return [pt for _, pt in parts]


def _layers(tbo, fb, q, topk, who: list):
    """One TBO verify step's attention calls: dense layers on the primary (whole batch), then per child."""
    outs = []
    for li in range(LAYERS):
        if li < DENSE:
            who[0] = "whole"
            outs.append(tbo.forward_extend(q[li], None, None, cuda_layer(li), fb, save_kv_cache=False,
                                           topk_indices=topk[li]).reshape(q[li].shape[0], -1))
            continue
        parts = []
        for name, child, cfb in zip("ab", tbo.children, fb.tbo_children):
            p = slice(*cfb.tbo_parent_token_range)
            if p.stop == p.start:
                continue
            who[0] = name
            parts.append(child.forward_extend(q[li][p], None, None, cuda_layer(li), cfb, save_kv_cache=False,
                                              topk_indices=topk[li][p]).reshape(p.stop - p.start, -1))
        outs.append(torch.cat(parts))
    return outs


class TboCapturedVerify(CapturedVerify):
    """SGLang's decode graph runner with TBO in capture mode TARGET_VERIFY, reduced to what the attention
    backends see: static buffers of BS requests x NDRAFT tokens, the capture batch and its two children over
    slices of them, one verify step of every layer captured once and replayed with new contents (the
    capture and SGLang's load_batch are test_cuda_graph_verify_gpu_fake's, with TboAttnBackend as the backend:
    its out_graph hook gives the children their slices of the padded view)."""

    layers = LAYERS
    view_extra = {"max_seq_len_override": None}

    @staticmethod
    def batch(rows, committed, loc):
        return _verify_batch(rows, committed, loc)

    def __init__(self, tbo, runner):
        super().__init__(tbo, runner)
        self.tbo = tbo
        _with_children(self.fb, BS)                  # capture_one_batch_size: bs // 2 requests to child a
        self.who = [None]

    def forward(self) -> list[torch.Tensor]:
        self.tbo.init_forward_metadata_in_graph(self.fb)
        return _layers(self.tbo, self.fb, self.q, self.topk, self.who)


def _eager_step(tbo, rows, committed, win, q, topk):
    """SGLang's eager TBO verify step (children split at k // 2 of the k real requests). Per layer [k*n, H*R]."""
    fb = _verify_batch(rows, committed, win)
    _with_children(fb, len(rows))
    tbo.init_forward_metadata(fb)
    return _layers(tbo, fb, q, topk, [None])


def _record_plans(store, who):
    """store.plan recording: (who planned - 'whole' / 'a' / 'b' -, its micro-batch, the StepPlan)."""
    seen, plan = [], store.plan

    def rec(layer, *a, micro_batch=0, **kw):
        step = plan(layer, *a, micro_batch=micro_batch, **kw)
        seen.append((who[0], micro_batch, step))
        return step
    store.plan = rec
    return seen


def _state(tbo):
    ess = tbo.primary.ess
    s = ess.store
    s.engine.drain()
    s.engine.rt.finish()
    sp = s.slots
    return {"slot_to_token": s.hot.slot_to_token.clone(), "lru_order": s.hot.lru_order.clone(),
            "hot_rows": sp.rows[:sp.ring_base].clone(),          # the micro-batches' ring rows may differ
            "mtp_scratch": sp.rows[sp.verify_base:].clone(), "hits": s.counters.hits.clone(),
            "misses": s.counters.misses.clone(), "rows_h2d": s.counters.rows_h2d.clone(),
            "frontier": ess._mtp_rows.frontier.clone(), "admitted": ess._mtp_rows.rows_admitted,
            "window": int(ess.mtp_window_entries), "overflow": int(ess.mtp_overflow_entries)}


def test_gpu_fake_a_tbo_verify_step_replays_as_its_eager_twin_bit_for_bit(tbo_mtp_fakes):
    make = tbo_mtp_fakes
    (gt, grun, grt), (et, erun, ert) = make(), make()
    rows, prompts = [1, 7, 3, 2], [150, 90, 200, 120]     # row 7: the last request row (a -1 would wrap to it)
    for t, run in ((gt, grun), (et, erun)):                # the same requests and bytes in both
        _prefill(t, run, rows, prompts, torch.Generator().manual_seed(51))
    step = TboCapturedVerify(gt, grun)
    plans = _record_plans(gt.primary.ess.store, step.who)
    graph = Graph(grt)
    step.capture(graph)
    calls = DENSE + 2 * (LAYERS - DENSE)                # verify calls (store plans) of one step
    captured = plans[-calls:]                           # the capture's run (after SGLang's two warm-ups)
    assert {who for who, _, _ in captured} == {"whole", "a", "b"}, "the step did not run per micro-batch"
    own = {"whole": {0}, "a": {0}, "b": {2}}
    for who, mb, _ in captured:
        assert mb in own[who], f"micro-batch {who} planned in micro-batch {mb}, not its own {sorted(own[who])}"
    hot = gt.primary.ess.store_cfg.hot_slots_per_request
    gen = torch.Generator().manual_seed(52)
    committed = dict(zip(rows, prompts))
    r2t = erun.req_to_token_pool.req_to_token
    rings = {"a": set(), "b": set()}
    schedule = [([1, 7, 3, 2], [1, 4, 2, 3]), ([3, 1, 2], [4, 1, 2]), ([7, 3], [3, 3]), ([7], [2]), "swap",
                ([2, 1, 3, 7], [1, 2, 1, 4]), ([1, 2, 3], [2, 2, 2])]
    for it, entry in enumerate(schedule):
        if entry == "swap":        # request 2 finished; a new request takes its row, on other host rows
            for t, run in ((gt, grun), (et, erun)):
                t.primary.ess.close_rows([2])
                _prefill(t, run, [2], [60], torch.Generator().manual_seed(58), first_loc=fr.PAGE + 2048)
            committed[2] = 60
            continue
        batch, accept = entry
        com = [committed[r] for r in batch]
        win = torch.cat([r2t[r, c:c + NDRAFT] for r, c in zip(batch, com)]).long()
        for run in (grun, erun):                       # the window's rows written (new bytes every iteration)
            _write(run, win, torch.Generator().manual_seed(1000 + it))
        qpos = [c + j for c in com for j in range(NDRAFT)]
        q = [fr.query(gen, len(qpos)) for _ in range(LAYERS)]
        topk = [fr.causal_topk(gen, qpos) for _ in range(LAYERS)]
        step.load(batch, com, q, topk, gen)
        graph.replay()
        want = _eager_step(et, batch, com, win, [x.clone() for x in q], [x.clone() for x in topk])
        t = len(batch) * NDRAFT
        for li in range(LAYERS):
            got = step.outs[li].reshape(BS * NDRAFT, -1)
            assert torch.equal(got[:t], want[li].reshape(t, -1)), (it, batch, li)
            assert not got[t:].any(), f"iteration {it}, layer {li}: the padding tokens' outputs are not zero"
        for who, _, st in captured:        # this replay's ring rows (the plans' outputs, rewritten by it)
            if who in rings:
                rings[who].update(st.ring_dst[st.ring_dst >= 0].tolist())
        for r, a in zip(batch, accept):
            committed[r] += a
        grt.progress(3)                                # side streams run some of it, out of order
        ert.progress(3)
    assert rings["a"] and rings["b"] and not rings["a"] & rings["b"], "the micro-batches shared ring rows"
    g, e = _state(gt), _state(et)
    for key in g:
        assert (torch.equal(g[key], e[key]) if isinstance(g[key], torch.Tensor) else g[key] == e[key]), key
    assert g["window"] > 0 and g["admitted"] > 0 and int(g["misses"].sum()) > 0
    assert (g["overflow"] > 0) == (hot < NDRAFT * fr.TOPK)
    real = [x for x in schedule if x != "swap"]
    usage = gt.primary.ess.path_usage()
    assert usage["graph_captures"] == 1 and usage["graph_replays"] == len(real), usage
    assert usage["graph_rows"] == sum(len(b) for b, _ in real), "a replay was counted per child"
    assert usage["mtp_steps"] == (2 + len(real)) * calls, usage     # two warm-ups ran eagerly, then the replays


def test_gpu_fake_a_tbo_verify_replay_counts_the_windows_host_writes(tbo_mtp_fakes):
    """SGLang's writer stores NDRAFT latent rows per real request and layer inside the graph: the replay hook
    (the primary's, once per step) counts n_real x NDRAFT per layer, not once per child."""
    tbo, runner, rt = tbo_mtp_fakes()
    _prefill(tbo, runner, [1, 2, 3], [120, 80, 100], torch.Generator().manual_seed(53))
    step = TboCapturedVerify(tbo, runner)
    step.capture(Graph(rt))
    gen = torch.Generator().manual_seed(54)
    counters = tbo.primary.ess.store.counters
    before = counters.snapshot()["bytes_d2h"]
    qpos = [c + j for c in (120, 80, 100) for j in range(NDRAFT)]
    step.load([1, 2, 3], [120, 80, 100], [fr.query(gen, len(qpos)) for _ in range(LAYERS)],
              [fr.causal_topk(gen, qpos) for _ in range(LAYERS)], gen)
    after = counters.snapshot()["bytes_d2h"]
    assert after - before == 3 * NDRAFT * LAYERS * tbo.primary.ess.row_bytes, (before, after)
