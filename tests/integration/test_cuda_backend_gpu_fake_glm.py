"""GLM-5 / 5.1 (``GlmMoeDsaForCausalLM``) through the CUDA backend class in the GPU fake
(tests/integration/test_cuda_backend_gpu_fake.py: cuda_backend.py's subclass of SGLang's DSA backend on
this CPU, FlashMLA swapped for a torch reference, the side-stream engine with late, out-of-order
streams), with GLM's head counts instead of DeepSeek-V3.2's.

FlashMLA takes a fixed set of query-head counts: SGLang's DSA backend pads the query heads of a
rank with zero heads up to 64 on an H200 (``_forward_flashmla_sparse``: a multiple of 64 on SM90;
``_forward_flashmla_kv``: ``flashmla_kv_num_q_heads``, 64 or 128) and trims the output back.
GLM-5 has 64 attention heads, DeepSeek-V3.2 128: at TP 8 a GLM rank holds 8 heads (padded to 64 in
both kernels), at TP 1 64 (no padding). ESS's CUDA class hands its slot-space rows to those same
SGLang methods; checked here, per head count and decode kernel: the kernel saw the padded head count
SGLang's rule gives, and prefill and decode outputs of the real heads equal a dense torch reference
over the true rows (bound: one BF16 rounding of the output, as in the DeepSeek test)."""

import pytest
import torch

pytest.importorskip("sglang")

from . import _fake_runner as fr  # noqa: E402
from . import test_cuda_backend_gpu_fake as base  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401

GLM5_HEADS = 64                       # GLM-5's num_attention_heads (DeepSeek-V3.2: 128)
H200_PAD = 64                         # SGLang pads FlashMLA's query heads to a multiple of 64 on SM90


# TP 8 on the FP8 decode kernel (its prefill is the sparse kernel: both pad), TP 1 on the sparse kernel
@pytest.fixture(params=[("flashmla_kv", GLM5_HEADS // 8), ("flashmla_sparse", GLM5_HEADS)], ids=["kv-tp8", "sparse-tp1"])
def glm_gpu_fake(request, ess_env, monkeypatch):          # noqa: F811
    impl, heads = request.param
    monkeypatch.setattr(fr, "HEADS", heads)
    make_runner = base.cuda_runner

    def glm_runner(*a, **kw):
        runner = make_runner(*a, **kw)
        runner.model_config.hf_config.architectures = ["GlmMoeDsaForCausalLM"]
        return runner

    monkeypatch.setattr(base, "cuda_runner", glm_runner)
    for backend, runner, stub in base._gpu_fake(impl, ess_env, monkeypatch):
        seen = []
        for name in ("flash_mla_sparse_fwd", "flash_mla_with_kvcache"):
            kernel = getattr(stub, name)

            def record(q, *a, _kernel=kernel, _name=name, **kw):
                seen.append((_name, int(q.shape[-2])))          # q [..., heads, head_dim]
                return _kernel(q, *a, **kw)
            setattr(stub, name, record)
        yield backend, runner, heads, seen


def test_glm_heads_through_the_cuda_class_pad_and_equal_the_reference(glm_gpu_fake):
    backend, runner, heads, seen = glm_gpu_fake
    assert backend.ess.store.cfg.num_layers == base.LAYERS
    gen = torch.Generator().manual_seed(5)
    rows, prompts = [1, 2], [150, 90]
    fr.place_requests(runner.req_to_token_pool, rows, [p + 3 for p in prompts])
    base._write(runner, rows, [p + 3 for p in prompts], gen)
    for err, bound in base._prefill(backend, runner, rows, prompts, gen):
        assert err <= bound, f"{heads} heads, prefill: {err:.3g} from the reference (bound {bound:.3g})"
    for step in range(3):
        for err, bound in base._decode(backend, runner, rows, [p + 1 + step for p in prompts], gen):
            assert err <= bound, f"{heads} heads, decode step {step}: {err:.3g} from the reference (bound {bound:.3g})"
    padded = -(-heads // H200_PAD) * H200_PAD
    kernels = {"flashmla_kv": "flash_mla_with_kvcache", "flashmla_sparse": "flash_mla_sparse_fwd"}
    decode_kernel = kernels[backend.dsa_decode_impl]
    assert ("flash_mla_sparse_fwd", padded) in seen, seen          # prefill: always the sparse kernel
    assert (decode_kernel, padded) in seen, seen
    assert all(h == padded for _, h in seen), (heads, seen)
    assert (padded != heads) == (heads == GLM5_HEADS // 8)        # TP 8 pads, TP 1 does not
