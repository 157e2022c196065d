"""The small DeepSeek-V4 CPU hooks of sgl_ess/integration/sglang/dsv4/ (patches/README.md), each at its
call: rope_table (a window-only layer's rotary_emb) and pool_check (V4's FP8 pool past the CPU MHA FP8
check). Run in a subprocess with SGLANG_USE_CPU_ENGINE=1, as the launcher runs
SGLang without CUDA (SGLang reads it when its modules are imported)."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROPE = textwrap.dedent("""
    import torch
    from sgl_ess.integration.sglang.dsv4.rope_table import around_get_rope_wrapper
    calls = []
    def original(*a, **k):
        calls.append(k)
        return "original"
    kw = dict(head_size=64, rotary_dim=64, max_position=256, base=10000, is_neox_style=False)
    rope = around_get_rope_wrapper(original, rope_scaling=None, device="cpu", **kw)
    assert calls == [], calls
    # the unscaled RoPE table from its definition: angle = pos * base^(-2i/d), cache = [cos | sin]
    inv = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    ang = torch.arange(256, dtype=torch.float64)[:, None] * inv[None, :]
    want = torch.cat([ang.cos(), ang.sin()], dim=-1)
    got = rope.cos_sin_cache.to(torch.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    tol = 1e-2 if rope.cos_sin_cache.dtype == torch.bfloat16 else 1e-5   # bf16: 8 mantissa bits
    assert (got - want).abs().max().item() < tol, (got - want).abs().max().item()
    scaling = {"rope_type": "deepseek_yarn", "factor": 4.0}
    assert around_get_rope_wrapper(original, rope_scaling=scaling, device="cpu", **kw) == "original"
    assert around_get_rope_wrapper(original, rope_scaling=None, device="cuda", **kw) == "original"
    assert len(calls) == 2 and calls[0]["rope_scaling"] == scaling and calls[1]["device"] == "cuda"
    print("OK")
""")

POOL = textwrap.dedent("""
    import types
    from sglang.srt.mem_cache import kv_cache_configurator as mod
    from sgl_ess.integration.sglang.dsv4.pool_check import around_configure
    amx, backends = mod.cpu_has_amx_support, mod.attention_backends
    def cfg(arch, spec_none=True):
        return types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=types.SimpleNamespace(
            architectures=[arch])), spec_algorithm=types.SimpleNamespace(is_none=lambda: spec_none))
    seen = []
    def original(self, **kw):
        seen.append((mod.cpu_has_amx_support(), tuple(mod.attention_backends())))
        return "configured"
    assert around_configure(original, cfg("DeepseekV4ForCausalLM"), pre_model_load_memory=0) == "configured"
    assert seen[-1] == (True, ("intel_amx",)), seen
    assert mod.cpu_has_amx_support is amx and mod.attention_backends is backends
    def inspect(self, **kw):
        seen.append((mod.cpu_has_amx_support is amx, mod.attention_backends is backends))
    around_configure(inspect, cfg("DeepseekV32ForCausalLM"), pre_model_load_memory=0)
    assert seen[-1] == (True, True), seen        # other models: SGLang's own check, untouched
    # EAGLE / MTP: the target and its draft (DeepseekV4ForCausalLMNextN) both configure V4's own pool
    assert around_configure(original, cfg("DeepseekV4ForCausalLM", spec_none=False), pre_model_load_memory=0) == "configured"
    assert around_configure(original, cfg("DeepseekV4ForCausalLMNextN"), pre_model_load_memory=0) == "configured"
    assert seen[-1] == (True, ("intel_amx",)), seen
    def raising(self, **kw):
        raise RuntimeError("boom")
    try:
        around_configure(raising, cfg("DeepseekV4ForCausalLM"), pre_model_load_memory=0)
    except RuntimeError:
        pass
    assert mod.cpu_has_amx_support is amx and mod.attention_backends is backends   # restored on error
    print("OK")
""")


@pytest.mark.parametrize("script", [ROPE, POOL], ids=["rope_table", "pool_check"])
def test_dsv4_cpu_hook(script):
    pytest.importorskip("sglang")
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout[-2000:] + out.stderr[-4000:]
