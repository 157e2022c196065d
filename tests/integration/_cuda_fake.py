"""GPU fakes for SGLang's CUDA DSA backend: build ``EssDeepseekSparseAttnBackend`` (cuda_backend.py),
the class that ships on a GPU, on this CPU, with only its device kernels swapped for torch
references. Nothing here runs a GPU kernel; what runs is SGLang's own DSA backend code (metadata,
extend path, page-table handling) and our subclass, store and lifecycle.

Swapped (and nothing else):
  * FlashMLA (``sglang.kernels.ops.attention.flash_mla_interface``: ``get_mla_metadata``,
    ``flash_mla_with_kvcache``, ``flash_mla_sparse_fwd``) -> ``ref_sparse_mla`` (torch, float64 accumulation);
  * ``dsa_backend.quantize_k_cache`` -> identity (the fake pool holds BF16 rows, not FP8);
  * ``dsa_backend.seqlens_expand_triton`` (MTP metadata) -> ``ref_seqlens_expand`` (torch);
  * our Triton sparse-MLA decode (``sgl_ess.kernels.sparse_mla_triton``) -> its torch reference;
  * SGLang's ``get_device_sm`` -> 90 and ``torch.cuda.get_device_capability`` -> (9, 0) (an H200: the
    DSA backend's prefill dispatch decides as on sm_90), FlashAttention's varlen MHA (MHA one-shot)
    -> ``ref_flash_attn_varlen`` (torch), and the top-k v2 planner off
    (``SGLANG_OPT_USE_TOPK_V2=0``: it JIT-compiles CUDA).
The runner is tests/integration/_fake_runner.py's, plus the attributes SGLang's DSA backend reads.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import torch

from . import _fake_runner as fr

FLASH_MLA_MODULE = "sglang.kernels.ops.attention.flash_mla_interface"
TILE_SCHEDULER_PARTS, TILE_SCHEDULER_WORDS = 8, 8      # FlashMLA: [num_sm_parts, TileSchedulerMetaDataSize]


def ref_sparse_mla(q, kv_rows, idx, scale, dv, topk_length=None):
    """q [s, H, D]; kv_rows [N, D]; idx [s, k] (-1 masked) -> (out [s, H, dv] fp64, lse [s, H]).
    Accumulates in float64, as the CPU backend's attention does (sgl_ess.attention.reference.attend):
    rounded once to BF16, both give the same output except with negligible probability, so a server
    through this stand-in can be compared token for token with one on the CPU path."""
    valid = idx >= 0
    if topk_length is not None:
        valid = valid & (torch.arange(idx.shape[1])[None, :] < topk_length[:, None])
    rows = kv_rows[idx.long().clamp(min=0)].double()
    logits = torch.einsum("shd,skd->shk", q.double(), rows) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, -1)
    p = torch.softmax(logits, -1).nan_to_num(0.0)
    return torch.einsum("shk,skd->shd", p, rows[..., :dv]), lse


def copy_rows_static(src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor) -> None:
    """FlashTrans's copy (sgl_ess/kernels/flashtrans.py) with static shapes, as its CUDA kernel runs
    and as a CUDA graph needs it: no compaction of the -1 entries. Each entry adds (new - old) to its
    destination row in uint8 arithmetic (mod 256, so old + delta = new exactly); skipped entries add
    0 to row 0. Tested against copy_rows_torch, the reference (test_cuda_graph_gpu_fake.py)."""
    keep = (src_idx >= 0) & (dst_idx >= 0)
    d = torch.where(keep, dst_idx, 0).to(dst.device)
    new = src.index_select(0, torch.where(keep, src_idx, 0).to(src.device)).to(dst.device)
    delta = torch.where(keep.to(dst.device).unsqueeze(1), new - dst.index_select(0, d), 0).to(dst.dtype)
    dst.index_put_((d,), delta, accumulate=True)


def ref_seqlens_expand(extend_seq_lens, seq_lens, total_len, max_q_len):
    """SGLang's seqlens_expand_triton (kernels/ops/attention/pad.py) in torch: per request of
    qo_len query tokens over kv_len keys, the causal key count of each query token,
    max(kv_len - qo_len + 1 + j, 0) for j < qo_len, concatenated (int32 [total_len])."""
    out = [torch.clamp(torch.arange(int(q), dtype=torch.int32) + int(kv) - int(q) + 1, min=0)
           for q, kv in zip(extend_seq_lens.tolist(), seq_lens.tolist())]
    res = torch.cat(out) if out else torch.zeros(0, dtype=torch.int32)
    assert res.numel() == total_len
    return res


H200_SM = 90                      # what SGLang's get_device_sm() answers on an H200 (sm_90)
H200_CAPABILITY = (9, 0)          # torch.cuda.get_device_capability() on an H200


def ref_flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                          softmax_scale=None, causal=False, **unused):
    """FlashAttention-3's varlen MHA (what SGLang's DSA backend runs for MHA one-shot prefill on sm_90)
    in torch: per request, q [tq, H, Dqk] over k [tk, H, Dqk] / v [tk, H, Dv], causal aligned to the
    end (query j of tq attends keys 0 .. tk - tq + j, FlashAttention's bottom-right convention);
    float64 accumulation, rounded once to q's dtype. Returns [sum tq, H, Dv]."""
    if unused.get("return_softmax_lse"):
        raise NotImplementedError("ref_flash_attn_varlen: return_softmax_lse is not reproduced")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(cq) - 1):
        qs, ks = q[cq[i]:cq[i + 1]].double(), k[ck[i]:ck[i + 1]].double()
        tq, tk = qs.shape[0], ks.shape[0]
        logits = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        if causal:
            allowed = torch.arange(tk)[None, :] <= (torch.arange(tq)[:, None] + tk - tq)
            logits = logits.masked_fill(~allowed[None], float("-inf"))
        p = torch.softmax(logits, -1)
        out[cq[i]:cq[i + 1]] = torch.einsum("hqk,khd->qhd", p, v[ck[i]:ck[i + 1]].double()).to(q.dtype)
    return out


def flash_mla_stub() -> types.ModuleType:
    m = types.ModuleType(FLASH_MLA_MODULE)
    m.calls = []

    def get_mla_metadata(cache_seqlens, *args, **kwargs):
        m.calls.append("get_mla_metadata")
        # FlashMLA's shapes (the reference reads neither): a tile schedule of a fixed size per GPU and
        # one split count per request plus one; SGLang's graph metadata slices and copies both
        schedule = torch.zeros(TILE_SCHEDULER_PARTS, TILE_SCHEDULER_WORDS, dtype=torch.int32)
        return schedule, torch.zeros(cache_seqlens.shape[0] + 1, dtype=torch.int32)

    def flash_mla_with_kvcache(q, k_cache, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                               softmax_scale, indices, block_table, is_fp8_kvcache, kv_format):
        m.calls.append("flash_mla_with_kvcache")
        b, sq, h, d = q.shape
        o, lse = ref_sparse_mla(q.reshape(b * sq, h, d), k_cache.reshape(-1, k_cache.shape[-1]),
                                indices.reshape(b * sq, -1), softmax_scale, head_dim_v)
        return o.to(q.dtype).view(b, sq, h, head_dim_v), lse

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink=None, topk_length=None):
        m.calls.append("flash_mla_sparse_fwd")
        o, lse = ref_sparse_mla(q, kv.reshape(kv.shape[0], -1), indices[:, 0], sm_scale, d_v, topk_length)
        return o.to(q.dtype), lse, lse

    m.get_mla_metadata, m.flash_mla_with_kvcache, m.flash_mla_sparse_fwd = (
        get_mla_metadata, flash_mla_with_kvcache, flash_mla_sparse_fwd)
    return m


def install_gpu_fakes(monkeypatch, decode_impl: str = "flashmla_kv", prefill_impl: str = "flashmla_sparse",
                      **server_args):
    """Swap the device kernels and publish the server args SGLang's DSA backend reads (plus
    `server_args`, e.g. the speculative ones). Returns the FlashMLA stub (its ``calls`` list says
    which kernels ran)."""
    from sglang.srt.layers.attention import dsa_backend as mod
    from sglang.srt.runtime_context import get_context

    stub = flash_mla_stub()
    monkeypatch.setitem(sys.modules, FLASH_MLA_MODULE, stub)
    monkeypatch.setattr(mod, "quantize_k_cache", lambda kv, dv=None: kv)
    monkeypatch.setattr(mod, "seqlens_expand_triton", ref_seqlens_expand)
    from sgl_ess.attention.reference import sparse_mla_decode
    from sgl_ess.kernels import sparse_mla_triton

    monkeypatch.setattr(sparse_mla_triton, "sparse_mla_decode_triton", sparse_mla_decode)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: H200_CAPABILITY)
    # SGLang's sm number (0 without CUDA): an H200's, read by the DSA backend's prefill dispatch
    # (set_dsa_prefill_impl binds sglang.srt.utils.get_device_sm at construction)
    import sglang.srt.utils as sgl_utils
    import sglang.srt.utils.common as sgl_common

    monkeypatch.setattr(sgl_utils, "get_device_sm", lambda: H200_SM)
    monkeypatch.setattr(sgl_common, "get_device_sm", lambda: H200_SM)
    monkeypatch.setattr(mod, "flash_attn_varlen_func", ref_flash_attn_varlen)
    monkeypatch.setenv("SGLANG_OPT_USE_TOPK_V2", "0")
    ov = get_context().override_server_args(dsa_decode_backend=decode_impl, dsa_prefill_backend=prefill_impl,
                                            **server_args)
    ov.install()
    return stub, ov


def cuda_runner(req_pool, allocator, layers: int):
    """_fake_runner's runner plus what DeepseekSparseAttnBackend.__init__ reads."""
    runner = fr.fake_runner(req_pool, allocator, layers)
    runner.page_size = fr.PAGE
    runner.is_draft_worker = False
    runner.hisparse_coordinator = None
    runner.kv_cache_dtype = fr.DTYPE
    mc = runner.model_config
    mc.hf_config.architectures = ["DeepseekV32ForCausalLM"]
    mc.context_len = req_pool.req_to_token.shape[1]
    mc.num_attention_heads = fr.HEADS
    mc.qk_nope_head_dim = fr.KV_LORA
    pool = runner.token_to_kv_pool
    pool.dsa_kv_cache_store_fp8 = False
    pool.dtype = fr.DTYPE

    def set_mla_kv_buffer(layer, loc, k_nope, k_rope):
        """SGLang's writer: one packed row (nope ++ rope) per token, into the host-backed buffer."""
        row = torch.cat([k_nope.reshape(-1, fr.KV_LORA), k_rope.reshape(-1, fr.ROPE)], dim=-1)
        pool.kv_buffer[layer.layer_id][loc.long(), 0] = row.to(fr.DTYPE)
    pool.set_mla_kv_buffer = set_mla_kv_buffer
    return runner


def cuda_layer(i: int):
    return SimpleNamespace(layer_id=i, tp_q_head_num=fr.HEADS, tp_k_head_num=1, scaling=fr.KV_DIM ** -0.5,
                           is_cross_attention=False, v_head_dim=fr.KV_LORA, head_dim=fr.KV_DIM, logit_cap=0.0)


def cuda_batch(mode: str, reqs, seq_lens, loc, extend_lens=None, prefix_lens=None):
    fb = fr.forward_batch(mode, reqs, seq_lens, loc, extend_lens=extend_lens)
    fb.seq_lens_sum = int(fb.seq_lens.sum())
    fb.extend_prefix_lens_cpu = prefix_lens
    fb.global_num_tokens_cpu = None
    fb.attn_cp_metadata = None
    fb.encoder_out_cache_loc = None
    from sglang.srt.environ import envs

    fb.get_max_chunk_capacity = envs.SGLANG_MAX_KV_CHUNK_CAPACITY.get     # SGLang's ForwardBatch's answer
    if extend_lens is not None:
        fb.extend_seq_lens = torch.tensor(extend_lens, dtype=torch.int32)
    return fb


def reference(runner, layer_id: int, q, reqs_per_token: torch.Tensor, topk_pos: torch.Tensor) -> torch.Tensor:
    """Dense truth: the rows of each query's top-k positions, read through req_to_token from the
    full history. q [T, H*D] -> [T, H, R] fp32."""
    r2t = runner.req_to_token_pool.req_to_token
    locs = torch.where(topk_pos >= 0, r2t[reqs_per_token[:, None], topk_pos.long().clamp(min=0)].long(), -1)
    kv = runner.token_to_kv_pool.get_key_buffer(layer_id).reshape(-1, fr.KV_DIM)
    out, _ = ref_sparse_mla(q.view(-1, fr.HEADS, fr.KV_DIM), kv, locs, fr.KV_DIM ** -0.5, fr.KV_LORA)
    return out
