"""Our FP8 656-byte rows against SGLang's own writer (sglang.kernels.ops.quantization.
dsa_quant_k_cache.quantize_k_cache_separate, a Triton kernel), run here under TRITON_INTERPRET=1.

What this CPU can check: the per-tile fp32 scales (bytes 512..527) and the bf16 rope bytes
(528..655) are byte-identical. What it cannot: the fp8 code bytes. Triton 3.4's interpreter
emulates the fp32 -> float8e4nv cast wrongly (it turns 124.29 into 64.0 where IEEE
round-to-nearest-even - torch, and the GPU - gives 128.0), so its codes are not a reference;
the unit test tests/unit/kernels/test_latent_layout.py checks our codes against the writer's
formula (value * (1 / scale), clamp, round to nearest even), and bench/gpu_check.sh compares
bytes with SGLang's kernel where SGLang's CUDA stack is installed."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent("""
    import torch
    from sglang.kernels.ops.quantization.dsa_quant_k_cache import quantize_k_cache_separate
    from sgl_ess.kernels.latent_layout import LatentLayout
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(48, 576, generator=g) * torch.rand(48, 1, generator=g) * 20).to(torch.bfloat16)
    nope, rope = quantize_k_cache_separate(x[:, :512], x[:, 512:])
    theirs = torch.cat([nope.squeeze(1), rope.squeeze(1)], 1)
    ours = LatentLayout("fp8_flashmla", 512, 64).encode(x.float())
    assert theirs.shape == ours.shape == (48, 656), (theirs.shape, ours.shape)
    assert torch.equal(theirs[:, 512:528], ours[:, 512:528]), "scale bytes differ"
    assert torch.equal(theirs[:, 528:], ours[:, 528:]), "rope bytes differ"
    print("OK")
""")


def test_scale_and_rope_bytes_equal_sglangs_writer():
    pytest.importorskip("sglang")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-2000:] + r.stderr[-4000:]
