"""DeepSeek-V4 with ESS on, MTP verify (issue 37 item 2), in process: the CPU dsv4 arm's TARGET_VERIFY with its C4
entries in ESS's host store against the same arm with ESS off on the same inputs, bit for bit.

Three requests at scattered paged locations extend, then verify n = 4 draft tokens per step at L .. L+3 (L the
committed length) and accept a random number of them (the next verify starts past the accepted ones, so the
rows of rejected drafts are written again before anything reads them, as in SGLang). With ESS on, each step
writes the entries its last accepted tokens finished to the host rows, computes the entries its own drafts
finish without storing them, and resolves the request's 4 top-k sets as one union against a hot buffer of 5
entries (top-3 each: the union overflows, and overflow entries are read from the host rows for that step).
Checked: every layer's output equal to ESS off, the union's misses fetched, overflow entries read, the host
store's table never holding a draft's entry (known <= committed // 4), and a draft tree refused.

On the worker engine (a real prefetch process) at each overlap level: none bit-equal to ESS off; da and dba
(the window, resident, overflow and own entries attended while the misses are in flight, then the misses,
merged by log-sum-exp with the sink once) within the float32 bound derived in test_dsv4_ess_overlap.py, the
log showing Attn0 before the wait for the misses and Attn1 after it, and dba's two halves both planned
before either attends."""

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")

from sgl_ess.integration.sglang.dsv4 import cpu_backend  # noqa: E402
from sgl_ess.integration.sglang.dsv4.pool_check import around_clear_unaccepted_c128  # noqa: E402

from .test_dsv4_cpu_backend import (D, G, HEADS, HIDDEN, compressor, forward_backends, indexer,  # noqa: E402
                                    make_backend, rnd)
from .test_dsv4_ess_overlap import _bound  # noqa: E402
from .test_dsv4_ess_store import PAGE, c4_store, paged_req_to_token  # noqa: E402

pytestmark = pytest.mark.integration
N_DRAFT = 4


def _mode(name):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return getattr(ForwardMode, name)


def _forward(backends, layers, fb, t, with_queries=False):
    """One forward of every backend on the same random inputs; returns their outputs per layer."""
    x = rnd(t, HIDDEN)
    swa = {lid: rnd(t, D) for lid in layers}
    qs = {lid: rnd(t, HEADS, D) for lid in layers}
    outs = forward_backends(backends, layers, fb, x, swa, qs)
    return (outs, qs) if with_queries else outs


def _batch(req_to_token, reqs, first, counts, mode, spec=None):
    positions = torch.cat([torch.arange(first[r], first[r] + counts[r]) for r in reqs])
    out_loc = torch.cat([req_to_token[r, first[r]:first[r] + counts[r]] for r in reqs])
    return types.SimpleNamespace(
        forward_mode=_mode(mode), seq_lens=torch.tensor([first[r] + (0 if spec else counts[r]) for r in reqs]),
        extend_seq_lens=torch.tensor([counts[r] for r in reqs]), extend_seq_lens_cpu=None, spec_info=spec,
        req_pool_indices=torch.tensor(reqs), positions=positions, out_cache_loc=out_loc)


def _start(store, req_to_token):
    """Rows 0-2 extended on ESS on (`store`) and off: the state the verify steps continue."""
    layers = {0: (0, None, None), 2: (4, compressor(4, D), indexer(2)), 3: (128, compressor(128, D), None),
              4: (4, compressor(4, D), indexer(4))}
    on, off = make_backend(req_to_token, store), make_backend(req_to_token)
    on.events = []
    # SGLang's V4 pool as the post-verify hook sees it (pool_check.around_clear_unaccepted_c128): on CPU, mapped to
    # the ESS-on backend of its runner, as DeepseekV4CpuAttnBackend.__init__ maps a real runner's pool
    pool = types.SimpleNamespace(device="cpu")
    cpu_backend._verify_finalizers[id(pool)] = on
    run = types.SimpleNamespace(on=on, off=off, layers=layers, store=store, req_to_token=req_to_token, pool=pool,
                                reqs=[0, 1, 2], committed={0: 150, 1: 3, 2: 41}, accepted=0)   # row 1: no C4 entry yet
    got, want = _forward([on, off], layers, _batch(req_to_token, run.reqs, {r: 0 for r in run.reqs}, run.committed,
                                                   "EXTEND"), sum(run.committed.values()))
    for lid in layers:
        assert torch.equal(got[lid], want[lid]), lid
    return run


def _verify_step(run, compare):
    """One verify of N_DRAFT tokens per request, compared per layer, then a random acceptance."""
    spec = types.SimpleNamespace(draft_token_num=N_DRAFT, topk=1)
    fb = _batch(run.req_to_token, run.reqs, run.committed, {r: N_DRAFT for r in run.reqs}, "TARGET_VERIFY", spec)
    (got, want), qs = _forward([run.on, run.off], run.layers, fb, N_DRAFT * len(run.reqs), with_queries=True)
    for lid in run.layers:
        if run.layers[lid][0] == 4:
            compare(got[lid], want[lid], run.off, lid, qs[lid])
        else:
            assert torch.equal(got[lid], want[lid]), lid
    before = torch.tensor([run.committed[r] for r in run.reqs])
    accept = torch.randint(0, N_DRAFT, (len(run.reqs),), generator=G) + 1   # the verified token + accepted drafts
    for r, a in zip(run.reqs, accept.tolist()):
        assert int(run.store.known[r]) <= run.committed[r] // 4, "a draft's entry entered the host store's table"
        run.accepted += a - 1
        run.committed[r] += a
    # SGLang's post-verify call (eagle_worker_common.run_eagle_verify): the accepted tokens' entries go to host
    around_clear_unaccepted_c128(None, run.pool, torch.tensor(run.reqs), before, accept, N_DRAFT)
    for r in run.reqs:
        assert int(run.store.known[r]) == run.committed[r] // 4, "an accepted token's entry is not on host"


def _run_verify(store, req_to_token, compare, steps=24):
    """An extend, then `steps` verify steps with random acceptance, on ESS on (`store`) and off; compare(on,
    off, lid, q) per C4 layer and step (window-only and C128 layers: equal). Returns (on backend, drafts
    accepted)."""
    run = _start(store, req_to_token)
    for _ in range(steps):
        _verify_step(run, compare)
    return run.on, run.accepted


def _equal(got, want, off, lid, q):
    assert torch.equal(got, want), lid


def test_c4_verify_through_host_store_equals_ess_off():
    req_to_token, pool = paged_req_to_token(3, 400)
    store = c4_store(req_to_token, pool)
    _, accepted = _run_verify(store, req_to_token, _equal)
    u = store.usage()
    assert accepted > 0
    assert u["verify_steps"] == 24 * 2 and u["single_steps"] == u["dual_steps"] == 0, u
    assert all(m > 0 for m in u["misses_per_layer"]), u
    assert u["mtp_overflow_entries"] > 0, u     # 4 top-3 sets over a hot buffer of 5


def test_c4_verify_refuses_a_draft_tree():
    req_to_token, pool = paged_req_to_token(1, 64)
    backend = make_backend(req_to_token, c4_store(req_to_token, pool))
    spec = types.SimpleNamespace(draft_token_num=N_DRAFT, topk=2)
    with pytest.raises(NotImplementedError, match="speculative-eagle-topk 1"):
        backend.init_forward_metadata(_batch(req_to_token, [0], {0: 8}, {0: N_DRAFT}, "TARGET_VERIFY", spec))


@pytest.mark.parametrize("level", ["none", "da", "dba"])
def test_c4_verify_overlap_levels_on_the_worker_engine(level):
    req_to_token, pool = paged_req_to_token(3, 400)
    store = c4_store(req_to_token, pool, engine="worker", overlap=level)
    worst = []

    def compare(got, want, off, lid, q):
        if level == "none":
            assert torch.equal(got, want), lid
        else:
            err, bound = float((got - want).abs().max()), _bound(off, lid, q)
            assert err <= bound, (lid, err, bound)
            worst.append(err / bound)

    try:
        assert store.mode(2) == level and store.store.engine.name == "worker"
        on, accepted = _run_verify(store, req_to_token, compare, steps=12)
        u = store.usage()
        assert accepted > 0 and all(m > 0 for m in u["misses_per_layer"]), u
        plans = 12 * 2 * (2 if level == "dba" else 1)          # 12 verify steps x 2 C4 layers (x 2 halves)
        assert u["verify_steps"] == plans and (u["verify_dual_steps"] > 0) == (level != "none"), u
        ev = [e for e in on.events]
        if level == "none":
            assert {e[0] for e in ev} == {"plan", "wait", "attn", "commit"}, ev[:8]
            return
        dual = [i for i, e in enumerate(ev) if e[0] == "attn0"]
        assert dual, ev
        for i in dual:                                  # Attn0, the wait for the misses, Attn1
            assert [e[0] for e in ev[i:i + 4]] == ["attn0", "wait", "attn1", "commit"], ev[i:i + 4]
        assert {e[2] for e in ev} == ({0, 1} if level == "dba" else {0})
        if level == "dba":
            for i, e in enumerate(ev):
                if e[0] == "plan" and e[2] == 0:
                    assert [x[0] for x in ev[i:i + 2]] == ["plan", "plan"] and ev[i + 1][2] == 1, ev[i:i + 3]
        print(f"{level}: worst error / bound {max(worst):.3g}")
    finally:
        store.shutdown()


def test_a_finished_requests_cached_prefix_is_whole_on_host():
    """SGLang's radix cache keeps a finished request's whole pages, its output included (multi-turn chat: the
    next turn starts after prompt + answer). The entries its accepted draft tokens finished go to the host rows
    once each verify's acceptance is known (SGLang's post-verify call), so a request that starts after that
    prefix finds every entry on host (begin_extend refuses a prefix with one missing) and equals ESS off."""
    req_to_token, pool = paged_req_to_token(4, 400)
    store = c4_store(req_to_token, pool)
    run = _start(store, req_to_token)
    for _ in range(6):
        _verify_step(run, _equal)
    u = store.usage()
    assert u["mtp_finalized_entries"] > 0, u
    prefix = run.committed[0] // PAGE * PAGE                    # whole pages of request 0's final tokens
    store.close(0)                                              # request 0 finished: SGLang frees its row
    req_to_token[3, :prefix] = req_to_token[0, :prefix]         # row 3 starts after the cached pages
    new = 20
    got, want = _forward([run.on, run.off], run.layers, _batch(req_to_token, [3], {3: prefix}, {3: new}, "EXTEND"), new)
    for lid in run.layers:
        assert torch.equal(got[lid], want[lid]), lid
    assert store.reused_entries == prefix // 4 and int(store.known[3]) == (prefix + new) // 4
