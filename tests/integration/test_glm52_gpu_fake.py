"""GLM-5.2 shared-index layers through the CUDA backend class in the GPU fake (test_cuda_backend_gpu_fake.py:
cuda_backend.py's subclass of SGLang's DSA backend on this CPU, FlashMLA swapped for a torch reference, the
side-stream engine with its streams completing work late and out of order). 5 layers, indexer_types
full / shared / shared / full / shared: SGLang's indexer hook runs at the anchors (0 and 3) only, and ESS
plans every layer of the anchor's group there. Checked: every layer's plan is early (none made inside
attention), one resolver call per anchor and step, and every layer's decode output equals a dense torch
reference over the true rows (bound: the DA split's BF16 roundings, as in the DeepSeek test). Also the
pool adapter's groups from the config (indexer_types; none for GLM-5 / 5.1, whose store stays per layer),
and with speculative decoding on (SGLang's spec args published) none either: every layer keeps its own LRU,
the shared-index layers planned inside attention as before groups existed, and decode gives the same outputs
as the grouped store."""

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends import cuda_backend  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from . import test_cuda_backend_gpu_fake as base  # noqa: E402
from ._cuda_fake import cuda_batch, cuda_layer, reference, split_bound  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401

INDEXER_TYPES = ["full", "shared", "shared", "full", "shared"]
LAYERS, ANCHORS = len(INDEXER_TYPES), [0, 3]


def _patch_glm52(monkeypatch):
    make_runner = base.cuda_runner

    def glm52_runner(*a, **kw):
        runner = make_runner(*a, **kw)
        hf = runner.model_config.hf_config
        hf.architectures, hf.indexer_types, hf.num_hidden_layers = ["GlmMoeDsaForCausalLM"], INDEXER_TYPES, LAYERS
        return runner

    monkeypatch.setattr(base, "cuda_runner", glm52_runner)
    monkeypatch.setattr(base, "LAYERS", LAYERS)


@pytest.fixture
def glm52_gpu_fake(ess_env, monkeypatch):          # noqa: F811
    _patch_glm52(monkeypatch)
    yield from base._gpu_fake("flashmla_sparse", ess_env, monkeypatch)


def _anchor_topk(gen, qpos, layer, cache):
    if layer in ANCHORS:
        cache["topk"] = fr.causal_topk(gen, qpos)
    return cache["topk"]


STEPS = 4


def _prefill_and_decode(backend, runner, monkeypatch) -> tuple[list, list]:
    """Prefill 2 requests, then STEPS decode steps through every layer, the indexer hook at the anchors
    only (as SGLang runs it); every decode output checked against the dense reference. Returns (the decode
    outputs, the store's resolver calls per step)."""
    from sglang.srt.model_executor import forward_context

    store = backend.ess.store
    monkeypatch.setattr(forward_context, "get_attn_backend", lambda: backend)
    monkeypatch.setattr(forward_context, "get_req_to_token_pool", lambda: runner.req_to_token_pool)
    gen = torch.Generator().manual_seed(21)
    rows, prompts, steps = [1, 2], [150, 90], STEPS
    r2t = runner.req_to_token_pool.req_to_token
    fr.place_requests(runner.req_to_token_pool, rows, [p + steps for p in prompts])
    base._write(runner, rows, [p + steps for p in prompts], gen)
    # prefill: the last CHUNK tokens; a shared-index layer gets its anchor's top-k, as in SGLang
    chunk = base.CHUNK
    fb = cuda_batch("EXTEND", rows, prompts, torch.cat([r2t[r, p - chunk:p] for r, p in zip(rows, prompts)]),
                    extend_lens=[chunk] * len(rows), prefix_lens=[p - chunk for p in prompts])
    backend.init_forward_metadata(fb)
    qpos = [p - chunk + j for p in prompts for j in range(chunk)]
    cache = {}
    for li in range(LAYERS):
        topk = _anchor_topk(gen, qpos, li, cache)
        backend.forward_extend(fr.query(gen, len(qpos)), None, None, cuda_layer(li), fb, save_kv_cache=False,
                               topk_indices=topk)
    outs, calls = [], []
    for step in range(steps):
        seq = [p + 1 + step for p in prompts]
        loc = torch.stack([r2t[r, s - 1] for r, s in zip(rows, seq)]).long()
        fb = cuda_batch("DECODE", rows, seq, loc)
        backend.init_forward_metadata(fb)
        before = store.resolver_calls
        for li in range(LAYERS):
            topk = _anchor_topk(gen, [s - 1 for s in seq], li, cache)
            if li in ANCHORS:          # SGLang's indexer runs here only; the hook hands its top-k to ESS
                cuda_backend._around_indexer_forward_cuda(lambda *a, _t=topk, **k: _t, None, None, None, None, fb, li)
            q = fr.query(gen, len(rows))
            out = backend.forward_decode(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
            want, st = reference(runner, li, q, torch.tensor(rows), topk, stats=True)
            err = float((out.float().reshape(want.shape) - want).abs().max())
            assert err <= split_bound(want, st), f"step {step} layer {li}: {err:.3g} from the reference"
            outs.append(out.clone())
        calls.append(store.resolver_calls - before)
    return outs, calls


def test_glm52_every_layer_planned_early_at_its_anchor(glm52_gpu_fake, monkeypatch):
    backend, runner, _ = glm52_gpu_fake
    ess, store = backend.ess, backend.ess.store
    assert store.cfg.anchors == (0, 0, 0, 3, 3) and store.engine.ordered_on_device
    _, calls = _prefill_and_decode(backend, runner, monkeypatch)
    assert calls == [len(ANCHORS)] * STEPS, "one resolver call per anchor and step"
    u = ess.usage()
    assert u["plans_late_by_layer"] == [0] * LAYERS, u["plans_late_by_layer"]
    assert u["plans_early_by_layer"] == [STEPS] * LAYERS, u["plans_early_by_layer"]
    assert u["misses_per_layer"][0] == u["misses_per_layer"][1] == u["misses_per_layer"][2] > 0, u["misses_per_layer"]


def test_glm52_with_speculative_decoding_keeps_a_lru_per_layer(spec, ess_env, monkeypatch, caplog):  # noqa: F811
    """SGLang's spec args published (EAGLE, 4 draft tokens): the store has no groups, the shared-index layers
    plan inside attention (late) with a resolver call of their own, and decode gives exactly the outputs of the
    grouped store (no spec) on the same requests and top-k: the same rows, attended in the same order."""
    import logging

    from sgl_ess.integration.sglang.pools import pool_adapter

    _patch_glm52(monkeypatch)
    runs = {}
    for algo in (None, "EAGLE"):
        spec.speculative_algorithm, spec.speculative_num_draft_tokens = algo, 4 if algo else None
        monkeypatch.setattr(pool_adapter, "_warned_speculative", False)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sgl_ess"):
            fake = base._gpu_fake("flashmla_sparse", ess_env, monkeypatch)
            backend, runner, _ = next(fake)
        warned = [r for r in caplog.records if "with --speculative-algorithm: shared-index layers keep their own "
                  "LRU and plan their fetch inside attention" in r.getMessage()]
        assert [r.levelno for r in warned] == ([logging.WARNING] if algo else []), [r.getMessage() for r in warned]
        try:
            outs, calls = _prefill_and_decode(backend, runner, monkeypatch)
            runs[algo] = (backend.ess.store.cfg, outs, calls, backend.ess.usage())
        finally:
            next(fake, None)
    grouped, per_layer = runs[None], runs["EAGLE"]
    assert grouped[0].anchors == (0, 0, 0, 3, 3)
    assert per_layer[0].layer_anchors == () and per_layer[0].anchors == tuple(range(LAYERS))
    assert per_layer[2] == [LAYERS] * STEPS, "one resolver call per layer and step"
    u = per_layer[3]
    shared = [i for i in range(LAYERS) if i not in ANCHORS]
    assert [u["plans_early_by_layer"][i] for i in ANCHORS] == [STEPS] * len(ANCHORS), u["plans_early_by_layer"]
    assert [u["plans_late_by_layer"][i] for i in shared] == [STEPS] * len(shared), u["plans_late_by_layer"]
    assert [u["plans_early_by_layer"][i] for i in shared] == [0] * len(shared), u["plans_early_by_layer"]
    # each layer's own LRU sees its anchor's top-k: the same misses as the grouped table
    assert u["misses_per_layer"] == grouped[3]["misses_per_layer"], (u["misses_per_layer"], grouped[3])
    assert len(per_layer[1]) == len(grouped[1]) == STEPS * LAYERS
    for i, (a, b) in enumerate(zip(per_layer[1], grouped[1])):
        assert torch.equal(a, b), f"step {i // LAYERS} layer {i % LAYERS}: spec per-layer != grouped"


def _glm_runner(indexer_types):
    req_pool, alloc = fr.shared_pools()
    runner = fr.fake_runner(req_pool, alloc, len(indexer_types))
    hf = runner.model_config.hf_config
    hf.architectures, hf.num_hidden_layers = ["GlmMoeDsaForCausalLM"], len(indexer_types)
    hf.indexer_types = indexer_types
    return runner


@pytest.fixture
def spec(monkeypatch):
    """SGLang's speculative-decoding settings as the adapter reads them (none: plain decode)."""
    from types import SimpleNamespace

    from sglang.srt import runtime_context

    s = SimpleNamespace(speculative_algorithm=None, speculative_num_draft_tokens=None)
    monkeypatch.setattr(runtime_context, "get_spec", lambda: s)
    monkeypatch.setattr(runtime_context, "max_speculative_num_draft_tokens", lambda: s.speculative_num_draft_tokens)
    return s


def test_glm52_groups_from_indexer_types_and_none_for_glm5(spec):
    from sgl_ess.config import EssConfig
    from sgl_ess.integration.sglang.pools.pool_adapter import EssPoolAdapter

    cfg = EssConfig(hot_slots_per_request=24, prefetch_engine="inline")
    assert EssPoolAdapter(_glm_runner(INDEXER_TYPES), cfg).store_cfg.anchors == (0, 0, 0, 3, 3)
    # GLM-5 / 5.1: every layer has its indexer, so no groups: the per-layer store as before
    assert EssPoolAdapter(_glm_runner(["full"] * 3), cfg).store_cfg.layer_anchors == ()
    # speculative decoding on: no groups for either (a per-layer LRU, the shared layers planned late)
    spec.speculative_algorithm, spec.speculative_num_draft_tokens = "EAGLE", 4
    assert EssPoolAdapter(_glm_runner(INDEXER_TYPES), cfg).store_cfg.layer_anchors == ()
    assert EssPoolAdapter(_glm_runner(["full"] * 3), cfg).store_cfg.layer_anchors == ()
