"""Hunyuan V4's learnable sinks in the CUDA class's MTP verify (issue 34 item 4: sinks in every attention path,
MTP verify among them). The H200 default in the GPU fake (FP8 656-byte rows, flashmla_kv): TARGET_VERIFY of an
EAGLE iteration with ``attn_sink`` equals the reference written from the model's definition
(sgl_ess.attention.sink_reference: one softmax over the selected rows and the sink logit) over the same bytes,
per draft token; the same output is outside the bound of the attention without the sink (the mutation: a
verify that dropped the sink fails here). In-process, no server."""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.attention.sink_reference import sink_attention  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import FP32_U, cuda_batch, cuda_layer, dequant_flashmla_fp8, reference  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401
from .test_cuda_verify_gpu_fake import LAYERS, NDRAFT, _write, fp8_mtp, prefill  # noqa: E402,F401

pytestmark = pytest.mark.integration
BF16_ULP = 2.0 ** -8


def _rows(runner, layer_id, tok_req, topk):
    """The FP8 rows each query token selects, as FlashMLA reads them (float64), and their mask."""
    r2t = runner.req_to_token_pool.req_to_token
    locs = torch.where(topk >= 0, r2t[tok_req.unsqueeze(1), topk.long().clamp(min=0)].long(), -1)
    kv = dequant_flashmla_fp8(runner.token_to_kv_pool.get_key_buffer(layer_id), fr.KV_LORA)   # its 656-byte rows
    return kv[locs.clamp(min=0)].double().masked_fill((locs < 0).unsqueeze(-1), 0.0), locs >= 0


def test_fp8_mtp_verify_counts_the_sink(fp8_mtp):
    hot, backend, runner, stub = fp8_mtp
    gen = torch.Generator().manual_seed(34)
    rows, prompts = [1, 2], [150, 90]
    r2t = prefill(backend, runner, rows, prompts, gen)     # opens and warms the hot buffers
    committed, accept = list(prompts), [[2, 3], [4, 1]]
    tok_req = torch.repeat_interleave(torch.tensor(rows), NDRAFT)
    checked = 0
    for it in range(2):
        win = torch.cat([r2t[r, c:c + NDRAFT] for r, c in zip(rows, committed)]).long()
        fb = cuda_batch("TARGET_VERIFY", rows, committed, win)
        fb.spec_info = SimpleNamespace(draft_token_num=NDRAFT)
        backend.init_forward_metadata(fb)
        qpos = [c + j for c in committed for j in range(NDRAFT)]
        for li in range(LAYERS):
            _write(runner, [li], win, gen)
            q, topk = fr.query(gen, len(qpos)), fr.causal_topk(gen, qpos)
            plain = reference(runner, li, q, tok_req, topk)
            kv, valid = _rows(runner, li, tok_req, topk)
            q3 = q.view(-1, fr.HEADS, fr.KV_DIM)
            scores = torch.einsum("thd,tkd->thk", q3.double(), kv) * fr.KV_DIM ** -0.5
            lse = torch.logsumexp(scores.masked_fill(~valid.unsqueeze(1), float("-inf")), dim=2).mean(0)
            sink = (lse + torch.randn(fr.HEADS, generator=gen, dtype=torch.float64)).float()
            out = backend.forward_extend(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk,
                                         attn_sink=sink)
            want = sink_attention(q3, kv, valid, sink, fr.KV_LORA, fr.KV_DIM ** -0.5)
            got = out.float().reshape(want.shape).double()
            # two BF16 roundings: FlashMLA's output (one call per layer, without the sink: its log-sum-exp is
            # returned), then that output times the sink's float32 weight w <= 1 (reference.with_sink); each is
            # u * |want| per entry after the weight, plus the weight's float32 arithmetic
            bound = 2 * float(want.abs().max()) * BF16_ULP + 4 * FP32_U * float(plain.abs().max()) + 1e-6
            err = float((got - want).abs().max())
            assert err <= bound, f"iteration {it} layer {li}: {err:.3g} from the sink reference (bound {bound:.3g})"
            dropped = float((got - plain.reshape(want.shape)).abs().max())
            assert dropped > bound, f"iteration {it} layer {li}: the output is also the attention without the sink"
            checked += 1
        committed = [c + a for c, a in zip(committed, accept[it])]
    assert checked == 2 * LAYERS
