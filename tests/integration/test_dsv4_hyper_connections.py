"""dsv4/hyper_connections.py (CPU stand-ins for V4's hyper-connection kernels) against SGLang's own
versions: hc_split_sinkhorn against its Triton port ``_hc_split_sinkhorn_triton`` (mhc.py, what SGLang runs
on gfx1250) under TRITON_INTERPRET=1 and against the split inside its torch ``_mhc_pre_torch``;
mhc_combine against its Triton ``mhc_combine`` under the interpreter and the combine of
``_mhc_pre_torch``; the fused_hc_head hook against SGLang's Triton ``fused_hc_head`` under the
interpreter. float32 throughout: equal within float32 rounding (rtol 1e-5, atol 1e-6; 20 Sinkhorn
iterations of 4x4 normalisations, different summation orders)."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from sglang.kernels.ops.layernorm import mhc
    from sglang.kernels.ops.layernorm.mhc_head import fused_hc_head
    from sgl_ess.integration.sglang.dsv4.hyper_connections import around_fused_hc_head, combine, split_sinkhorn
    g = torch.Generator().manual_seed(0)
    hc, h, t = 4, 128, 7
    mixes = torch.randn(t, 1, (2 + hc) * hc, generator=g) * 2
    scale = torch.rand(3, generator=g) + 0.5
    base = torch.randn((2 + hc) * hc, generator=g)
    def close(a, b):
        assert a.shape == b.shape, (a.shape, b.shape)
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6), (a.float() - b.float()).abs().max()
    ours = split_sinkhorn(mixes, scale, base, hc, 20, 1e-6)
    theirs = mhc._hc_split_sinkhorn_triton(mixes, scale, base, hc, 20, 1e-6)
    for a, b in zip(ours, theirs):
        close(a, b)
    # SGLang's torch _mhc_pre_torch: the same split from residual + fn, and its combine
    residual = torch.randn(t, hc, h, generator=g)
    fn = torch.randn((2 + hc) * hc, hc * h, generator=g) * 0.05
    post_t, comb_t, y_t = mhc._mhc_pre_torch(residual, fn, scale, base, 1e-6, 1e-6, 1e-6, 2.0, 20)
    x_flat = residual.view(t, hc * h)
    m = (F.linear(x_flat, fn) * torch.rsqrt(x_flat.square().mean(-1, keepdim=True) + 1e-6)).unsqueeze(1)
    pre, post, comb = split_sinkhorn(m, scale, base, hc, 20, 1e-6)
    close(post.squeeze(1), post_t.squeeze(-1))
    close(comb.squeeze(1), comb_t)
    close(combine(x_flat, pre.squeeze(1), hc, torch.float32), y_t)
    close(combine(x_flat, pre.squeeze(1), hc, torch.float32), mhc.mhc_combine(x_flat, pre.squeeze(1), hc, torch.float32))
    # the last hyper-connection
    x = torch.randn(t, hc, h, generator=g)
    head_fn = torch.randn(hc, hc * h, generator=g) * 0.05
    head_scale, head_base = torch.rand(1, generator=g) + 0.5, torch.randn(hc, generator=g)
    def not_called(*a, **k):
        raise AssertionError("the Triton head ran for CPU tensors")
    close(around_fused_hc_head(not_called, x, head_fn, head_scale, head_base, 1e-6, 1e-6),
          fused_hc_head(x, head_fn, head_scale, head_base, norm_eps=1e-6, hc_eps=1e-6))
    print("OK")
""")


def test_hyper_connection_standins_equal_sglang():
    pytest.importorskip("sglang")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                         cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout[-2000:] + out.stderr[-4000:]
