"""ESS on CUDA inside SGLang: SGLang's own ``DeepseekSparseAttnBackend`` whose decode reads the
ESS slot space. NOT YET RUN: no machine with a GPU and SGLang's CUDA stack was available (the
lent GPU machine has no SGLang, so bench/gpu_check.sh part 2 skips there); every piece below
it - store, stream engine, Triton kernels - is tested on CPU (interpreter) and in tests/gpu.

Installed with HookRegistry class REPLACE on ``dsa_backend.DeepseekSparseAttnBackend`` when ESS
is on and CUDA is present, so the backend keeps the name ``dsa`` and every place SGLang builds
one (the target runner, Two-Batch-Overlap children, the MTP draft backends) gets it. Decode:
  1. SGLang's writer stores the step's new row through the pool's zero-copy view straight into
     the host pool (host_pool_class.py); the store copies it into its reserved hot slot;
  2. the indexer runs with logical (unfused) top-k, so ``topk_indices`` are token positions;
  3. ``EssPoolAdapter.decode`` resolves them (Triton resolver), fetches the misses on the
     stream engine's side stream (submitted right after the indexer by the hook on
     ``Indexer.forward_cuda``, so the fetch overlaps the rest of the attention prologue) and
     waits for them with an event;
  4. SGLang's own FlashMLA kernel runs with ``kv_cache`` = the slot space (a multiple of 64
     rows, viewed as [S, 1, 656] FP8 rows) and ``page_table_1`` = the int32 slot table.
FlashMLA returns no log-sum-exp through SGLang's wrapper and its tile schedule covers the whole
batch, so with SGLang's kernels the level runs as one attention call after the wait (the fetch
still hides behind the prologue). Any other decode implementation SGLang picked is replaced by
the Triton sparse-MLA decode kernel (sgl_ess.kernels.sparse_mla_triton) over the same slot
table, which returns the log-sum-exp, so DA and DBA run split as on the CPU path.
Decode CUDA graphs: the path has no host sync and static shapes by design, but capture is
unverified, so the launcher disables CUDA graphs with ESS on (``--disable-cuda-graph``).
"""

from __future__ import annotations

import dataclasses
import logging

import torch

logger = logging.getLogger(__name__)

SUPPORTED_DECODE_IMPLS = ("flashmla_kv", "flashmla_sparse")

_cls = None


def backend_class():
    """The ESS subclass of SGLang's DSA backend (built once; imports SGLang's CUDA module)."""
    global _cls
    if _cls is not None:
        return _cls
    from sglang.srt.layers.attention import dsa_backend as mod

    base = mod.DeepseekSparseAttnBackend

    class EssDeepseekSparseAttnBackend(base):
        def __init__(self, model_runner, *args, **kwargs):
            super().__init__(model_runner, *args, **kwargs)
            from .backend_registration import store_for_runner

            self.store = store_for_runner(model_runner)

        def get_indexer_metadata(self, layer_id, forward_batch):
            md = super().get_indexer_metadata(layer_id, forward_batch)
            if self.store is not None and not md.force_unfused_topk:
                md = dataclasses.replace(md, force_unfused_topk=True)   # token positions, not locations
            return md

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None,
                           topk_indices=None, **kwargs):
            if self.store is None or topk_indices is None:
                return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, q_rope=q_rope,
                                              k_rope=k_rope, topk_indices=topk_indices, **kwargs)
            impl = self.dsa_decode_impl
            self.store.fence_host()
            loc = forward_batch.out_cache_loc
            if k is not None and save_kv_cache:
                self.token_to_kv_pool.set_mla_kv_buffer(layer, loc, k, k_rope)
            if q_rope is not None:
                q_nope = q.view(-1, layer.tp_q_head_num, layer.v_head_dim)
                q_rope = q_rope.view(q_nope.shape[0], layer.tp_q_head_num, layer.head_dim - layer.v_head_dim)
                q_all = mod.concat_mla_absorb_q_general(q_nope, q_rope)
            else:
                q_all = q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim)
            topk = self._pad_topk_indices(topk_indices, q_all.shape[0])
            newest = self.token_to_kv_pool.get_key_buffer(layer.layer_id)[loc.long()]   # zero-copy read
            md = self.forward_metadata
            reqs, seq_lens, r2t = (forward_batch.req_pool_indices.long(), forward_batch.seq_lens,
                                   self.req_to_token_pool.req_to_token)
            if impl not in SUPPORTED_DECODE_IMPLS:      # the Triton fallback: any GPU, split attention
                from sgl_ess.kernels.sparse_mla_triton import sparse_mla_decode_triton

                lay = self.store.latent_layout()
                out = self.store.decode(id(forward_batch), layer.layer_id, q_all, reqs, seq_lens, topk, newest, r2t,
                                        lambda qq, rows, sl: sparse_mla_decode_triton(qq, rows, sl, lay, layer.scaling))
                return out.to(q_all.dtype)

            def attend(qq, slot_rows, slots):
                kv = self.store.as_kv_cache(slot_rows)
                if impl == "flashmla_kv":
                    out = self._forward_flashmla_kv(q_all=qq, kv_cache=kv, v_head_dim=layer.v_head_dim,
                                                    sm_scale=layer.scaling, layer=layer, metadata=md,
                                                    page_table_1=slots)
                else:
                    out = self._forward_flashmla_sparse(q_all=qq, kv_cache=kv, page_table_1=slots,
                                                        sm_scale=layer.scaling, v_head_dim=layer.v_head_dim,
                                                        topk_length=md.dsa_cache_seqlens_int32, attn_sink=None)
                return out, None

            return self.store.decode(id(forward_batch), layer.layer_id, q_all, reqs, seq_lens, topk, newest, r2t,
                                     attend, single_call=True)

    EssDeepseekSparseAttnBackend.__qualname__ = "EssDeepseekSparseAttnBackend"
    _cls = EssDeepseekSparseAttnBackend
    return _cls


def _around_indexer_forward_cuda(original_fn, self, x, q_lora, positions, forward_batch, layer_id, *args, **kwargs):
    """After SGLang's indexer picked a decode batch's top-k: submit its misses' fetch at once."""
    out = original_fn(self, x, q_lora, positions, forward_batch, layer_id, *args, **kwargs)
    if out is not None and forward_batch.forward_mode.is_decode():
        from sglang.srt.model_executor.forward_context import get_attn_backend

        store = getattr(get_attn_backend(), "store", None)
        if store is not None and store.mode(layer_id) != "none":
            from sglang.srt.model_executor.forward_context import get_req_to_token_pool

            b = forward_batch.batch_size
            store.early_plan(id(forward_batch), layer_id, forward_batch.req_pool_indices[:b].long(),
                             forward_batch.seq_lens[:b], out[:b], get_req_to_token_pool().req_to_token, 0)
    return out


def register() -> None:
    """CUDA processes with ESS on only (importing SGLang's DSA backend needs its CUDA kernels)."""
    from sgl_ess.config import config_from_env

    cfg = config_from_env()
    if cfg is None or not cfg.enabled or not torch.cuda.is_available():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from . import targets

    HookRegistry.register(targets.DSA_BACKEND_CLASS, backend_class(), HookType.REPLACE)
    HookRegistry.register(targets.INDEXER_FORWARD_CUDA, _around_indexer_forward_cuda, HookType.AROUND)
    from . import cuda_memory

    cuda_memory.register()
    logger.info("sgl-ess: ESS on CUDA - SGLang's DSA backend decodes from the ESS slot space")
