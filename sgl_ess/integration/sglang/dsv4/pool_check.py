"""DeepSeek-V4 on CPU: let SGLang build V4's own FP8 pool (``DeepSeekV4TokenToKVPool``).

V4's pool always stores packed FP8 rows (``create_buffer`` asserts a uint8 store,
deepseek_v4_memory_pool.py:321; bfloat16 is NPU's separate geometry), so V4 resolves
``--kv-cache-dtype fp8_e4m3``. ``KVCacheConfigurator.configure`` (kv_cache_configurator.py:459-468)
then applies the CPU MHA rule for FP8 (SGLang's ``cpu_fp8_e4m3`` quant, which needs Intel AMX and
the ``intel_amx`` backend) although V4's rows are never read by that quant: the CPU dsv4 arm
(dsv4/) dequantizes them in torch. So, without CUDA and for a DeepseekV4ForCausalLM runner only,
that check sees AMX and the intel_amx backend for the duration of ``configure`` (the draft runner of
EAGLE / MTP included: its architecture is DeepseekV4ForCausalLMNextN).
"""

from __future__ import annotations

import contextlib

V4_ARCH = "DeepseekV4ForCausalLM"
V4_ARCHS = (V4_ARCH, "DeepseekV4ForCausalLMNextN")


def is_v4(model_config) -> bool:
    archs = getattr(getattr(model_config, "hf_config", None), "architectures", None) or []
    return any(a in archs for a in V4_ARCHS)


@contextlib.contextmanager
def _v4_fp8_pool_allowed():
    from sglang.srt.mem_cache import kv_cache_configurator as mod

    amx, backends = mod.cpu_has_amx_support, mod.attention_backends
    mod.cpu_has_amx_support = lambda: True
    mod.attention_backends = lambda: ("intel_amx",)
    try:
        yield
    finally:
        mod.cpu_has_amx_support, mod.attention_backends = amx, backends


def around_configure(original_fn, self, *args, **kwargs):
    if not is_v4(getattr(self, "model_config", None)):
        return original_fn(self, *args, **kwargs)
    with _v4_fp8_pool_allowed():
        return original_fn(self, *args, **kwargs)


def around_clear_unaccepted_c128(original_fn, self, req_pool_indices, seq_lens, accept_lens, num_draft_tokens,
                                 *args, **kwargs):
    """After an MTP verify SGLang zeroes the C128 compressor state its rejected draft tokens wrote in the pool's
    state ring (a Triton kernel). The CPU dsv4 arm keeps no compressor state in the pool: it pools a C128
    entry from the stored projections of the positions it covers when it reads it, and a rejected draft's
    position is written again by the forward that next reaches it, before any read. Nothing to clear. With
    ESS on this is where the acceptance is known: the accepted tokens' C4 entries go to the host rows now
    (cpu_backend.finalize_verify; committed = seq_lens + accept_lens, as SGLang's verify computes it)."""
    if not str(getattr(self, "device", "cpu")).startswith("cpu"):
        return original_fn(self, req_pool_indices, seq_lens, accept_lens, num_draft_tokens, *args, **kwargs)
    from .cpu_backend import finalizer_of

    backend = finalizer_of(self)
    if backend is not None and req_pool_indices.numel():
        backend.finalize_verify([int(r) for r in req_pool_indices.tolist()],
                                [int(s) for s in (seq_lens.long() + accept_lens.long()).tolist()])
    return None
