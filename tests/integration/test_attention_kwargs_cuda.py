"""The CUDA class with ESS on (cuda_backend.py, GPU fake) serves Hunyuan V4's learnable sinks: its decode
called FlashMLA with ``attn_sink=None`` and dropped them silently, then refused them; now the sink reaches
the store's decode (partial attentions without it, added once after the DA merge), checked against the
reference written from the model's definition (sgl_ess.attention.sink_reference) over the same rows, and
the same output is outside the bound of the attention without the sink (the mutation). A feature it does
not implement is still refused before any kernel runs. In-process, no server (the GPU fake of
tests/integration/test_cuda_backend_gpu_fake.py)."""

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.attention.sink_reference import sink_attention  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import (FP32_U, cuda_batch, cuda_layer, dequant_flashmla_fp8, ref_quantize_k_cache,  # noqa: E402
                         reference, split_bound)
from ._spec_fixtures import ess_env  # noqa: E402,F401
from .test_cuda_backend_gpu_fake import LAYERS, _prefill, _write, gpu_fake  # noqa: E402,F401

pytestmark = pytest.mark.integration


def _sink_reference(runner, layer_id, q, row, topk, sink, fp8):
    """sink_attention over the rows `reference` reads (the same bytes; FP8 as the kernel read them)."""
    r2t = runner.req_to_token_pool.req_to_token
    locs = torch.where(topk >= 0, r2t[row, topk.long().clamp(min=0)].long(), -1)
    kv = runner.token_to_kv_pool.get_key_buffer(layer_id).reshape(-1, fr.KV_DIM)
    if fp8:
        kv = dequant_flashmla_fp8(ref_quantize_k_cache(kv, fr.KV_LORA), fr.KV_LORA)
    rows = kv[locs.clamp(min=0)].double().masked_fill((locs < 0).unsqueeze(-1), 0.0)
    return sink_attention(q.view(-1, fr.HEADS, fr.KV_DIM), rows, locs >= 0, sink, fr.KV_LORA, fr.KV_DIM ** -0.5)


def test_cuda_class_decode_counts_the_sink_once(gpu_fake):
    backend, runner, stub = gpu_fake
    gen = torch.Generator().manual_seed(5)
    rows, prompts = [1], [120]
    fr.place_requests(runner.req_to_token_pool, rows, [p + 4 for p in prompts])
    _write(runner, rows, [p + 4 for p in prompts], gen)
    _prefill(backend, runner, rows, prompts, gen)
    r2t = runner.req_to_token_pool.req_to_token
    fp8 = backend.dsa_decode_impl == "flashmla_kv"
    checked = 0
    for step in range(3):
        seq = [prompts[0] + 1 + step]
        fb = cuda_batch("DECODE", rows, seq, torch.stack([r2t[1, seq[0] - 1]]).long())
        backend.init_forward_metadata(fb)
        for li in range(LAYERS):
            q, topk = fr.query(gen, 1), fr.causal_topk(gen, [seq[0] - 1])
            plain, st = reference(runner, li, q, torch.tensor(rows), topk, fp8=fp8, stats=True)
            # sinks near the heads' log-sum-exp, so the sink takes a good share of the softmax
            lse = torch.logsumexp(torch.einsum("hd,kd->hk", q.view(fr.HEADS, fr.KV_DIM).double(),
                                               runner.token_to_kv_pool.get_key_buffer(li).reshape(-1, fr.KV_DIM)[
                                                   r2t[1, topk[0].long().clamp(min=0)]].double()) * fr.KV_DIM ** -0.5,
                                  dim=1)
            sink = (lse + torch.randn(fr.HEADS, generator=gen, dtype=torch.float64)).float()
            out = backend.forward_decode(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk,
                                         attn_sink=sink)
            want = _sink_reference(runner, li, q, 1, topk, sink, fp8)
            # the split decode's bound without the sink (BF16 partial outputs, LSE merge); the sink scales the
            # merged output by a weight in (0, 1] (no larger error) in one more float32 product
            bound = split_bound(plain, st) + 4 * FP32_U * float(plain.abs().max())
            got = out.float().reshape(want.shape).double()
            err = float((got - want).abs().max())
            assert err <= bound, f"step {step} layer {li}: {err:.3g} from the sink reference (bound {bound:.3g})"
            dropped = float((got - plain.reshape(want.shape)).abs().max())
            assert dropped > bound, f"step {step} layer {li}: the output is also the attention without the sink"
            checked += 1
    assert checked == 3 * LAYERS


def test_cuda_class_still_refuses_what_it_does_not_implement(gpu_fake):
    backend, runner, stub = gpu_fake
    gen = torch.Generator().manual_seed(6)
    rows, prompts = [1], [120]
    fr.place_requests(runner.req_to_token_pool, rows, [p + 2 for p in prompts])
    _write(runner, rows, [p + 2 for p in prompts], gen)
    _prefill(backend, runner, rows, prompts, gen)
    r2t = runner.req_to_token_pool.req_to_token
    seq = [prompts[0] + 1]
    fb = cuda_batch("DECODE", rows, seq, torch.stack([r2t[1, seq[0] - 1]]).long())
    backend.init_forward_metadata(fb)
    q, topk = fr.query(gen, 1), fr.causal_topk(gen, [seq[0] - 1])
    calls = len(stub.calls)
    with pytest.raises(NotImplementedError, match="return_lse=True"):
        backend.forward_decode(q, None, None, cuda_layer(0), fb, save_kv_cache=False, topk_indices=topk,
                               return_lse=True)
    assert len(stub.calls) == calls, "FlashMLA ran before the refusal"
