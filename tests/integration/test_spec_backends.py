"""The ess backend's speculative paths, driven in-process with chosen batches (stand-in runners,
see _fake_runner.py): every ESS-on output equals ESS off reading SGLang's pool directly, and
two model runners in one process (EAGLE's target and draft: shared request map and allocator,
own latent pools) each read only their own rows."""

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.pools import lifecycle  # noqa: E402
from sgl_ess.integration.sglang.backends.backend_registration import create_ess_backend  # noqa: E402
from sgl_ess.integration.sglang.backends.ess_backend import EssSparseAttnBackend, check_write_positions  # noqa: E402
from sgl_ess.integration.sglang.backends.eagle import EssMultiStepDraftBackend  # noqa: E402

from ._fake_runner import (TOPK, causal_topk, fake_runner, forward_batch, layer, place_requests,  # noqa: E402
                           query, shared_pools, write_rows)
from ._spec_fixtures import ess_env  # noqa: E402,F401

ROWS, PROMPTS, NDRAFT = [1, 2, 3], [150, 90, 200], 4


@pytest.fixture(autouse=True)
def eagle_server_args():
    """SGLang's published speculative configuration, as an EAGLE server has it: the store sizes its MTP
    scratch rows from the draft-token count (pools/device_budget.draft_tokens)."""
    from sglang.srt.runtime_context import get_context

    ov = get_context().override_server_args(speculative_algorithm="EAGLE", speculative_num_draft_tokens=NDRAFT,
                                            speculative_eagle_topk=1, speculative_num_steps=NDRAFT - 1)
    ov.install()
    yield
    ov.restore()


def _env(seed=0):
    g = torch.Generator().manual_seed(seed)
    req_pool, alloc = shared_pools()
    target, draft = fake_runner(req_pool, alloc, 2), fake_runner(req_pool, alloc, 1)
    place_requests(req_pool, ROWS, [p + 64 for p in PROMPTS])
    for runner in (target, draft):       # the same locations hold different rows in each pool
        for li in range(runner.token_to_kv_pool.layer_num):
            for r, p in zip(ROWS, PROMPTS):
                write_rows(runner, li, req_pool.req_to_token[r, :p], g)
    return g, req_pool, target, draft


def _prefill(backend, runner, g, req_pool):
    """A prefill chunk of the last 4 prompt tokens: opens and warms the hot buffers."""
    n_q = [4] * len(ROWS)
    qpos = [p - 4 + j for p in PROMPTS for j in range(4)]
    loc = torch.cat([req_pool.req_to_token[r, p - 4:p] for r, p in zip(ROWS, PROMPTS)])
    fb = forward_batch("EXTEND", ROWS, PROMPTS, loc, extend_lens=n_q)
    topk = causal_topk(g, qpos)
    for li in range(runner.token_to_kv_pool.layer_num):
        backend.forward_extend(query(g, len(qpos)), None, None, layer(li), fb, save_kv_cache=False,
                               topk_indices=topk)


def _both(on, off, mode_fn, q, fb, topk, li):
    a = getattr(on, mode_fn)(q, None, None, layer(li), fb, save_kv_cache=False, topk_indices=topk)
    b = getattr(off, mode_fn)(q, None, None, layer(li), fb, save_kv_cache=False, topk_indices=topk)
    return a, b


def test_two_runners_read_only_their_own_rows(ess_env):
    g, req_pool, target, draft = _env()
    bt, bd = create_ess_backend(target), create_ess_backend(draft)
    assert bt.ess is lifecycle.adapter_for(target) and bd.ess is lifecycle.adapter_for(draft)
    assert bt.ess is not bd.ess and create_ess_backend(target).ess is bt.ess
    assert bt.ess.store.host is target.token_to_kv_pool.ess_host_pool
    assert bd.ess.store.host is draft.token_to_kv_pool.ess_host_pool
    ref_t, ref_d = EssSparseAttnBackend(target, None), EssSparseAttnBackend(draft, None)
    _prefill(bt, target, g, req_pool)
    _prefill(bd, draft, g, req_pool)
    differ = 0
    for step in range(6):
        seq = [p + step + 1 for p in PROMPTS]
        loc = torch.stack([req_pool.req_to_token[r, s - 1] for r, s in zip(ROWS, seq)])
        for runner in (target, draft):
            for li in range(runner.token_to_kv_pool.layer_num):
                write_rows(runner, li, loc, g)
        fb = forward_batch("DECODE", ROWS, seq, loc)
        q, topk = query(g, len(ROWS)), causal_topk(g, [s - 1 for s in seq])
        out_t, want_t = _both(bt, ref_t, "forward_decode", q, fb, topk, 0)
        out_d, want_d = _both(bd, ref_d, "forward_decode", q, fb, topk, 0)
        assert torch.equal(out_t, want_t) and torch.equal(out_d, want_d)
        differ += int(not torch.equal(want_t, want_d))   # the two pools really hold different rows
        out_t1, want_t1 = _both(bt, ref_t, "forward_decode", q, fb, topk, 1)
        assert torch.equal(out_t1, want_t1)
    assert differ == 6
    assert bt.ess.usage()["rows_h2d"] > 0 and bd.ess.usage()["rows_h2d"] > 0
    lifecycle._after_free_rows(None, req_pool, ROWS)          # SGLang frees the rows once: both close
    assert bt.ess.store.open_requests == 0 and bd.ess.store.open_requests == 0


@pytest.mark.parametrize("hot_slots", [48, 12])      # the 4-token union fits / overflows the hot buffer
def test_verify_draft_extend_draft_decode_equal_ess_off(ess_env, hot_slots):
    ess_env(hot_slots_per_request=hot_slots)
    g, req_pool, target, draft = _env(seed=1)
    bt = create_ess_backend(target)
    bd_extend = create_ess_backend(draft)
    steps = EssMultiStepDraftBackend(draft, 1, 3).attn_backends
    assert all(s.ess is bd_extend.ess for s in steps) and not steps[0].accepts_early_plans
    ref_t, ref_d = EssSparseAttnBackend(target, None), EssSparseAttnBackend(draft, None)
    _prefill(bt, target, g, req_pool)
    _prefill(bd_extend, draft, g, req_pool)
    committed = list(PROMPTS)
    accept = [[1, 4, 2, 3, 1], [4, 4, 1, 1, 2], [2, 1, 3, 4, 4]]
    r2t = req_pool.req_to_token
    for it in range(5):
        for i, step_backend in enumerate(steps):     # draft decode: row at L + i, reads < L
            loc = torch.stack([r2t[r, c + i] for r, c in zip(ROWS, committed)])
            write_rows(draft, 0, loc, g)
            fb = forward_batch("DECODE", ROWS, committed, loc, draft_tokens=NDRAFT)
            q, topk = query(g, len(ROWS)), causal_topk(g, [c - 1 for c in committed])
            a, b = _both(step_backend, ref_d, "forward_decode", q, fb, topk, 0)
            assert torch.equal(a, b), f"iteration {it}: draft decode step {i}"
        win = torch.cat([r2t[r, c:c + NDRAFT] for r, c in zip(ROWS, committed)])
        qpos = [c + j for c in committed for j in range(NDRAFT)]
        fb = forward_batch("TARGET_VERIFY", ROWS, committed, win, draft_tokens=NDRAFT)
        for li in range(2):                          # verify: window rows written, then attention
            write_rows(target, li, win, g)
            q, topk = query(g, len(qpos)), causal_topk(g, qpos)
            a, b = _both(bt, ref_t, "forward_extend", q, fb, topk, li)
            assert torch.equal(a, b), f"iteration {it}: verify layer {li}"
        fb = forward_batch("DRAFT_EXTEND_V2", ROWS, [c + NDRAFT for c in committed], win,
                           extend_lens=[NDRAFT] * len(ROWS), draft_tokens=NDRAFT)
        write_rows(draft, 0, win, g)
        q, topk = query(g, len(qpos)), causal_topk(g, qpos)
        a, b = _both(bd_extend, ref_d, "forward_extend", q, fb, topk, 0)
        assert torch.equal(a, b), f"iteration {it}: draft extend"
        committed = [c + acc[it] for c, acc in zip(committed, accept)]
    u = bt.ess.usage()
    assert u["mtp_rows_admitted"] > 0 and u["mtp_window_entries"] > 0
    assert (u["mtp_overflow_entries"] > 0) == (hot_slots < NDRAFT * TOPK)
    for adapter in (bt.ess, bd_extend.ess):       # nothing at or past `committed` is resident
        for li in range(adapter.layers):
            for r, c in zip(ROWS, committed):
                assert int(adapter.store.hot.slot_to_token[li, r].max()) < c


def test_a_draft_step_planned_early_is_refused(ess_env):
    """An early plan reserves each request's newest row as resident; a draft step's newest row is
    speculative and never written to the hot buffer, so a draft step planned early is an error,
    not an empty row read silently."""
    g, req_pool, target, draft = _env(seed=2)
    bd_extend = create_ess_backend(draft)
    steps = EssMultiStepDraftBackend(draft, 1, 3).attn_backends
    _prefill(bd_extend, draft, g, req_pool)
    r2t = req_pool.req_to_token
    loc = torch.stack([r2t[r, c] for r, c in zip(ROWS, PROMPTS)])
    write_rows(draft, 0, loc, g)
    fb = forward_batch("DECODE", ROWS, PROMPTS, loc, draft_tokens=NDRAFT)
    q, topk = query(g, len(ROWS)), causal_topk(g, [c - 1 for c in PROMPTS])
    bd_extend.ess.early_plan(id(fb), 0, torch.tensor(ROWS), fb.seq_lens, topk, r2t, 0)
    with pytest.raises(RuntimeError, match="accepts_early_plans"):
        steps[0].forward_decode(q, None, None, layer(0), fb, save_kv_cache=False, topk_indices=topk)


def test_write_locations_out_of_step_are_refused():
    r2t = torch.arange(40, dtype=torch.int32).view(2, 20) + 100
    reqs, first = torch.tensor([0, 1]), torch.tensor([5, 7])
    good = torch.cat([r2t[0, 5:9], r2t[1, 7:11]])
    check_write_positions(good, reqs, first, 4, r2t, "verify")
    with pytest.raises(RuntimeError, match="out of step"):
        check_write_positions(torch.cat([r2t[0, 6:10], r2t[1, 7:11]]), reqs, first, 4, r2t, "verify")
    # the CUDA form: no host read, a device-side assertion (on CPU torch runs it at once and raises)
    check_write_positions(good, reqs, first, 4, r2t, "verify", sync=False)
    with pytest.raises(RuntimeError, match="out of step"):
        check_write_positions(torch.cat([r2t[0, 6:10], r2t[1, 7:11]]), reqs, first, 4, r2t, "verify", sync=False)
