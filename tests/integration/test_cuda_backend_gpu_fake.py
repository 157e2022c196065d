"""GPU fake (issue 16): the CUDA backend class that ships on a GPU (cuda_backend.py's subclass of
SGLang's DSA backend), run on this CPU with FlashMLA swapped for a torch reference
(tests/integration/_cuda_fake.py), and with the side-stream engine it ships with, its streams
completing work late and out of order (tests/stream_doubles.py). Each test failed on the main of
2026-12-01:

  * a prefill through it opened no hot buffer, so the first decode failed with "request index 1
    has no open hot buffer" -- and a reused request row kept the previous request's slot map and
    LRU order, so attention read another request's latent rows;
  * its prefill attention read the indexer's token positions as pool locations (wrong rows);
  * its prefill did not wait for the zeroing of released host rows, so with an engine that
    completes late the zeroing landed after SGLang wrote the new request's rows.
Outputs are compared with a dense torch reference over the true rows; the bound is one BF16
rounding of the output (the stub accumulates in float64 and rounds once to the cache dtype).
"""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.cuda_backend import backend_class  # noqa: E402
from sgl_ess.prefetch.stream_engine import StreamEngine  # noqa: E402
from tests.stream_doubles import LateStreams  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import cuda_batch, cuda_layer, cuda_runner, install_gpu_fakes, reference, split_bound  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401

LAYERS, CHUNK = 2, 16
BF16_ULP = 2.0 ** -8                 # relative spacing of bfloat16 (8 significant bits)


@pytest.fixture(params=["flashmla_kv", "flashmla_sparse"])
def gpu_fake(request, ess_env, monkeypatch):
    yield from _gpu_fake(request.param, ess_env, monkeypatch)


@pytest.fixture
def gpu_fake_speculative(ess_env, monkeypatch):
    yield from _gpu_fake("flashmla_sparse", ess_env, monkeypatch, speculative_prefetch="next_layer", spec_slots=64)


@pytest.fixture
def gpu_fake_decode_node(ess_env, monkeypatch):
    yield from _gpu_fake("flashmla_kv", ess_env, monkeypatch, decode_node=True)


def _gpu_fake(decode_impl, ess_env, monkeypatch, decode_node=False, **cfg):
    from sglang.srt.runtime_context import get_parallel

    ess_env(hot_slots_per_request=24, **cfg)
    stub, ov = install_gpu_fakes(monkeypatch, decode_impl=decode_impl)
    with get_parallel().override(attn_dcp_rank=0):
        req_pool, alloc = fr.shared_pools()
        if decode_node:     # SGLang's DecodeReqToTokenPool: 2 running + 5 pre-allocated rows (+ padding row 0)
            req_pool.size, req_pool.pre_alloc_size = 2, 5
        runner = cuda_runner(req_pool, alloc, LAYERS)
        backend = backend_class()(runner)
        assert backend.ess is not None and backend.dsa_decode_impl == decode_impl
        # the engine that ships with it on a GPU: the side-stream engine, its streams completing work
        # late and out of order (tests/stream_doubles.py), torch kernels
        store = backend.ess.store
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=LateStreams(), zero_backend="torch")
        yield backend, runner, stub
    ov.restore()


def _bound(out_ref: torch.Tensor) -> float:
    return float(out_ref.abs().max()) * BF16_ULP + 1e-6


def _prefill(backend, runner, rows, prompts, gen, layers=LAYERS):
    """The last CHUNK tokens of each prompt as one extend batch through the CUDA backend (its first
    `layers` layers: the EAGLE draft runner has one); opens and warms the hot buffers."""
    r2t = runner.req_to_token_pool.req_to_token
    fb = cuda_batch("EXTEND", rows, prompts, torch.cat([r2t[r, p - CHUNK:p] for r, p in zip(rows, prompts)]),
                    extend_lens=[CHUNK] * len(rows), prefix_lens=[p - CHUNK for p in prompts])
    backend.init_forward_metadata(fb)
    qpos = [p - CHUNK + j for p in prompts for j in range(CHUNK)]
    tok_req = torch.repeat_interleave(torch.tensor(rows), CHUNK)
    errs = []
    for li in range(layers):
        topk = fr.causal_topk(gen, qpos)
        q = fr.query(gen, len(qpos))
        out = backend.forward_extend(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
        want = reference(runner, li, q, tok_req, topk)
        errs.append((float((out.float().view_as(want) - want).abs().max()), _bound(want)))
    return errs


def _decode(backend, runner, rows, seq, gen, same_topk=False):
    """One decode step through every layer; `same_topk`: every layer selects the same rows."""
    r2t = runner.req_to_token_pool.req_to_token
    loc = torch.stack([r2t[r, s - 1] for r, s in zip(rows, seq)]).long()
    fb = cuda_batch("DECODE", rows, seq, loc)
    backend.init_forward_metadata(fb)
    errs = []
    shared = fr.causal_topk(gen, [s - 1 for s in seq])
    for li in range(LAYERS):
        topk = shared if same_topk else fr.causal_topk(gen, [s - 1 for s in seq])
        q = fr.query(gen, len(rows))
        out = backend.forward_decode(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
        want, st = reference(runner, li, q, torch.tensor(rows), topk, fp8=backend.dsa_decode_impl == "flashmla_kv",
                             stats=True)
        # the default level (da) splits the attention into two FlashMLA calls with BF16 outputs
        errs.append((float((out.float().reshape(want.shape) - want).abs().max()), split_bound(want, st)))
    return errs


def _write(runner, rows, lengths, gen):
    r2t = runner.req_to_token_pool.req_to_token
    for li in range(LAYERS):
        for r, n in zip(rows, lengths):
            fr.write_rows(runner, li, r2t[r, :n], gen)


def test_gpu_fake_prefill_reads_the_right_rows_and_opens_warm_hot_buffers(gpu_fake):
    backend, runner, stub = gpu_fake
    gen = torch.Generator().manual_seed(11)
    rows, prompts = [1, 2], [150, 90]
    fr.place_requests(runner.req_to_token_pool, rows, [p + 3 for p in prompts])
    _write(runner, rows, [p + 3 for p in prompts], gen)
    for err, bound in _prefill(backend, runner, rows, prompts, gen):
        assert err <= bound, f"prefill attention differs from the reference by {err:.3g} (bound {bound:.3g})"
    store = backend.ess.store
    store.engine.drain()
    assert all(bool(store.hot.is_open[r]) for r in rows), "prefill on CUDA opened no hot buffer"
    assert int(store.counters.warmup_rows.sum()) > 0, "prefill on CUDA warmed nothing"
    for step in range(3):
        for err, bound in _decode(backend, runner, rows, [p + 1 + step for p in prompts], gen):
            assert err <= bound, f"decode step {step}: {err:.3g} from the reference (bound {bound:.3g})"
    assert "flash_mla_sparse_fwd" in stub.calls
    # flashmla_kv: SGLang quantizes the BF16 slot space to FlashMLA's FP8 rows (ref_quantize_k_cache) and
    # the stand-in reads them back (issue 32, defect 6); the reference reads the same bytes
    assert ("fp8_kvcache" in stub.calls) == (backend.dsa_decode_impl == "flashmla_kv")


def test_gpu_fake_reused_request_row_never_reads_the_previous_requests_rows(gpu_fake):
    backend, runner, _ = gpu_fake
    gen = torch.Generator().manual_seed(12)
    row, first, second = 1, 200, 120
    fr.place_requests(runner.req_to_token_pool, [row], [first + 3])
    _write(runner, [row], [first + 3], gen)
    _prefill(backend, runner, [row], [first], gen)
    for step in range(2):
        _decode(backend, runner, [row], [first + 1 + step], gen)
    backend.ess.close_rows([row])                      # what SGLang's ReqToTokenPool.free_rows hook does
    fr.place_requests(runner.req_to_token_pool, [row], [second + 3], first_loc=fr.PAGE + 4096 // 2)
    _write(runner, [row], [second + 3], gen)             # a new request in the same row, other rows
    _prefill(backend, runner, [row], [second], gen)
    for step in range(3):
        for err, bound in _decode(backend, runner, [row], [second + 1 + step], gen):
            assert err <= bound, f"second request, decode step {step}: {err:.3g} from its own rows' reference"


def test_gpu_fake_prefill_writes_land_after_the_zeroing_of_released_rows(gpu_fake):
    """Defect 2: released rows are zeroed by a background plan; a new prefill writing the same
    locations must be ordered after it (``fence_host``) on an engine that completes late (the
    fixture's stream engine: the zeroing waits on its own stream until something orders it)."""
    backend, runner, _ = gpu_fake
    store = backend.ess.store
    gen = torch.Generator().manual_seed(13)
    row, prompt = 1, 100
    fr.place_requests(runner.req_to_token_pool, [row], [prompt])
    _write(runner, [row], [prompt], gen)
    r2t = runner.req_to_token_pool.req_to_token
    backend.ess.clear_locs(r2t[row, :prompt].long())          # an earlier request's rows were released
    loc = r2t[row, prompt - CHUNK:prompt].long()
    fb = cuda_batch("EXTEND", [row], [prompt], loc, extend_lens=[CHUNK], prefix_lens=[prompt - CHUNK])
    backend.init_forward_metadata(fb)
    k_nope = torch.randn(CHUNK, 1, fr.KV_LORA, generator=gen).to(fr.DTYPE)
    k_rope = torch.randn(CHUNK, 1, fr.ROPE, generator=gen).to(fr.DTYPE)
    qpos = list(range(prompt - CHUNK, prompt))
    backend.forward_extend(fr.query(gen, CHUNK), k_nope, k_nope, cuda_layer(0), fb, save_kv_cache=True,
                           k_rope=k_rope, topk_indices=fr.causal_topk(gen, qpos))
    store.engine.drain()
    got = runner.token_to_kv_pool.kv_buffer[0][loc, 0]
    want = torch.cat([k_nope.reshape(CHUNK, -1), k_rope.reshape(CHUNK, -1)], dim=-1)
    assert torch.equal(got, want), "the zeroing of released rows landed after the new prefill wrote its rows"
    assert int(store.counters.rows_d2h[0]) == CHUNK, "rows SGLang wrote to the host pool were not counted (d2h)"


def test_gpu_fake_tbo_child_plans_in_its_own_ring_groups(gpu_fake, monkeypatch):
    """Defect 7: the CUDA indexer hook handed every decode plan to micro-batch 0, so the two
    Two-Batch-Overlap children shared ring groups. The second child's plans use base 2."""
    from sglang.srt.model_executor import forward_context

    from sgl_ess.integration.sglang.backends import cuda_backend

    backend, runner, _ = gpu_fake
    r2t = runner.req_to_token_pool.req_to_token
    fr.place_requests(runner.req_to_token_pool, [1, 2], [120, 120])
    fb = cuda_batch("DECODE", [2], [100], r2t[2, 99:100])
    fb.tbo_parent_token_range = (1, 2)                # the second child of a two-request batch
    backend.init_forward_metadata(fb)
    assert backend.micro_batch_base == 2
    seen = []
    monkeypatch.setattr(backend.ess, "mode", lambda layer_id: "da")
    monkeypatch.setattr(backend.ess, "early_plan", lambda *a: seen.append(a[-1]))
    monkeypatch.setattr(forward_context, "get_attn_backend", lambda: backend)
    monkeypatch.setattr(forward_context, "get_req_to_token_pool", lambda: runner.req_to_token_pool)
    topk = fr.causal_topk(torch.Generator().manual_seed(1), [99])
    cuda_backend._around_indexer_forward_cuda(lambda *a, **k: topk, None, None, None, None, fb, 0)
    assert seen == [2], f"the TBO child's plan went to micro-batch base {seen}"


def test_gpu_fake_speculative_prefetch_is_used_and_stays_exact(gpu_fake_speculative):
    """Issue 19 (predictors on CUDA): the CUDA backend with --ess-speculative-prefetch next_layer on
    the side-stream engine (late, out of order). Every layer selects the same rows, so layer 1's
    misses were staged after layer 0's plan: they are read from the speculative rows, after the
    plan's wait, and attention equals the reference."""
    backend, runner, _ = gpu_fake_speculative
    store = backend.ess.store
    assert store.spec is not None and store.engine.ordered_on_device
    gen = torch.Generator().manual_seed(14)
    rows, prompts = [1, 2], [300, 260]
    fr.place_requests(runner.req_to_token_pool, rows, [p + 4 for p in prompts])
    _write(runner, rows, [p + 4 for p in prompts], gen)
    _prefill(backend, runner, rows, prompts, gen)
    for step in range(4):
        for err, bound in _decode(backend, runner, rows, [p + 1 + step for p in prompts], gen, same_topk=True):
            assert err <= bound, f"decode step {step}: {err:.3g} from the reference (bound {bound:.3g})"
    spec = store.usage()["prefetch"]["speculative"]
    assert spec["rows_staged"] > 0 and spec["rows_used"] > 0, spec


NDRAFT = 4


@pytest.fixture(params=[48, 12])      # the window's union fits / overflows the hot buffer
def gpu_fake_mtp(request, ess_env, monkeypatch):
    """EAGLE's target and draft runners (shared request map and allocator, own latent pools), every
    backend the class SGLang builds on a GPU: the target's, the draft's prefill / DRAFT_EXTEND_V2
    one (no steps) and the multi-step container's per-step ones (as DeepseekSparseAttnMultiStepBackend
    constructs them), each store on the side-stream engine with late, out-of-order streams."""
    from sglang.srt.runtime_context import get_parallel

    ess_env(hot_slots_per_request=request.param)
    stub, ov = install_gpu_fakes(monkeypatch, decode_impl="flashmla_sparse", speculative_algorithm="EAGLE",
                                 speculative_num_draft_tokens=NDRAFT, speculative_eagle_topk=1,
                                 speculative_num_steps=3)
    with get_parallel().override(attn_dcp_rank=0):
        req_pool, alloc = fr.shared_pools()
        target, draft = cuda_runner(req_pool, alloc, LAYERS), cuda_runner(req_pool, alloc, 1)
        draft.is_draft_worker = True
        cls = backend_class()
        bt, bd = cls(target), cls(draft, skip_prefill=False)
        steps = [cls(draft, speculative_step_id=i, topk=1, speculative_num_steps=3) for i in range(2)]
        for adapter in {id(b.ess): b.ess for b in (bt, bd)}.values():
            s = adapter.store
            s.engine = StreamEngine(s.memory, "torch", device="cpu", runtime=LateStreams(), zero_backend="torch")
        yield request.param, target, draft, bt, bd, steps
    ov.restore()


def test_gpu_fake_mtp_verify_draft_extend_and_draft_decode_read_the_right_rows(gpu_fake_mtp):
    """Issue 16, defects 3 and 4: on CUDA MTP was refused (its forwards went around the store: draft
    rows written into committed positions, verify over the host pool). Now every forward of an EAGLE
    iteration runs through the store on the CUDA class and equals the dense reference over the true
    rows; the draft steps never admit their own speculative rows."""
    from sgl_ess.integration.sglang.backends.query_layout import ROLE_DRAFT_DECODE, ROLE_DRAFT_EXTEND, ROLE_TARGET

    hot, target, draft, bt, bd, steps = gpu_fake_mtp
    assert (bt.spec_role, bd.spec_role) == (ROLE_TARGET, ROLE_DRAFT_EXTEND)
    assert [s.spec_role for s in steps] == [ROLE_DRAFT_DECODE] * 2 and [s.speculative_step_id for s in steps] == [0, 1]
    assert bt.ess is not bd.ess and all(s.ess is bd.ess for s in steps)
    gen = torch.Generator().manual_seed(21)
    rows, prompts = [1, 2, 3], [150, 90, 200]
    req_pool = target.req_to_token_pool
    fr.place_requests(req_pool, rows, [p + 64 for p in prompts])
    _write(target, rows, [p + 64 for p in prompts], gen)
    for r, p in zip(rows, prompts):
        fr.write_rows(draft, 0, req_pool.req_to_token[r, :p + 64], gen)
    _prefill(bt, target, rows, prompts, gen)
    _prefill(bd, draft, rows, prompts, gen, layers=1)
    r2t = req_pool.req_to_token
    committed = list(prompts)
    accept = [[1, 4, 2], [4, 1, 3], [2, 3, 1]]
    check = _checker()
    for it in range(3):
        for i, step in enumerate(steps):          # draft decode: writes its row at L + i, reads < L
            loc = torch.stack([r2t[r, c + i] for r, c in zip(rows, committed)]).long()
            fr.write_rows(draft, 0, loc, gen)
            fb = _spec_batch("DECODE", rows, committed, loc)
            step.init_forward_metadata(fb)
            q, topk = fr.query(gen, len(rows)), fr.causal_topk(gen, [c - 1 for c in committed])
            out = step.forward_decode(q, None, None, cuda_layer(0), fb, save_kv_cache=False, topk_indices=topk)
            check(out, *reference(draft, 0, q, torch.tensor(rows), topk, stats=True), f"iteration {it}: draft step {i}")
        win = torch.cat([r2t[r, c:c + NDRAFT] for r, c in zip(rows, committed)]).long()
        qpos = [c + j for c in committed for j in range(NDRAFT)]
        tok_req = torch.repeat_interleave(torch.tensor(rows), NDRAFT)
        fb = _spec_batch("TARGET_VERIFY", rows, committed, win)
        bt.init_forward_metadata(fb)
        for li in range(LAYERS):                  # verify: the window's rows written, then attention
            fr.write_rows(target, li, win, gen)
            q, topk = fr.query(gen, len(qpos)), fr.causal_topk(gen, qpos)
            out = bt.forward_extend(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
            check(out, reference(target, li, q, tok_req, topk), f"iteration {it}: verify layer {li}")
        fb = _spec_batch("DRAFT_EXTEND_V2", rows, [c + NDRAFT for c in committed], win, extend_lens=[NDRAFT] * 3)
        bd.init_forward_metadata(fb)
        fr.write_rows(draft, 0, win, gen)
        q, topk = fr.query(gen, len(qpos)), fr.causal_topk(gen, qpos)
        out = bd.forward_extend(q, None, None, cuda_layer(0), fb, save_kv_cache=False, topk_indices=topk)
        check(out, reference(draft, 0, q, tok_req, topk), f"iteration {it}: draft extend")
        committed = [c + a for c, a in zip(committed, accept[it])]
    u = bt.ess.usage()
    assert u["mtp_rows_admitted"] > 0 and u["mtp_window_entries"] > 0
    assert (u["mtp_overflow_entries"] > 0) == (hot < NDRAFT * fr.TOPK)
    for adapter in (bt.ess, bd.ess):          # nothing at or past `committed` is resident
        for li in range(adapter.layers):
            for r, c in zip(rows, committed):
                assert int(adapter.store.hot.slot_to_token[li, r].max()) < c


def _checker():
    def check(out, want, *st_what):
        *st, what = st_what          # ReadStats given: a decode split by DA (split_bound)
        bound = split_bound(want, st[0]) if st else _bound(want)
        err = float((out.float().reshape(want.shape) - want).abs().max())
        assert err <= bound, f"{what}: {err:.3g} from the reference (bound {bound:.3g})"
    return check


def _spec_batch(mode, rows, seq, loc, extend_lens=None):
    prefix = None if extend_lens is None else [s - e for s, e in zip(seq, extend_lens)]
    fb = cuda_batch(mode, rows, seq, loc, extend_lens=extend_lens, prefix_lens=prefix)
    fb.spec_info = SimpleNamespace(draft_token_num=NDRAFT)
    if extend_lens is not None:
        fb.extend_num_tokens = sum(extend_lens)
        fb.extend_prefix_lens = torch.tensor(prefix, dtype=torch.int32)
    return fb


def test_gpu_fake_indexer_hook_plans_no_draft_step(gpu_fake_mtp, monkeypatch):
    """An EAGLE draft step reads committed rows only (StoreForward.decode plans it): the early plan of
    either indexer hook - which would reserve and fetch as a target decode does - is the target's
    alone. The torch indexer's hand-off (the one a CPU server runs) once planned the CUDA class's
    draft steps: the class had no accepts_early_plans, the reserved speculative rows stayed empty
    while the LRU counted them resident, and a GPU-fake EAGLE server's drafts diverged from ESS off."""
    from sglang.srt.model_executor import forward_context

    from sgl_ess.integration.sglang.backends import cuda_backend, indexer_torch

    _, target, draft, bt, _, steps = gpu_fake_mtp
    r2t = target.req_to_token_pool.req_to_token
    fr.place_requests(target.req_to_token_pool, [1], [120])
    fb = cuda_batch("DECODE", [1], [100], r2t[1, 99:100])
    topk = fr.causal_topk(torch.Generator().manual_seed(2), [99])
    seen, handoff = [], []
    monkeypatch.setattr(forward_context, "get_req_to_token_pool", lambda: target.req_to_token_pool)
    for backend in (steps[0], bt):
        monkeypatch.setattr(backend.ess, "mode", lambda layer_id: "da")
        monkeypatch.setattr(backend.ess, "early_plan", lambda *a, _b=backend: seen.append(_b.spec_role))
        monkeypatch.setattr(forward_context, "get_attn_backend", lambda _b=backend: _b)
        cuda_backend._around_indexer_forward_cuda(lambda *a, **k: topk, None, None, None, None, fb, 0)
        handoff.append((backend.spec_role, bool(indexer_torch._EarlyHandoff(fb, 0, topk, r2t).parts)))
    assert seen == ["target"], f"early plans made for roles {seen}"
    assert handoff == [("draft_decode", False), ("target", True)], handoff


def test_gpu_fake_mixed_chunk_prefill_rows_and_riding_decode_rows(gpu_fake):
    """Mixed chunked prefill on CUDA (was refused at launch): one batch holds a new request's
    prefill chunk and two running requests riding along with one token each. The chunk runs
    SGLang's extend kernel (riding rows masked out), the riding rows the store's decode path - their
    hot buffers stay open and warm - and every output equals the dense reference."""
    backend, runner, stub = gpu_fake
    store = backend.ess.store
    gen = torch.Generator().manual_seed(15)
    running, prompts, new_row, new_prompt = [1, 2], [150, 90], 3, 2 * CHUNK
    fr.place_requests(runner.req_to_token_pool, running + [new_row], [p + 4 for p in prompts] + [new_prompt])
    _write(runner, running + [new_row], [p + 4 for p in prompts] + [new_prompt], gen)
    _prefill(backend, runner, running, prompts, gen)
    r2t = runner.req_to_token_pool.req_to_token
    for step in range(2):
        seq = [p + 1 + step for p in prompts]
        end = (step + 1) * CHUNK
        loc = torch.cat([r2t[new_row, end - CHUNK:end], torch.stack([r2t[r, s - 1] for r, s in zip(running, seq)])])
        fb = cuda_batch("EXTEND", [new_row] + running, [end] + seq, loc.long(), extend_lens=[CHUNK, 1, 1],
                        prefix_lens=[end - CHUNK] + [s - 1 for s in seq])
        backend.init_forward_metadata(fb)
        qpos = list(range(end - CHUNK, end)) + [s - 1 for s in seq]
        tok_req = torch.tensor([new_row] * CHUNK + running)
        hits_before = int(store.counters.hits.sum())
        for li in range(LAYERS):
            topk = fr.causal_topk(gen, qpos)
            q = fr.query(gen, len(qpos))
            out = backend.forward_extend(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
            want = reference(runner, li, q, tok_req, topk)
            err = float((out.float().reshape(want.shape) - want).abs().max())
            assert err <= _bound(want), f"mixed step {step} layer {li}: {err:.3g} from the reference"
        assert all(bool(store.hot.is_open[r]) for r in running + [new_row])
        assert int(store.counters.hits.sum()) > hits_before, "the riding rows did not go through their hot buffers"
    assert backend.ess.path_usage()["mixed_decode_rows"] == 2 * 2


def test_gpu_fake_pd_decode_node_opens_hot_buffers_when_a_request_runs(gpu_fake_decode_node):
    """Issue 18: on a PD decode node a row handed to a request in transfer holds no hot buffer; the
    first batch the request runs in opens one (warm from the prefill's state, or cold), and the
    attention through the CUDA class equals the reference. 2 hot buffers serve 8 request rows."""
    backend, runner, _ = gpu_fake_decode_node
    ess, store = backend.ess, backend.ess.store
    assert store.cfg.groups == 2 and store.cfg.max_requests == 8
    gen = torch.Generator().manual_seed(21)
    rows, prompts = [6, 3], [150, 90]
    fr.place_requests(runner.req_to_token_pool, rows + [5], [p + 4 for p in prompts] + [44])
    _write(runner, rows + [5], [p + 4 for p in prompts] + [44], gen)
    ess.note_rows_allocated(rows + [5])              # SGLang's decode pool handed them out (transfers begin)
    warm = torch.full((LAYERS, 24), -1, dtype=torch.int64)
    warm[:, -3:] = torch.tensor([5, 9, 2])           # the prefill's LRU state of row 6: 3 tokens
    ess.import_warm_state(6, prompts[0], (prompts[0], warm))
    ess.import_warm_state(3, prompts[1], "absent")   # the prefill sent none: row 3 starts cold
    assert store.open_requests == 0 and not any(ess.is_open(r) for r in rows + [5])
    for step in range(3):
        for err, bound in _decode(backend, runner, rows, [p + 1 + step for p in prompts], gen):
            assert err <= bound, f"decode step {step}: {err:.3g} from the reference (bound {bound:.3g})"
    assert ess.is_open(6) and ess.is_open(3) and not ess.is_open(5)   # row 5 is still in transfer
    assert int(store.counters.warmup_rows.sum()) == 3 * LAYERS and ess.cold_starts == 1
    assert ess.usage()["pd_pending_rows"] == 1
    ess.close_rows([6])
    ess.import_warm_state(5, 40, "absent")
    for err, bound in _decode(backend, runner, [5, 3], [41, prompts[1] + 4], gen):   # row 5 takes 6's buffer
        assert err <= bound
    ess.close_rows([5, 3])
    store.engine.drain()
    assert store.open_requests == 0 and store.usage()["hot_slots_used"] == 0


def test_gpu_fake_a_decode_step_reads_nothing_back_to_the_host(gpu_fake, monkeypatch):
    """Issue 16 item 5: a decode step through the CUDA class, every layer (the store's reserve, plan,
    land, attend and commit, the padding check and the write-position check), issues no op that makes
    the host wait for the device - so a GPU's host can queue the next layers (and SGLang's overlap
    scheduler the next step) while the device runs. Seen on CPU by HostReads (tests/host_reads.py)
    and by `.tolist()`, which does not dispatch. SGLang's own init_forward_metadata is not ours and is
    not watched."""
    from tests.host_reads import watch

    from sgl_ess.integration.sglang.backends import padding

    backend, runner, _ = gpu_fake
    backend.ess.validate = False                         # as on CUDA (the GPU fake's device is the CPU)
    gen = torch.Generator().manual_seed(21)
    rows, prompts = [1, 2], [150, 90]
    fr.place_requests(runner.req_to_token_pool, rows, [p + 4 for p in prompts])
    _write(runner, rows, [p + 4 for p in prompts], gen)
    _prefill(backend, runner, rows, prompts, gen)
    _decode(backend, runner, rows, [p + 1 for p in prompts], gen)       # the first step (warm paths)
    reads = watch(monkeypatch)
    lists = []
    tolist = torch.Tensor.tolist

    def counted_tolist(self):
        if self is not fb.seq_lens_cpu:                 # SGLang's host copy of seq_lens: no device read
            lists.append(tuple(self.shape))
        return tolist(self)
    r2t = runner.req_to_token_pool.req_to_token
    seq = [p + 2 for p in prompts]
    fb = cuda_batch("DECODE", rows, seq, torch.stack([r2t[r, s - 1] for r, s in zip(rows, seq)]).long())
    fb.global_num_token_non_padded_cpu = len(rows)      # SGLang's count of real tokens (no padding here)
    if fb.seq_lens_cpu is None:
        fb.seq_lens_cpu = fb.seq_lens.clone()            # SGLang's host copy, as a decode batch carries
    backend.init_forward_metadata(fb)
    monkeypatch.setattr(padding, "reads_cost_nothing", lambda loc: False)    # the batch is a device batch
    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    for li in range(LAYERS):
        topk = fr.causal_topk(gen, [s - 1 for s in seq])
        q = fr.query(gen, len(rows))
        with reads:
            backend.forward_decode(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    assert reads.seen == [] and lists == [], (reads.seen, lists)
