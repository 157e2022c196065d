"""Issue 35 item 1, GPU fake: DA and DBA with FlashMLA. The CUDA backend class that ships on a GPU, on
this CPU, decodes through SGLang's two FlashMLA decodes (the stand-ins of tests/integration/_cuda_fake.py,
which return FlashMLA's log-sum-exp in FlashMLA's own conventions: flash_mla_with_kvcache [b, h, s_q]
natural log, flash_mla_sparse_fwd [s_q, h] base 2, +inf for a query with no valid index) at every overlap
level: none (one call after the fetch), da (the hits' call, then the misses' call once their fetch
landed, merged by LSE), dba (the same per half batch, each half its own fetch). flashmla_kv reads the
H200's default FP8 656-byte rows (the pool holds SGLang's quantizer's bytes), flashmla_sparse BF16 rows
(the rows that kernel reads; FP8 rows are refused with a clear error).

The stream engine's streams are LateStreams (tests/stream_doubles.py): side-stream work runs only when
the compute stream waits for it, so a call that read the misses before their fetch landed would read
stale rows and miss the dense reference, and the log of launches shows what ran when. The indexer's
hand-off (the hook on Indexer.forward_cuda) plans each layer, as on a GPU.
"""

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.cuda_backend import _around_indexer_forward_cuda, backend_class  # noqa: E402
from sgl_ess.prefetch.stream_engine import StreamEngine  # noqa: E402
from tests.stream_doubles import LateStreams  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import BF16_U, cuda_batch, cuda_layer, cuda_runner, install_gpu_fakes, reference, split_bound  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401

LAYERS, CHUNK, STEPS = 2, 16, 2
ROWS, PROMPTS = [1, 2, 3, 4], [150, 90, 200, 120]
KERNEL = {"flashmla_kv": "flash_mla_with_kvcache", "flashmla_sparse": "flash_mla_sparse_fwd"}
CALLS_PER_LAYER = {"none": 1, "da": 2, "dba": 4}      # FlashMLA calls per decode layer (2 halves x 2 parts)
PLANS_PER_LAYER = {"none": 0, "da": 1, "dba": 2}      # plans the indexer hand-off submits


class LoggedStreams(LateStreams):
    """LateStreams that log, into `log`, each launch on the stream engine's copy stream (a fetch) and
    when it runs: ("submit", k) when the host queues it, ("fetched", k) when the stream reaches it."""

    def __init__(self, log: list):
        super().__init__(seed=5)
        self.log = log
        self.fetch_stream = None
        self.n = 0

    def launch(self, stream, fn):
        if stream is not self.fetch_stream:
            return super().launch(stream, fn)
        k = self.n
        self.n += 1
        self.log.append(("submit", k))

        def run():
            self.log.append(("fetched", k))
            return fn()
        return super().launch(stream, run)


@pytest.fixture(params=[(impl, level) for impl in KERNEL for level in CALLS_PER_LAYER],
                ids=lambda p: f"{p[0]}-{p[1]}")
def overlap_fake(request, ess_env, monkeypatch):
    from sglang.srt.model_executor import forward_context
    from sglang.srt.runtime_context import get_parallel

    impl, level = request.param
    ess_env(hot_slots_per_request=24, prefetch_overlap_level=level)
    fp8 = impl == "flashmla_kv"
    stub, ov = install_gpu_fakes(monkeypatch, decode_impl=impl, prefill_impl="flashmla_auto" if fp8 else "flashmla_sparse")
    log: list = []
    original = getattr(stub, KERNEL[impl])

    def logged_kernel(*a, **k):
        log.append(("attn",))
        return original(*a, **k)
    setattr(stub, KERNEL[impl], logged_kernel)
    with get_parallel().override(attn_dcp_rank=0):
        req_pool, alloc = fr.shared_pools()
        runner = cuda_runner(req_pool, alloc, LAYERS, fp8_pool=fp8)
        backend = backend_class()(runner)
        assert backend.dsa_decode_impl == impl and backend.dsa_kv_cache_store_fp8 == fp8
        store = backend.ess.store
        rt = LoggedStreams(log)
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=rt, zero_backend="torch")
        rt.fetch_stream = store.engine.stream
        monkeypatch.setattr(forward_context, "get_attn_backend", lambda: backend)
        monkeypatch.setattr(forward_context, "get_req_to_token_pool", lambda: runner.req_to_token_pool)
        yield backend, runner, level, log
    ov.restore()


def _write(runner, lengths, gen):
    """Each position's latent through the pool's writer (FP8: SGLang's quantizer)."""
    r2t = runner.req_to_token_pool.req_to_token
    for li in range(LAYERS):
        for r, n in zip(ROWS, lengths):
            x = torch.randn(n, fr.KV_DIM, generator=gen) * torch.rand(n, 1, generator=gen) * 4
            runner.token_to_kv_pool.set_mla_kv_buffer(cuda_layer(li), r2t[r, :n], x[:, :fr.KV_LORA].to(torch.bfloat16),
                                                      x[:, fr.KV_LORA:].to(torch.bfloat16))


def _prefill(backend, runner, gen):
    r2t = runner.req_to_token_pool.req_to_token
    fb = cuda_batch("EXTEND", ROWS, PROMPTS, torch.cat([r2t[r, p - CHUNK:p] for r, p in zip(ROWS, PROMPTS)]),
                    extend_lens=[CHUNK] * len(ROWS), prefix_lens=[p - CHUNK for p in PROMPTS])
    backend.init_forward_metadata(fb)
    qpos = [p - CHUNK + j for p in PROMPTS for j in range(CHUNK)]
    for li in range(LAYERS):
        backend.forward_extend(fr.query(gen, len(qpos)), None, None, cuda_layer(li), fb, save_kv_cache=False,
                               topk_indices=fr.causal_topk(gen, qpos))
    backend.ess.store.engine.drain()


def _topk(gen, kept: torch.Tensor, seq) -> torch.Tensor:
    """Per request: the positions `kept` [b, k/2] (read by every step: hits after the first) and k/2 fresh
    ones from the second half of its history (mostly misses), distinct."""
    half = fr.TOPK // 2
    fresh = [torch.randperm(s - p // 2, generator=gen)[:half] + p // 2 for p, s in zip(PROMPTS, seq)]
    return torch.cat([kept, torch.stack(fresh).to(torch.int32)], dim=1)


def test_gpu_fake_flashmla_overlap_levels_equal_the_dense_reference_and_wait_only_on_their_fetch(overlap_fake):
    backend, runner, level, log = overlap_fake
    ess = backend.ess
    assert ess.mode(0) == level, "the stream engine is asynchronous: the level runs as configured"
    gen = torch.Generator().manual_seed(35)
    fr.place_requests(runner.req_to_token_pool, ROWS, [p + STEPS for p in PROMPTS])
    _write(runner, [p + STEPS for p in PROMPTS], gen)
    _prefill(backend, runner, gen)
    r2t = runner.req_to_token_pool.req_to_token
    kept = [torch.stack([torch.randperm(p // 2, generator=gen)[:fr.TOPK // 2] for p in PROMPTS]).to(torch.int32)
            for _ in range(LAYERS)]
    hits0 = int(ess.store.counters.hits.sum())
    for step in range(STEPS):
        seq = [p + 1 + step for p in PROMPTS]
        fb = cuda_batch("DECODE", ROWS, seq, torch.stack([r2t[r, s - 1] for r, s in zip(ROWS, seq)]).long())
        backend.init_forward_metadata(fb)
        for li in range(LAYERS):
            topk, q = _topk(gen, kept[li], seq), fr.query(gen, len(ROWS))
            early = ess.plans_early
            log.clear()
            _around_indexer_forward_cuda(lambda *a, **k: topk, None, None, None, None, fb, li)   # SGLang's indexer
            out = backend.forward_decode(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
            want, st = reference(runner, li, q, torch.tensor(ROWS), topk, stats=True)
            err = float((out.float().reshape(want.shape) - want).abs().max())
            bound = BF16_U * float(want.abs().max()) + 1e-6 if level == "none" else split_bound(want, st)
            assert err <= bound, f"{level} step {step} layer {li}: {err:.3g} from the dense reference (bound {bound:.3g})"
            attn = [i for i, e in enumerate(log) if e == ("attn",)]
            assert len(attn) == CALLS_PER_LAYER[level], log
            assert ess.plans_early - early == PLANS_PER_LAYER[level]
            if level == "none":
                continue
            # the parts' fetches, queued by the indexer hand-off before any attention (later launches on the
            # copy stream are the commit's)
            fetches = [e[1] for e in log[:attn[0]] if e[0] == "submit"]
            assert len(fetches) == PLANS_PER_LAYER[level], log
            for p, k in enumerate(fetches):   # part p's fetch: queued before its hits' call, run between its calls
                hits_call, misses_call = attn[2 * p], attn[2 * p + 1]
                assert log.index(("submit", k)) < hits_call < log.index(("fetched", k)) < misses_call, log
            if level == "dba":           # half 0's misses waited on half 0's fetch only
                assert log.index(("fetched", fetches[1])) > attn[1], log
    assert int(ess.store.counters.hits.sum()) > hits0 and int(ess.store.counters.misses.sum()) > 0


def test_gpu_fake_flashmla_sparse_refuses_fp8_rows(ess_env, monkeypatch):
    """FlashMLA's sparse kernel reads BF16 rows: over the FP8 pool it would read codes as values."""
    from sglang.srt.runtime_context import get_parallel

    from sgl_ess.integration.sglang.backends import flashmla_lse

    install_gpu_fakes(monkeypatch, decode_impl="flashmla_kv")      # FP8 rows exist for the V3.2 width only
    with get_parallel().override(attn_dcp_rank=0):
        req_pool, alloc = fr.shared_pools()
        backend = backend_class()(cuda_runner(req_pool, alloc, LAYERS, fp8_pool=True))
    q3 = torch.zeros(1, fr.HEADS, fr.KV_DIM, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="flashmla_kv for FP8 rows"):
        flashmla_lse.decode_sparse(backend, q3, None, torch.zeros(1, fr.TOPK, dtype=torch.int32), cuda_layer(0))


def test_the_flashmla_calls_match_sglangs_flash_mla_interface_and_backend():
    """flashmla_lse.py calls SGLang's flash_mla_interface itself (SGLang's wrappers drop the LSE) and reads
    the DSA backend's own fields: an upgrade that renames a parameter or field, or changes the sparse
    kernel's LSE base, fails here rather than on the first GPU run. The interface module imports FlashMLA's
    wheel (CUDA only), so its source is read, not imported."""
    import ast
    import inspect
    import pathlib

    import sglang
    from sglang.srt.layers.attention import dsa_backend as mod

    path = pathlib.Path(sglang.__file__).parent / "kernels" / "ops" / "attention" / "flash_mla_interface.py"
    source = path.read_text()
    fns = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}

    def params(name):
        a = fns[name].args
        return {x.arg for x in a.args + a.kwonlyargs}

    assert {"q", "k_cache", "cache_seqlens", "head_dim_v", "tile_scheduler_metadata", "num_splits", "softmax_scale",
            "indices", "block_table", "is_fp8_kvcache", "kv_format"} <= params("flash_mla_with_kvcache")
    assert {"q", "kv", "indices", "sm_scale", "d_v", "attn_sink", "topk_length"} <= params("flash_mla_sparse_fwd")
    sparse = ast.get_source_segment(source, fns["flash_mla_sparse_fwd"])
    assert "use_legacy: bool = True" in sparse and "return_log2_lse=True if use_legacy" in sparse   # base-2 LSE
    B = mod.DeepseekSparseAttnBackend
    assert list(inspect.signature(B._compute_flashmla_metadata).parameters)[1:] == ["cache_seqlens", "seq_len_q"]
    init = inspect.getsource(B.__init__)
    for field in ("flashmla_kv_num_q_heads", "physical_page_size", "kv_cache_dim", "dsa_index_topk",
                  "flashmla_kv_format", "device_sm_major", "dsa_kv_cache_store_fp8"):
        assert f"self.{field} =" in init or f"self.{field}: " in init, field
    assert callable(mod.quantize_k_cache)
