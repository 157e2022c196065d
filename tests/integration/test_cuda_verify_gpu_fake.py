"""Issue 35 item 2: MTP verify on CUDA through SGLang's sparse decode kernel over the store's slot table,
not a torch attention over decoded rows. The H200 default (FP8 656-byte rows, flashmla_kv) in the GPU
fake: TARGET_VERIFY of an EAGLE iteration reads its union by slot (hot slots, ring rows, and the window /
overflow rows copied into the slot space's MTP scratch rows: store/verify_slots.py), in ONE FlashMLA call
per layer over the expanded per-token table, as SGLang runs its own verify; equal to the dense truth
over the pool's own bytes (float64 in both, one BF16 rounding of the output). The torch path is gone
from the CUDA class (no ``gathered``; SGLang's kernel ran, the torch attention never)."""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.cuda_backend import _CudaKernels, backend_class  # noqa: E402
from sgl_ess.prefetch.stream_engine import StreamEngine  # noqa: E402
from tests.stream_doubles import LateStreams  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import cuda_batch, cuda_layer, cuda_runner, install_gpu_fakes, reference  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401

LAYERS, CHUNK, NDRAFT = 2, 16, 4
BF16_ULP = 2.0 ** -8


@pytest.fixture(params=[48, 12])        # the union of NDRAFT top-k sets fits / overflows the hot buffer
def fp8_mtp(request, ess_env, monkeypatch):
    from sglang.srt.runtime_context import get_parallel

    ess_env(hot_slots_per_request=request.param)
    stub, ov = install_gpu_fakes(monkeypatch, decode_impl="flashmla_kv", prefill_impl="flashmla_auto",
                                 speculative_algorithm="EAGLE", speculative_num_draft_tokens=NDRAFT,
                                 speculative_eagle_topk=1, speculative_num_steps=NDRAFT - 1)
    with get_parallel().override(attn_dcp_rank=0):
        req_pool, alloc = fr.shared_pools()
        runner = cuda_runner(req_pool, alloc, LAYERS, fp8_pool=True)
        backend = backend_class()(runner)
        store = backend.ess.store
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=LateStreams(), zero_backend="torch")
        yield request.param, backend, runner, stub
    ov.restore()


def _write(runner, layers, locs, gen):
    """Latent rows through the pool's writer (SGLang's FP8 quantizer)."""
    pool = runner.token_to_kv_pool
    for li in layers:
        x = torch.randn(locs.numel(), fr.KV_DIM, generator=gen) * torch.rand(locs.numel(), 1, generator=gen) * 4
        pool.set_mla_kv_buffer(cuda_layer(li), locs, x[:, :fr.KV_LORA].to(torch.bfloat16),
                               x[:, fr.KV_LORA:].to(torch.bfloat16))


def prefill(backend, runner, rows, prompts, gen):
    """New requests' rows written (SGLang's FP8 quantizer), then their last CHUNK tokens prefilled, which
    opens and warms their hot buffers. Returns req_to_token."""
    r2t = runner.req_to_token_pool.req_to_token
    fr.place_requests(runner.req_to_token_pool, rows, [p + 64 for p in prompts])
    _write(runner, range(LAYERS), torch.cat([r2t[r, :p] for r, p in zip(rows, prompts)]).long(), gen)
    fb = cuda_batch("EXTEND", rows, prompts, torch.cat([r2t[r, p - CHUNK:p] for r, p in zip(rows, prompts)]),
                    extend_lens=[CHUNK] * len(rows), prefix_lens=[p - CHUNK for p in prompts])
    backend.init_forward_metadata(fb)
    qpos = [p - CHUNK + j for p in prompts for j in range(CHUNK)]
    for li in range(LAYERS):
        backend.forward_extend(fr.query(gen, len(qpos)), None, None, cuda_layer(li), fb, save_kv_cache=False,
                               topk_indices=fr.causal_topk(gen, qpos))
    return r2t


def _check(out, want, what):
    err = float((out.float().reshape(want.shape) - want).abs().max())
    bound = float(want.abs().max()) * BF16_ULP + 1e-6
    assert err <= bound, f"{what}: {err:.3g} from the truth over the same bytes (bound {bound:.3g})"


def test_fp8_mtp_verify_runs_sglangs_kernel_over_the_slot_table(fp8_mtp, monkeypatch):
    from sgl_ess.attention import reference as torch_attention

    hot, backend, runner, stub = fp8_mtp
    assert not hasattr(_CudaKernels, "gathered"), "the CUDA class must not keep a torch attention for MTP"
    store = backend.ess.store
    assert store.cfg.verify_rows_per_request == NDRAFT + max(0, NDRAFT * fr.TOPK - hot)
    torch_calls = []
    monkeypatch.setattr(torch_attention, "attend", lambda *a, **k: torch_calls.append(1))
    gen = torch.Generator().manual_seed(35)
    rows, prompts = [1, 2, 3], [150, 90, 200]
    r2t = prefill(backend, runner, rows, prompts, gen)
    committed, accept = list(prompts), [[1, 4, 2], [4, 1, 3], [2, 3, 1]]
    tok_req = torch.repeat_interleave(torch.tensor(rows), NDRAFT)
    for it in range(3):
        win = torch.cat([r2t[r, c:c + NDRAFT] for r, c in zip(rows, committed)]).long()
        fb = cuda_batch("TARGET_VERIFY", rows, committed, win)
        fb.spec_info = SimpleNamespace(draft_token_num=NDRAFT)
        backend.init_forward_metadata(fb)
        qpos = [c + j for c in committed for j in range(NDRAFT)]
        for li in range(LAYERS):             # the window's rows written (new bytes each iteration), then attention
            _write(runner, [li], win, gen)
            calls = len(stub.calls)
            q, topk = fr.query(gen, len(qpos)), fr.causal_topk(gen, qpos)
            out = backend.forward_extend(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
            _check(out, reference(runner, li, q, tok_req, topk), f"iteration {it}: verify layer {li}")
            assert stub.calls[calls:] == ["flash_mla_with_kvcache", "fp8_kvcache"], stub.calls[calls:]   # one call
        committed = [c + a for c, a in zip(committed, accept[it])]
    assert torch_calls == []
    u = backend.ess.usage()
    assert u["mtp_window_entries"] > 0 and (u["mtp_overflow_entries"] > 0) == (hot < NDRAFT * fr.TOPK)
    for li in range(LAYERS):                 # nothing at or past `committed` became resident
        for r, c in zip(rows, committed):
            assert int(store.hot.slot_to_token[li, r].max()) < c
