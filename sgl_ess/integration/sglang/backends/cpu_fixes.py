"""What SGLang 0.5.23 needs to run a DeepSeek-V3.2 (DSA) model without CUDA.

1. Argument resolution for DSA models asks ``torch.cuda.get_device_capability()``
   unconditionally (model_hook.handle_model_specific_adjustments and the DSA post-process
   passes it runs). On a machine without CUDA we answer (9, 0) *only during that call*;
   every other caller still sees the real torch function.
2. DeepSeek attention picks its forward method per backend name. The ``ess`` backend (and
   ``torch_native``) must take the absorbed-MLA path: the MHA prefill path would read a
   per-head K/V that the latent pool does not hold.
3. EAGLE/NextN: ``DeepseekV2ForCausalLM.set_embed_and_head`` (the draft model takes the
   target's embedding and LM head) ends with ``torch.cuda.empty_cache()`` and
   ``torch.cuda.synchronize()``, which raise without CUDA. Both are no-ops there for the
   duration of that call only.
4. EAGLE decode allocation (``mem_cache.allocation.get_last_loc``) picks SGLang's Triton kernel
   for every attention backend except ``ascend``/``torch_native``, by backend name. With the
   ``ess`` backend on a CPU tensor it takes SGLang's own torch version (``get_last_loc_torch``).
5. PD prefill over Mooncake: ``MooncakeKVSender.supports_host_tensor_indices`` makes the prefill
   copy page indices into pinned memory and record a ``torch.cuda.Event`` (both raise without
   CUDA). Without CUDA the class attribute is False, so SGLang takes its own plain path
   (``kv_to_page_indices``). Set only when the Mooncake connector imports (PD installed).
   SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX=0 (the early send of a cached prefix also
   records a CUDA event) is set by the launcher on CPU in prefill mode.
6. PD decode retraction: a decode node backs up a retracted request's KV and index keys to CPU
   tensors and restores them when it resumes (``DSATokenToKVPool.get_cpu_copy`` /
   ``load_cpu_copy``, with SGLang's default ``--disaggregation-decode-retraction-backup``); both
   call ``torch.cuda.synchronize()`` unconditionally, which raised without CUDA and stopped the
   decode node on its first retraction. Without CUDA they run with the sync calls as no-ops.
"""

from __future__ import annotations

import contextlib
import os

import torch

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from .. import targets

_FAKE_CAPABILITY = (9, 0)


@contextlib.contextmanager
def fake_cuda_capability_without_cuda():
    """Within the block, ``torch.cuda.get_device_capability`` returns (9, 0) if CUDA is absent."""
    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: _FAKE_CAPABILITY
    try:
        yield
    finally:
        torch.cuda.get_device_capability = original


@contextlib.contextmanager
def no_cuda_sync_without_cuda():
    """Within the block, ``torch.cuda.synchronize`` / ``empty_cache`` do nothing if CUDA is absent."""
    if torch.cuda.is_available():
        yield
        return
    sync, empty = torch.cuda.synchronize, torch.cuda.empty_cache
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.empty_cache = lambda: None
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.empty_cache = sync, empty


def _around_set_embed_and_head(original_fn, *args, **kwargs):
    with no_cuda_sync_without_cuda():
        return original_fn(*args, **kwargs)


def _around_cpu_copy(original_fn, *args, **kwargs):
    with no_cuda_sync_without_cuda():
        return original_fn(*args, **kwargs)


def _around_get_last_loc(original_fn, req_to_token, req_pool_indices_tensor, prefix_lens_tensor):
    if req_to_token.device.type == "cpu":
        from sglang.srt.mem_cache.allocation import get_last_loc_torch

        return get_last_loc_torch(req_to_token, req_pool_indices_tensor, prefix_lens_tensor)
    return original_fn(req_to_token, req_pool_indices_tensor, prefix_lens_tensor)


def _around_model_adjustments(original_fn, *args, **kwargs):
    with fake_cuda_capability_without_cuda():
        return original_fn(*args, **kwargs)


def _absorbed_mla(attn, forward_batch):
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    return AttnForwardMethod.MLA


def register() -> None:
    HookRegistry.register(targets.MODEL_SPECIFIC_ADJUSTMENTS, _around_model_adjustments, HookType.AROUND)
    HookRegistry.register(targets.SET_EMBED_AND_HEAD, _around_set_embed_and_head, HookType.AROUND)
    HookRegistry.register(targets.GET_LAST_LOC, _around_get_last_loc, HookType.AROUND)
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry

    AttentionBackendRegistry.register(targets.ESS_BACKEND_NAME, _absorbed_mla)
    if not torch.cuda.is_available():
        AttentionBackendRegistry.register("torch_native", _absorbed_mla)
        HookRegistry.register(targets.DSA_POOL_CPU_COPY, _around_cpu_copy, HookType.AROUND)
        HookRegistry.register(targets.DSA_POOL_LOAD_CPU_COPY, _around_cpu_copy, HookType.AROUND)
        if os.environ.get("SGLESS_PD_ROLE") == "prefill":     # set by the launcher (process_env.py)
            _mooncake_sender_without_cuda()


def _mooncake_sender_without_cuda() -> None:
    import importlib

    module, _, name = targets.MOONCAKE_SENDER.rpartition(".")
    try:
        sender = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - PD (mooncake) not installed: nothing to adjust
        return
    sender.supports_host_tensor_indices = False
