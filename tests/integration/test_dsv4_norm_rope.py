"""dsv4/norm_rope.py (CPU stand-ins for V4's JIT CUDA query norm-rope, window-row norm-rope and inverse
RoPE) against SGLang's own Triton versions, fused_norm_rope_inplace_triton and apply_rotary_emb_triton
(kernels/ops/attention/dsv4/rope.py, what SGLang runs on HIP / XPU), under TRITON_INTERPRET=1, on V4's
table (precompute_freqs_cis with YaRN) at scattered positions. float32 rows: equal within float32
rounding of a 512-term sum (rtol 1e-5); bfloat16 rows: within one bfloat16 rounding step (2**-7
relative, each side rounds its fp32 result once)."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import torch
    from sglang.kernels.ops.attention.dsv4.rope import (apply_rotary_emb_triton, fused_norm_rope_inplace_triton,
                                                         precompute_freqs_cis)
    from sgl_ess.integration.sglang.dsv4.norm_rope import norm_rope_inplace, q_norm_rope, rope_inplace
    freqs = precompute_freqs_cis(dim=64, seqlen=8192, original_seq_len=2048, base=40000.0, factor=4.0,
                                 beta_fast=32, beta_slow=1)
    g = torch.Generator().manual_seed(0)
    pos = torch.tensor([0, 1, 5, 127, 128, 1000, 4095, 8191])
    def close(a, b, dtype):
        a, b = a.float(), b.float()
        if dtype == torch.float32:
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), (a - b).abs().max()
        else:
            assert ((a - b).abs() <= 2.0 ** -7 * torch.maximum(a.abs(), b.abs()) + 1e-6).all(), (a - b).abs().max()
    for dtype in (torch.float32, torch.bfloat16):
        q = (torch.randn(8, 4, 512, generator=g) * 3).to(dtype)
        # the query: weightless per-head norm + rope == SGLang's norm-rope with weight None on [T*H, D]
        ours = torch.empty_like(q)
        q_norm_rope(q, ours, 1e-6, freqs, pos)
        theirs = q.clone().view(-1, 512)
        fused_norm_rope_inplace_triton(theirs, None, 1e-6, freqs, pos.repeat_interleave(4))
        close(ours, theirs.view(8, 4, 512), dtype)
        # no norm (eps None): rope only
        ours = torch.empty_like(q)
        q_norm_rope(q, ours, None, freqs, pos)
        theirs = q.clone()
        apply_rotary_emb_triton(theirs[..., -64:], freqs, positions=pos)
        close(ours, theirs, dtype)
        # the window row: norm with weight + rope
        kv = (torch.randn(8, 512, generator=g) * 3).to(dtype)
        w = (torch.rand(512, generator=g) + 0.5).to(dtype)
        ours, theirs = kv.clone(), kv.clone()
        norm_rope_inplace(ours, w, 1e-6, freqs, pos)
        fused_norm_rope_inplace_triton(theirs, w, 1e-6, freqs, pos)
        close(ours, theirs, dtype)
        # the output's inverse rope on the rope channels, q only and q with k
        o = (torch.randn(8, 4, 512, generator=g)).to(dtype)
        k = (torch.randn(8, 1, 64, generator=g)).to(dtype)
        for inverse in (True, False):
            ours, theirs, k1, k2 = o.clone(), o.clone(), k.clone(), k.clone()
            rope_inplace(ours[..., -64:], k1, freqs, pos, inverse=inverse)
            apply_rotary_emb_triton(theirs[..., -64:], freqs, positions=pos, inverse=inverse)
            apply_rotary_emb_triton(k2, freqs, positions=pos, inverse=inverse)
            close(ours, theirs, dtype)
            close(k1, k2, dtype)
            assert torch.equal(ours[..., :-64], o[..., :-64])
    print("OK")
""")


def test_norm_rope_standins_equal_sglang_triton():
    pytest.importorskip("sglang")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                         cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout[-2000:] + out.stderr[-4000:]
