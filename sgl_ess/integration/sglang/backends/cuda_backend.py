"""ESS on CUDA inside SGLang: SGLang's own ``DeepseekSparseAttnBackend`` whose forwards go through the
ESS store. NOT YET RUN ON A GPU: no machine with a GPU and SGLang's CUDA stack was available. The
class itself runs in the CPU suite with only its device kernels swapped for torch references
(tests/integration/test_cuda_backend_gpu_fake.py: FlashMLA -> a torch sparse MLA); the store,
stream engine and Triton kernels below it are tested on CPU (interpreter) and in tests/gpu.

Installed with HookRegistry class REPLACE on ``dsa_backend.DeepseekSparseAttnBackend`` when ESS
is on and CUDA is present, so the backend keeps the name ``dsa`` and every place SGLang builds
one (the target runner, Two-Batch-Overlap children) gets it. The request lifecycle is the CPU
backend's: ``store_forward.StoreForward`` (open + warm hot buffers after each prefill chunk,
reserve / plan / land / commit per decode layer); this class supplies only ``_CudaKernels``:
  * prefill: SGLang's own prefill kernels over the full history (the pool's zero-copy view of the
    host pool), with the indexer's token positions mapped to pool locations when SGLang's
    fused-top-k path expects locations (the store needs positions: ``force_unfused_topk``);
  * decode: SGLang's FlashMLA kernel with ``kv_cache`` = the slot space (a multiple of 64 rows,
    viewed as [S, 1, 656] FP8 rows) and ``page_table_1`` = the int32 slot table; the misses'
    fetch was submitted right after the indexer (hook on ``Indexer.forward_cuda``) on the stream
    engine's side stream. Both FlashMLA decodes are called with their log-sum-exp (flashmla_lse.py:
    SGLang's wrappers drop it), so every overlap level runs: DA attends the hits while the misses are
    in flight and the misses after their own fetch landed, DBA each half batch so, merged by LSE
    (attention/overlap.py). Any other decode implementation is replaced by the Triton sparse-MLA
    decode (sgl_ess.kernels.sparse_mla_triton), which returns the LSE too.
MTP (EAGLE / NextN, one chain): SGLang's draft factory builds this class for the draft runner too;
its roles follow the constructor (draft steps: DRAFT_DECODE, reading committed rows only; the
draft's prefill / DRAFT_EXTEND_V2 backend: DRAFT_EXTEND), and TARGET_VERIFY / DRAFT_EXTEND_V2 go
through the store's union (store/verify.py: hot buffer and ring; the window's own rows and any
overflow copied zero-copy by FlashTrans, only those rows, into the slot space's MTP scratch rows:
store/verify_slots.py), attended by SGLang's decode kernel over the slot table, as SGLang runs its
own TARGET_VERIFY (``_CudaKernels.verify_slots``; no torch attention on CUDA). Mixed chunked
prefill: the prefill rows run SGLang's extend kernel (the riding decode rows' top-k masked out),
the riding decode rows the store's decode path. A decode step reads nothing back to the host (padding rows from SGLang's
count of real tokens, padding.py; the write-position check a device-side assertion; checked in the
GPU fake). Decode CUDA graphs are off unless ``--ess-cuda-graph`` (cuda_graph.py: SGLang's capture
batches - target decode and MTP TARGET_VERIFY (each Two-Batch-Overlap child's micro-batch too), EAGLE draft
steps through ESS's multi-step container, cuda_multistep.py - take device-padded paths, the side streams
join the graph at its last layer, and ``init_forward_metadata_out_graph`` / ``on_after_cuda_graph_warmup``
order eager work around the graph, once per step: a TBO child leaves both hooks to the primary; a draft
extend capture is refused); checked on CPU by a graph double, never captured on a GPU.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from .attention_kwargs import ATTN_SINK, SINKS_IMPLEMENTED, refuse_unimplemented
from .cuda_graph import graph_rows, replay_rows
from .padding import real_rows
from .query_layout import ROLE_DRAFT_DECODE, ROLE_DRAFT_EXTEND, ROLE_TARGET, accepts_early_plans
from .store_forward import StoreForward

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
        # the same per-instance roles as the CPU backend (store_forward.StoreForward reads them)
        spec_role = ROLE_TARGET
        speculative_step_id = 0
        micro_batch_base = 0
        tbo_child = False           # one of TboAttnBackend's two children (its micro-batch's backend)
        graph_container = False     # a draft step inside ESS's multi-step container (cuda_multistep.py)

        def __init__(self, model_runner, *args, **kwargs):
            super().__init__(model_runner, *args, **kwargs)
            from .backend_registration import store_for_runner

            if getattr(model_runner, "is_draft_worker", False):
                # SGLang's draft factory: DeepseekSparseAttnMultiStepBackend builds one backend per
                # draft step (speculative_num_steps > 0, speculative_step_id set by the base class);
                # the draft's prefill / DRAFT_EXTEND_V2 backend is built without steps
                self.spec_role = ROLE_DRAFT_DECODE if self.speculative_num_steps else ROLE_DRAFT_EXTEND

            self.ess = store_for_runner(model_runner)
            self._call = None            # the SGLang arguments of the forward in progress (kernels read them)
            self._forward = None
            if self.ess is not None:
                # no dense MHA one-shot prefill (SGLang's set_dsa_prefill_impl picks it on sm_90 / sm_100
                # for every batch with max kv length <= SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD):
                # it runs without top-k, so the store's extend path (open and warm the hot buffers,
                # fence the host rows) would never run. SGLang turns it off the same way for its own
                # HiSparse (a condition in set_dsa_prefill_impl) and for its dots hybrid backend (this flag)
                self.supports_mha_one_shot = False
                self.ess.static_width = True     # FlashMLA reads index_topk columns: DA's tables keep them
                cfg = model_runner.model_config
                self._forward = StoreForward(self.ess, self.req_to_token_pool, _CudaKernels(self, base), self,
                                             cfg.kv_lora_rank, cfg.qk_rope_head_dim)

        @property
        def accepts_early_plans(self) -> bool:
            return accepts_early_plans(self)    # query_layout.py: not in an EAGLE draft step

        def init_forward_metadata(self, forward_batch):
            super().init_forward_metadata(forward_batch)
            if self._forward is not None:
                self._forward.begin(forward_batch)
            self._note_tbo(forward_batch)

        def _note_tbo(self, forward_batch) -> None:
            """A Two-Batch-Overlap child's batch (SGLang's filter_batch sets ``tbo_parent_token_range``, eager
            and at a graph's capture): this backend is a child, with its own ring groups (as on CPU)."""
            rng = getattr(forward_batch, "tbo_parent_token_range", None)
            if rng is not None:
                self.tbo_child = True
                self.micro_batch_base = 0 if rng[0] == 0 else 2

        def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
            """SGLang's decode-graph metadata (before a capture, before each replay), then ESS's: a capture
            batch is remembered (its forwards take the device-padded path); before a replay, pending
            eager work is ordered ahead of the graph and the replay counted (cuda_graph.py)."""
            super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
            if self._forward is None:
                return
            if self.spec_role == ROLE_DRAFT_EXTEND and in_capture:
                raise RuntimeError("ESS CUDA graphs: SGLang is capturing the EAGLE draft extend (DRAFT_EXTEND_V2) in a "
                                   "CUDA graph, which ESS does not hold; set SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 "
                                   "(sgl_ess.launch_server sets it with --ess-cuda-graph and MTP) or drop "
                                   "--ess-cuda-graph")
            if self.spec_role == ROLE_DRAFT_DECODE:
                # a draft step: the multi-step container (cuda_multistep.py) registers the batch the steps run
                # with and calls the store's hooks once for all steps; SGLang's own container hands a view here
                if in_capture and not self.graph_container:
                    raise RuntimeError("ESS CUDA graphs: an EAGLE draft step is captured through SGLang's own "
                                       "DeepseekSparseAttnMultiStepBackend, whose capture batch and replays ESS "
                                       "cannot see; ESS's subclass (cuda_multistep.py, installed by "
                                       "cuda_backend.register) must replace it")
                return
            if in_capture:
                self._note_tbo(forward_batch)
                if not self.tbo_child:      # TboAttnBackend: the primary starts the capture of the whole step
                    self.ess.graph_capture_batch(int(forward_batch.batch_size))
                self._forward.graph_batches.add(forward_batch)
            elif not self.tbo_child:        # a child's replay view (no num_padding): the primary counted the step
                size, n_real, rows = replay_rows(forward_batch, self.ess.has_pending())
                self.ess.graph_replay(rows, size, n_real)

        def on_after_cuda_graph_warmup(self):
            """After each of SGLang's two warm-up runs of a capture batch (its capture comes after the
            second): nothing eager is left for the capture to wait on."""
            super().on_after_cuda_graph_warmup()
            if self.ess is not None and not self.tbo_child:     # once per step: TboAttnBackend calls the primary
                self.ess.graph_capture()

        def get_indexer_metadata(self, layer_id, forward_batch):
            md = super().get_indexer_metadata(layer_id, forward_batch)
            if self.ess is not None and not md.force_unfused_topk:
                md = dataclasses.replace(md, force_unfused_topk=True)   # token positions, not locations
            return md

        def _q_all(self, q, q_rope, layer):
            if q_rope is not None:
                q_nope = q.view(-1, layer.tp_q_head_num, layer.v_head_dim)
                q_rope = q_rope.view(q_nope.shape[0], layer.tp_q_head_num, layer.head_dim - layer.v_head_dim)
                return mod.concat_mla_absorb_q_general(q_nope, q_rope)
            return q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim)

        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None,
                           topk_indices=None, **kwargs):
            if self.ess is None or topk_indices is None:
                if self.ess is not None:       # SGLang writes the rows itself: after their zeroing (fence_host)
                    self.ess.fence_host(layer.layer_id)
                return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, q_rope=q_rope,
                                              k_rope=k_rope, topk_indices=topk_indices, **kwargs)
            refuse_unimplemented(kwargs, "dsa (ESS on)", SINKS_IMPLEMENTED)   # attn_sink reaches every path
            sink = kwargs.get(ATTN_SINK)     # the prefill kernel gets it in SGLang's own kwargs (_call)
            mode = forward_batch.forward_mode
            self.ess.fence_host(layer.layer_id)    # this layer's zeroing of released rows lands before the write
            if k is not None and save_kv_cache:
                self._forward.save(layer, forward_batch, lambda: self.token_to_kv_pool.set_mla_kv_buffer(
                    layer, forward_batch.out_cache_loc, k, k_rope))
            if mode.is_target_verify() or mode.is_draft_extend_v2():
                # MTP: the window's union through hot buffer and ring (store/verify.py), attended by
                # _CudaKernels.verify_slots (SGLang's decode kernel) over the absorbed query
                q_all = self._q_all(q, q_rope, layer)
                out = self._forward.extend(q_all.reshape(q_all.shape[0], -1), layer, forward_batch, topk_indices, sink)
                return out.view(q_all.shape[0], layer.tp_q_head_num, -1)
            # the prefill kernel reads SGLang's own arguments (_call); the store path (riding decode
            # rows of a mixed chunked-prefill batch) reads the absorbed query
            self._call = (q, v, q_rope, kwargs, topk_indices)
            try:
                q_in = q                 # a plain prefill never reads it here: no [T, H, D] copy per layer
                if any(self._forward.riding(forward_batch, self._forward.layout(forward_batch))):
                    q_all = self._q_all(q, q_rope, layer)
                    q_in = q_all.reshape(q_all.shape[0], -1)
                return self._forward.extend(q_in, layer, forward_batch, topk_indices, sink)
            finally:
                self._call = None

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None,
                           topk_indices=None, **kwargs):
            if self.ess is None or topk_indices is None:
                if self.ess is not None:       # SGLang writes the rows itself: after their zeroing (fence_host)
                    self.ess.fence_host(layer.layer_id)
                return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, q_rope=q_rope,
                                              k_rope=k_rope, topk_indices=topk_indices, **kwargs)
            refuse_unimplemented(kwargs, "dsa (ESS on)", SINKS_IMPLEMENTED)
            self.ess.fence_host(layer.layer_id)
            if k is not None and save_kv_cache:
                self._forward.save(layer, forward_batch, lambda: self.token_to_kv_pool.set_mla_kv_buffer(
                    layer, forward_batch.out_cache_loc, k, k_rope))
            q_all = self._q_all(q, q_rope, layer)
            topk = self._pad_topk_indices(topk_indices, q_all.shape[0])
            out = self._forward.decode(q_all.reshape(q_all.shape[0], -1), layer, forward_batch, topk, kwargs.get(ATTN_SINK))
            return out.view(q_all.shape[0], layer.tp_q_head_num, -1)     # [b, H, R], as SGLang's kernels return

    EssDeepseekSparseAttnBackend.__qualname__ = "EssDeepseekSparseAttnBackend"
    _cls = EssDeepseekSparseAttnBackend
    return _cls


class _CudaKernels:
    """store_forward.AttentionKernels on CUDA: SGLang's own prefill kernels over the full history
    (the zero-copy view of the host pool), FlashMLA (or our Triton decode) over the slot space."""

    # every decode kernel here returns its log-sum-exp: attention may be split (DA, DBA)
    single_call = False

    def __init__(self, backend, base):
        self.b = backend
        self.base = base
        self._schedules: dict = {}      # flashmla_kv tile schedules of partial batches, by row count

    def prefill(self, q, layer, forward_batch, topk_pos, tok_req, token_idx, sink=None):
        """SGLang's extend kernel over the whole batch (its metadata is the batch's). In a mixed
        chunked-prefill batch (`token_idx`: the prefill rows' tokens) the riding decode rows' top-k
        are masked to -1, so the kernel reads nothing for them (the store serves them), and only the
        prefill rows' outputs are returned. `sink`: also in SGLang's own kwargs (attn_sink), which its
        extend kernel takes (SGLang: flashmla_sparse only)."""
        b = self.b
        q_orig, v, q_rope, kwargs, topk_all = b._call
        topk = topk_pos
        if token_idx is not None:
            topk = torch.full_like(topk_all, -1)
            topk[token_idx] = topk_pos.to(topk.dtype)
            tok_req = torch.zeros(topk.shape[0], dtype=tok_req.dtype, device=tok_req.device).index_copy_(
                0, token_idx.to(tok_req.device), tok_req)
        if b.use_fused_topk:
            # SGLang's fused-top-k prefill reads the top-k as pool locations; the store's indexer
            # hands over token positions (force_unfused_topk), so map them through req_to_token
            r2t = b.req_to_token_pool.req_to_token
            locs = r2t[tok_req[:, None], topk.long().clamp(min=0)]
            topk = torch.where(topk >= 0, locs.to(topk.dtype), torch.full_like(topk, -1))
        out = self.base.forward_extend(b, q_orig, None, v, layer, forward_batch, False, q_rope=q_rope,
                                       k_rope=None, topk_indices=topk, **kwargs)
        if token_idx is None:
            return out
        return out.reshape(out.shape[0], -1)[token_idx.to(out.device)]

    def slots(self, q3, layer, slot_rows, slots):
        b = self.b
        impl = b.dsa_decode_impl
        # the Triton decode: GPUs whose shared memory fits it (kernels/sparse_mla_smem.py picks its stages, refuses
        # the rest), split attention (LSE); also the riding decode rows of a mixed
        # chunked-prefill batch (b._call set: inside an extend), for which SGLang's extend metadata
        # holds no FlashMLA decode metadata
        if impl not in SUPPORTED_DECODE_IMPLS or b._call is not None:
            from sgl_ess.kernels import sparse_mla_triton

            return sparse_mla_triton.sparse_mla_decode_triton(q3, slot_rows, slots, b.ess.latent_layout(),
                                                              layer.scaling)
        from . import flashmla_lse

        kv = b.ess.as_kv_cache(slot_rows)
        if impl == "flashmla_kv":
            return flashmla_lse.decode_kv(b, q3, kv, slots, layer, self._schedules)
        return flashmla_lse.decode_sparse(b, q3, kv, slots, layer)

    def verify_slots(self, q, layer, slot_rows, slots, sink=None):
        """MTP verify / draft extend: q [T, H*D] absorbed queries, slots int32 [T, k] rows of the slot
        space (hot slots, ring rows, the MTP scratch rows holding the window and overflow entries:
        store/verify_slots.py; -1 excluded) -> [T, H*R]. SGLang's own decode kernel over the slot
        space, as its DSA backend runs TARGET_VERIFY / DRAFT_EXTEND_V2 (dsa_decode_impl over the
        expanded per-token page table, the forward's FlashMLA metadata); the Triton decode for
        other decode impls. A batch with SGLang's padding tokens passes only its real rows here:
        the kernel gets the metadata's token count, the padding rows masked (-1). `sink` [H]:
        learnable sink logits, counted once from the kernel's log-sum-exp (reference.with_sink)."""
        b = self.b
        t, k = slots.shape
        q3 = q.reshape(t, layer.tp_q_head_num, -1)
        seqlens = getattr(b.forward_metadata, "dsa_cache_seqlens_int32", None)
        full = int(seqlens.shape[0]) if seqlens is not None else t
        if full > t:          # FlashMLA's metadata covers every token of the forward
            q3 = torch.cat([q3, q3.new_zeros(full - t, *q3.shape[1:])])
            slots = torch.cat([slots, slots.new_full((full - t, k), -1)])
        out, lse = self.slots(q3, layer, slot_rows, slots)
        if sink is not None:
            from sgl_ess.attention.reference import with_sink

            out, _ = with_sink(out, lse, sink)
        return out[:t].reshape(t, -1)

    def newest(self, layer, loc):
        return self.b.token_to_kv_pool.get_key_buffer(layer.layer_id)[loc.long()]   # zero-copy read


def _around_indexer_forward_cuda(original_fn, self, x, q_lora, positions, forward_batch, layer_id, *args, **kwargs):
    """After SGLang's indexer picked a decode batch's top-k: submit its misses' fetch at once."""
    out = original_fn(self, x, q_lora, positions, forward_batch, layer_id, *args, **kwargs)
    if out is not None and forward_batch.forward_mode.is_decode():
        from sglang.srt.model_executor.forward_context import get_attn_backend

        backend = get_attn_backend()
        ess = getattr(backend, "ess", None)
        # not an EAGLE draft step: it reads committed rows only (StoreForward plans it itself)
        if ess is not None and ess.mode(layer_id) != "none" and getattr(backend, "accepts_early_plans", True):
            from sglang.srt.model_executor.forward_context import get_req_to_token_pool

            r2t = get_req_to_token_pool().req_to_token
            fwd = getattr(backend, "_forward", None)
            if fwd is not None and forward_batch in fwd.graph_batches:     # a decode graph: padding rows -1
                # a TBO child's graph batch plans in its own ring groups, as its eager steps do
                reqs, base, kw = graph_rows(forward_batch), backend.micro_batch_base, {"padded": True}
            else:
                b = real_rows(forward_batch).n_req      # SGLang's padding rows (DP, TBO, graphs) are never planned
                if b == 0:
                    return out
                reqs, base, kw = forward_batch.req_pool_indices[:b].long(), getattr(backend, "micro_batch_base", 0), {}
            n = reqs.numel()
            # one plan per part (DBA: each half its own ring group and fetch); TBO children: their own groups
            for i, part in enumerate(ess.early_parts(layer_id, n)):
                ess.early_plan(id(forward_batch), layer_id, reqs[part], forward_batch.seq_lens[:n][part],
                               out[:n][part], r2t, base + i, **kw)
    return out


def register() -> None:
    """CUDA processes with ESS on only (importing SGLang's DSA backend needs its CUDA kernels)."""
    from sgl_ess.config import config_from_env

    cfg = config_from_env()
    if cfg is None or not cfg.enabled or not torch.cuda.is_available():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .. import targets

    HookRegistry.register(targets.DSA_BACKEND_CLASS, backend_class(), HookType.REPLACE)
    from .cuda_multistep import multistep_class

    HookRegistry.register(targets.DSA_MULTISTEP_CLASS, multistep_class(), HookType.REPLACE)
    HookRegistry.register(targets.INDEXER_FORWARD_CUDA, _around_indexer_forward_cuda, HookType.AROUND)
    from ..pools import cuda_memory

    cuda_memory.register()
    logger.info("sgl-ess: ESS on CUDA - SGLang's DSA backend decodes from the ESS slot space")
