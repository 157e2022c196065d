"""Issue 32, defect 6: the H200's default configuration - FP8 656-byte rows (--kv-cache-dtype fp8_e4m3,
SGLang's dsa_kv_cache_store_fp8) decoded by flashmla_kv, prefill by SGLang's own auto dispatch - run
through the CUDA class on this CPU with the real bytes: the pool holds SGLang's quantizer's output
(ref_quantize_k_cache, its kernel's formula), the store moves those bytes untouched into the slot
space FlashMLA sees (as_kv_cache: float8_e4m3fn [S, 1, 656], viewed by SGLang as [-1, 64, 1, 656],
is_fp8_kvcache=True), and the FlashMLA stand-in reads them back by FlashMLA's documented layout
(dequant_flashmla_fp8). The dense truth dequantizes the pool's own bytes the same way, so both read
identical values and accumulate in float64: the bound is one BF16 rounding of the output, no FP8
error term. Before issue 32 the fake set SGLang's quantizer to identity and read BF16 rows."""

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.cuda_backend import backend_class  # noqa: E402
from sgl_ess.kernels.latent_layout import LatentLayout  # noqa: E402
from sgl_ess.prefetch.stream_engine import StreamEngine  # noqa: E402
from tests.stream_doubles import LateStreams  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import (cuda_batch, cuda_layer, cuda_runner, dequant_flashmla_fp8, install_gpu_fakes,  # noqa: E402
                         ref_quantize_k_cache, reference, split_bound)
from ._spec_fixtures import ess_env  # noqa: E402,F401

LAYERS, CHUNK = 2, 16
BF16_ULP = 2.0 ** -8


@pytest.fixture
def fp8_fake(ess_env, monkeypatch):
    from sglang.srt.runtime_context import get_parallel

    ess_env(hot_slots_per_request=24)
    stub, ov = install_gpu_fakes(monkeypatch, decode_impl="flashmla_kv", prefill_impl="flashmla_auto")
    with get_parallel().override(attn_dcp_rank=0):
        req_pool, alloc = fr.shared_pools()
        runner = cuda_runner(req_pool, alloc, LAYERS, fp8_pool=True)
        backend = backend_class()(runner)
        store = backend.ess.store
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=LateStreams(), zero_backend="torch")
        yield backend, runner, stub
    ov.restore()


def _bound(want):
    return float(want.abs().max()) * BF16_ULP + 1e-6


def _write(runner, rows, lengths, gen):
    """Each position's latent through the pool's writer (SGLang's FP8 quantizer)."""
    r2t = runner.req_to_token_pool.req_to_token
    pool = runner.token_to_kv_pool
    for li in range(LAYERS):
        for r, n in zip(rows, lengths):
            x = torch.randn(n, fr.KV_DIM, generator=gen) * torch.rand(n, 1, generator=gen) * 4
            pool.set_mla_kv_buffer(cuda_layer(li), r2t[r, :n], x[:, :fr.KV_LORA].to(torch.bfloat16),
                                   x[:, fr.KV_LORA:].to(torch.bfloat16))


def test_quantizer_and_flashmla_layout_agree_with_ess_latent_layout():
    """Three independent readings of one format: SGLang's writer formula (ref_quantize_k_cache), FlashMLA's
    documented layout (dequant_flashmla_fp8) and ESS's own LatentLayout give the same bytes and values."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 576, generator=g) * torch.rand(64, 1, generator=g) * 20).to(torch.bfloat16)
    theirs = ref_quantize_k_cache(x, 512).view(torch.uint8)
    lay = LatentLayout("fp8_flashmla", 512, 64)
    assert theirs.shape == (64, 656) and torch.equal(theirs, lay.encode(x.float()))
    assert torch.equal(dequant_flashmla_fp8(theirs, 512), lay.decode(theirs))


def test_fp8_rows_prefill_and_decode_read_the_same_bytes_as_the_truth(fp8_fake):
    backend, runner, stub = fp8_fake
    assert backend.dsa_kv_cache_store_fp8 and backend.ess.latent_layout().kind == "fp8_flashmla"
    gen = torch.Generator().manual_seed(21)
    rows, prompts = [1, 2], [150, 90]
    fr.place_requests(runner.req_to_token_pool, rows, [p + 3 for p in prompts])
    _write(runner, rows, [p + 3 for p in prompts], gen)
    r2t = runner.req_to_token_pool.req_to_token
    fb = cuda_batch("EXTEND", rows, prompts, torch.cat([r2t[r, p - CHUNK:p] for r, p in zip(rows, prompts)]),
                    extend_lens=[CHUNK] * 2, prefix_lens=[p - CHUNK for p in prompts])
    backend.init_forward_metadata(fb)
    assert backend.dsa_prefill_impl == "flashmla_kv" and not backend.use_mha   # SGLang's auto pick for FP8
    qpos = [p - CHUNK + j for p in prompts for j in range(CHUNK)]
    tok_req = torch.repeat_interleave(torch.tensor(rows), CHUNK)
    for li in range(LAYERS):
        topk, q = fr.causal_topk(gen, qpos), fr.query(gen, len(qpos))
        out = backend.forward_extend(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
        want = reference(runner, li, q, tok_req, topk)
        err = float((out.float().view_as(want) - want).abs().max())
        assert err <= _bound(want), f"FP8 prefill layer {li}: {err:.3g} from the truth over the same bytes"
    store = backend.ess.store
    store.engine.drain()
    assert all(bool(store.hot.is_open[r]) for r in rows) and int(store.counters.warmup_rows.sum()) > 0
    for step in range(3):
        seq = [p + 1 + step for p in prompts]
        fb = cuda_batch("DECODE", rows, seq, torch.stack([r2t[r, s - 1] for r, s in zip(rows, seq)]).long())
        backend.init_forward_metadata(fb)
        for li in range(LAYERS):
            topk, q = fr.causal_topk(gen, [s - 1 for s in seq]), fr.query(gen, len(rows))
            out = backend.forward_decode(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
            want, st = reference(runner, li, q, torch.tensor(rows), topk, stats=True)
            err = float((out.float().reshape(want.shape) - want).abs().max())
            # the default level (da) splits the attention into two FlashMLA calls with BF16 outputs
            assert err <= split_bound(want, st), f"FP8 decode step {step} layer {li}: {err:.3g} from the truth"
    assert "fp8_kvcache" in stub.calls and "flash_mla_sparse_fwd" not in stub.calls
    assert int(store.counters.hits.sum()) > 0, "decode never read a hot slot"
