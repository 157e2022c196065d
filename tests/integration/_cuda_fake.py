"""GPU fakes for SGLang's CUDA DSA backend: build ``EssDeepseekSparseAttnBackend`` (cuda_backend.py),
the class that ships on a GPU, on this CPU, with only its device kernels swapped for torch
references. Nothing here runs a GPU kernel; what runs is SGLang's own DSA backend code (metadata,
extend path, page-table handling) and our subclass, store and lifecycle.

Swapped (and nothing else):
  * FlashMLA (``sglang.kernels.ops.attention.flash_mla_interface``: ``get_mla_metadata``,
    ``flash_mla_with_kvcache``, ``flash_mla_sparse_fwd``) -> ``ref_sparse_mla`` (torch, float64 accumulation);
  * ``dsa_backend.quantize_k_cache`` (SGLang's FP8 writer, Triton) -> ``ref_quantize_k_cache``, its
    formula in torch; the FlashMLA stand-in dequantizes FP8 rows (``is_fp8_kvcache``, always set by
    SGLang's flashmla_kv) from FlashMLA's documented 656-byte layout (``dequant_flashmla_fp8``);
  * ``dsa_backend.seqlens_expand_triton`` (MTP metadata) -> ``ref_seqlens_expand`` (torch);
  * our Triton sparse-MLA decode (``sgl_ess.kernels.sparse_mla_triton``) -> its torch reference;
  * SGLang's ``get_device_sm`` -> 90 and ``torch.cuda.get_device_capability`` -> (9, 0) (an H200: the
    DSA backend's prefill dispatch decides as on sm_90), FlashAttention's varlen MHA (MHA one-shot)
    -> ``ref_flash_attn_varlen`` (torch), SGLang's fused top-k transform -> ``ref_fused_topk_transform``
    over the torch indexer's positions (whole servers: sitecustomize), and the top-k v2 planner off
    (``SGLANG_OPT_USE_TOPK_V2=0``: it JIT-compiles CUDA).
The runner is tests/integration/_fake_runner.py's, plus the attributes SGLang's DSA backend reads.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass
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
    rows = rows.masked_fill(~valid.unsqueeze(-1), 0.0)   # a masked entry reads nothing (an unwritten FP8 row is NaN)
    logits = torch.einsum("shd,skd->shk", q.double(), rows) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, -1)
    p = torch.softmax(logits, -1).nan_to_num(0.0)
    return torch.einsum("shk,skd->shd", p, rows[..., :dv]), lse


V32_NOPE, V32_ROPE = 512, 64       # DeepSeek-V3.2's latent: the only width FlashMLA's FP8 rows hold
FP8_TILE = 128                    # FlashMLA's FP8 KV: one fp32 scale per 128 NoPE values
FP8_E4M3_MAX = 448.0              # torch.finfo(torch.float8_e4m3fn).max, SGLang's FP8_MAX


def ref_quantize_k_cache(cache_k: torch.Tensor, dv: int | None = None) -> torch.Tensor:
    """SGLang's FP8 KV writer (kernels/ops/quantization/dsa_quant_k_cache.py, the Triton kernel
    _quantize_k_cache_fast_kernel behind quantize_k_cache) in torch: per token and 128-value NoPE
    tile, y = bf16 -> fp32, scale = max|y| / 448, codes = clamp(y * (1 / scale), -448, 448) cast to
    float8_e4m3fn (round to nearest even, as the GPU's cvt.rn); the scales stored as fp32 after the
    codes, then the RoPE values' bf16 bytes unchanged. An all-zero tile gives scale 0 and NaN codes,
    as SGLang's kernel does (no eps). Triton's fp32 division on a GPU may round 1 / scale one ulp
    differently; the fake's ESS-on and ESS-off paths both read these bytes, so comparisons between
    them are unaffected. cache_k [..., dv + rope] bf16 -> float8_e4m3fn [..., dv + 4 * dv / 128 + 2 * rope]."""
    lead, width = cache_k.shape[:-1], cache_k.shape[-1]
    dv = 512 if dv is None and width == 576 else dv
    if dv is None or dv % FP8_TILE:
        raise ValueError(f"ref_quantize_k_cache: NoPE width {dv} of {width}: pass dv, a multiple of {FP8_TILE}")
    x = cache_k.reshape(-1, width)
    y = x[:, :dv].to(torch.bfloat16).float().reshape(x.shape[0], -1, FP8_TILE)
    scale = y.abs().amax(-1) / FP8_E4M3_MAX
    codes = (y * (1.0 / scale).unsqueeze(-1)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    rope = x[:, dv:].to(torch.bfloat16).contiguous()
    out = torch.cat([codes.reshape(x.shape[0], dv).view(torch.uint8), scale.contiguous().view(torch.uint8),
                     rope.view(torch.uint8)], dim=1)
    return out.view(torch.float8_e4m3fn).reshape(*lead, -1)


def ref_quantize_k_cache_separate(k_nope: torch.Tensor, k_rope: torch.Tensor | None, tile_size: int = 128):
    """SGLang's quantize_k_cache_separate (the same kernel, two outputs) in torch: (nope codes ++ fp32
    scales as uint8 [n, dv + 4 * dv / 128], rope bf16 bytes as uint8 [n, 2 * rope])."""
    if tile_size != FP8_TILE:
        raise ValueError(f"ref_quantize_k_cache_separate: tile {tile_size}, only {FP8_TILE} is reproduced")
    nope = k_nope.reshape(k_nope.shape[0], -1)
    rope = (k_rope.reshape(nope.shape[0], -1) if k_rope is not None and k_rope.numel()
            else nope.new_empty(nope.shape[0], 0))
    rows = ref_quantize_k_cache(torch.cat([nope, rope], dim=1), nope.shape[1]).view(torch.uint8)
    cut = nope.shape[1] + 4 * (nope.shape[1] // FP8_TILE)
    return rows[:, :cut].unsqueeze(1), rows[:, cut:].unsqueeze(1)


def dequant_flashmla_fp8(k_cache: torch.Tensor, d_nope: int) -> torch.Tensor:
    """FlashMLA's FP8 KV cache (its README, "FP8 KV cache" of sparse decoding; SGLang's
    kv_format "V32"), read back: each token's row is d_nope float8_e4m3 NoPE values, then one fp32
    scale per 128 of them, then the RoPE part as bf16 values, unquantized (DeepSeek-V3.2: 512 + 16 +
    128 = 656 bytes). NoPE value i = code[i] * scale[i // 128]. k_cache [..., row] (any 1-byte dtype)
    -> float32 [N, d_nope + rope], one row per token."""
    rows = k_cache.reshape(-1, k_cache.shape[-1]).view(torch.uint8)
    tiles = d_nope // FP8_TILE
    rope = (rows.shape[1] - d_nope - 4 * tiles) // 2
    if d_nope % FP8_TILE or d_nope + 4 * tiles + 2 * rope != rows.shape[1]:
        raise ValueError(f"dequant_flashmla_fp8: a {rows.shape[1]}-byte row is not {d_nope} FP8 NoPE values + "
                         f"{tiles} fp32 scales + bf16 RoPE")
    codes = rows[:, :d_nope].contiguous().view(torch.float8_e4m3fn).float().reshape(-1, tiles, FP8_TILE)
    scales = rows[:, d_nope:d_nope + 4 * tiles].contiguous().view(torch.float32)
    rope_v = rows[:, d_nope + 4 * tiles:].contiguous().view(torch.bfloat16).float()
    return torch.cat([(codes * scales.unsqueeze(-1)).reshape(-1, d_nope), rope_v], dim=1)


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


# the forward modes whose DSA metadata the fused top-k stand-in was checked against (SGLang 0.5.23's
# dsa_backend.init_forward_metadata: MIXED takes the EXTEND branch; SGLang 0.5.23 has no DRAFT_EXTEND
# but DRAFT_EXTEND_V2)
FUSED_TOPK_MODES = frozenset({"EXTEND", "MIXED", "DECODE", "IDLE", "TARGET_VERIFY", "DRAFT_EXTEND_V2"})


def ref_fused_topk_transform(topk_pos: torch.Tensor, forward_batch, layer_id: int) -> torch.Tensor:
    """SGLang's fused top-k transform (sgl-kernel ``fast_topk_transform_fused``, the default
    SGLANG_DSA_FUSE_TOPK on CUDA) applied to the torch indexer's token positions (int32 [T, k], -1
    padding), for the forwards whose indexer metadata asks for it: the attention backend's
    ``get_indexer_metadata`` with ``force_unfused_topk`` off (SGLang's own DSA backend, ESS off; ESS's
    CUDA class forces it on and gets positions). On CUDA that kernel hands the backend physical
    page-size-1 slots and the backend reads them as pool locations (``_get_fused_topk_page_table``);
    positions read there would address other rows.

    The kernel (sgl-kernel topk.cu, ``topk_transform_prefill_kernel`` / ``_decode_kernel``) reads
    query row t's slots from the row i of ``page_table_1`` with ``cu_seqlens_q[i] <= t <
    cu_seqlens_q[i + 1]`` (``DSAIndexerMetadata.topk_transform`` passes the metadata's
    ``cu_seqlens_q``): out[t, j] = page_table_1[i, pos[t, j]], -1 kept. SGLang's metadata
    (``dsa_backend.init_forward_metadata``) makes that one row per request in EXTEND (per extend
    token range) and DECODE, and one row per query token in TARGET_VERIFY and DRAFT_EXTEND_V2 (``page_table``
    repeat-interleaved by the draft-token count,
    ``cu_seqlens_q`` = arange), so one mapping covers every mode; the modes are listed anyway so a
    new one is refused rather than guessed. Only the PAGED method: RAGGED (FP8 pool with a
    flashmla_sparse-family prefill, EXTEND) addresses concatenated KV and is refused, as are
    prefill context parallelism and top-k v2 (not what these fakes run)."""
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention.dsa.dsa_topk_backend import TopkTransformMethod
    from sglang.srt.model_executor.forward_context import get_attn_backend

    get_md = getattr(get_attn_backend(), "get_indexer_metadata", None)
    md = get_md(layer_id, forward_batch) if get_md is not None else None
    if md is None or md.force_unfused_topk or not envs.SGLANG_DSA_FUSE_TOPK.get():
        return topk_pos                                      # the unfused form: token positions
    mode = forward_batch.forward_mode
    if md.topk_transform_method != TopkTransformMethod.PAGED or mode.name not in FUSED_TOPK_MODES:
        raise NotImplementedError(
            f"GPU fake: the fused top-k stand-in covers PAGED {sorted(FUSED_TOPK_MODES)} only, got "
            f"{md.topk_transform_method!r} in {mode.name}; set SGLANG_DSA_FUSE_TOPK=0 for this test")
    if envs.SGLANG_OPT_USE_TOPK_V2.get():
        raise NotImplementedError("GPU fake: the fused top-k stand-in reproduces the page_size=1 kernel, "
                                  "not top-k v2 (set SGLANG_OPT_USE_TOPK_V2=0)")
    am = md.attn_metadata
    page_table, cu = am.page_table_1, am.cu_seqlens_q
    assert page_table is not None, "the fused PAGED transform reads page_table_1"
    cu = cu.long().tolist()
    if len(cu) - 1 != page_table.shape[0] or cu[-1] > topk_pos.shape[0]:
        raise NotImplementedError(f"GPU fake: cu_seqlens_q {cu} does not address {page_table.shape[0]} page "
                                  f"table rows / {topk_pos.shape[0]} query rows in {mode.name}")
    if bool((topk_pos[cu[-1]:] >= 0).any()):
        raise NotImplementedError("GPU fake: query rows past cu_seqlens_q[-1] hold top-k positions")
    out = topk_pos.clone()
    for i in range(len(cu) - 1):
        rows = topk_pos[cu[i]:cu[i + 1]]
        locs = page_table[i][rows.long().clamp(min=0)]
        out[cu[i]:cu[i + 1]] = torch.where(rows >= 0, locs.to(out.dtype), rows)
    return out


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


def lonely_lse(lse: torch.Tensor) -> torch.Tensor:
    """FlashMLA's log-sum-exp of a query with no valid index: +inf (its output 0), not -inf
    (FlashMLA's tests/ref.py: 'lonely' queries)."""
    return lse.masked_fill(lse == float("-inf"), float("inf"))


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
        if is_fp8_kvcache:      # always, from SGLang's flashmla_kv (a BF16 pool is quantized first)
            if kv_format not in ("V32", None) or k_cache.element_size() != 1:
                raise NotImplementedError(f"FlashMLA stand-in: FP8 rows of format {kv_format!r}, "
                                          f"{k_cache.dtype}: only V32 (656-byte rows) is reproduced")
            m.calls.append("fp8_kvcache")
            kv_rows = dequant_flashmla_fp8(k_cache, head_dim_v)
        else:
            kv_rows = k_cache.reshape(-1, k_cache.shape[-1])
        o, lse = ref_sparse_mla(q.reshape(b * sq, h, d), kv_rows, indices.reshape(b * sq, -1), softmax_scale,
                                head_dim_v)
        # FlashMLA's softmax_lse: float32 [b, h, s_q], natural log, +inf for a query with no valid index
        lse = lonely_lse(lse).float().view(b, sq, h).transpose(1, 2)
        return o.to(q.dtype).view(b, sq, h, head_dim_v), lse

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink=None, topk_length=None):
        m.calls.append("flash_mla_sparse_fwd")
        o, lse = ref_sparse_mla(q, kv.reshape(kv.shape[0], -1), indices[:, 0], sm_scale, d_v, topk_length)
        if attn_sink is not None:   # FlashMLA's sink: out * e^lse / (e^lse + e^sink) (a stand-in must not drop it)
            o = o * torch.sigmoid(lse - attn_sink.double().view(1, -1)).nan_to_num(0.0).unsqueeze(-1)
        # the legacy kernel SGLang calls (return_log2_lse): max_logits and lse [s_q, h] float32 in base 2,
        # lse +inf for a query with no valid index; max_logits is not reproduced (NaN: reading it fails loudly)
        lse2 = lonely_lse(lse / math.log(2.0)).float()
        return o.to(q.dtype), torch.full_like(lse2, float("nan")), lse2

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

    if decode_impl == "flashmla_kv" or prefill_impl == "flashmla_kv":
        # FlashMLA's FP8 rows (and SGLang's quantizer) exist for DeepSeek-V3.2's latent only, 512 NoPE +
        # 64 RoPE values: the runner, layers and queries this fake builds take that width (the heads
        # and top-k stay small)
        for name, value in (("KV_LORA", V32_NOPE), ("ROPE", V32_ROPE), ("KV_DIM", V32_NOPE + V32_ROPE)):
            monkeypatch.setattr(fr, name, value)
    stub = flash_mla_stub()
    monkeypatch.setitem(sys.modules, FLASH_MLA_MODULE, stub)
    monkeypatch.setattr(mod, "quantize_k_cache", ref_quantize_k_cache)
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


def _fp8_pool(layers: int, pool_tokens: int = 4096) -> SimpleNamespace:
    """SGLang's DSA pool with an FP8 KV cache (--kv-cache-dtype fp8_e4m3: dsa_kv_cache_store_fp8), host
    backed as ESS builds it: uint8 rows of FlashMLA's layout (kv_cache_dim 656 for V3.2), handed to
    kernels as float8_e4m3fn views [N, 1, 656] (get_key_buffer)."""
    from sgl_ess.kernels.latent_layout import LatentLayout
    from sgl_ess.store import HostLatentPool

    row = LatentLayout("fp8_flashmla", fr.KV_LORA, fr.ROPE).row_bytes
    host = HostLatentPool(layers, pool_tokens + fr.PAGE, row, pin=False)
    raw = [host.rows[i].view(pool_tokens + fr.PAGE, 1, row) for i in range(layers)]
    fp8 = [r.view(torch.float8_e4m3fn) for r in raw]
    return SimpleNamespace(ess_host_pool=host, kv_cache_dim=row, store_dtype=torch.uint8, dtype=torch.float8_e4m3fn,
                           layer_num=layers, kv_buffer=raw, get_key_buffer=lambda i: fp8[i], device="cpu",
                           dsa_kv_cache_store_fp8=True)


def cuda_runner(req_pool, allocator, layers: int, fp8_pool: bool = False):
    """_fake_runner's runner plus what DeepseekSparseAttnBackend.__init__ reads. `fp8_pool`: the KV
    cache of an H200's default configuration, FP8 656-byte rows (install_gpu_fakes with flashmla_kv
    first: the V3.2 latent width)."""
    runner = fr.fake_runner(req_pool, allocator, layers)
    if fp8_pool:
        runner.token_to_kv_pool = _fp8_pool(layers)
    runner.page_size = fr.PAGE
    runner.is_draft_worker = False
    runner.hisparse_coordinator = None
    runner.kv_cache_dtype = torch.float8_e4m3fn if fp8_pool else fr.DTYPE
    mc = runner.model_config
    mc.hf_config.architectures = ["DeepseekV32ForCausalLM"]
    mc.context_len = req_pool.req_to_token.shape[1]
    mc.num_attention_heads = fr.HEADS
    mc.qk_nope_head_dim = fr.KV_LORA
    pool = runner.token_to_kv_pool
    if not fp8_pool:
        pool.dsa_kv_cache_store_fp8 = False
        pool.dtype = fr.DTYPE

    def set_mla_kv_buffer(layer, loc, k_nope, k_rope):
        """SGLang's writer: one packed row (nope ++ rope) per token, into the host-backed buffer; an FP8
        pool stores SGLang's quantizer's bytes (ref_quantize_k_cache)."""
        row = torch.cat([k_nope.reshape(-1, fr.KV_LORA), k_rope.reshape(-1, fr.ROPE)], dim=-1)
        if fp8_pool:
            q = ref_quantize_k_cache(row.to(torch.bfloat16), fr.KV_LORA)
            pool.kv_buffer[layer.layer_id][loc.long(), 0] = q.view(torch.uint8)
        else:
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


BF16_U = 2.0 ** -8       # one rounding to bfloat16 (8 significant bits): relative error at most this
FP32_U = 2.0 ** -24      # float32's unit roundoff


@dataclass
class ReadStats:
    """What a reference read: the largest |value| (the first R columns) among the rows the queries
    attend, and the largest |log-sum-exp| of their attention."""

    vmax: float
    lse_max: float


def split_bound(want: torch.Tensor, st: ReadStats) -> float:
    """Error bound of a decode whose attention is split (DA: the hits' call and the misses' call; DBA:
    the same per half batch) and merged by log-sum-exp, with kernels whose outputs are BF16 (FlashMLA):
    each partial output is rounded once (at most BF16_U * |o_i| <= BF16_U * vmax: a partial output is a
    convex combination of its value rows), merged in float32 (each weight exp(l_i - lse) carries a
    relative error of a few float32 roundings of its exponent, <= 8 * FP32_U * (lse_max + 1), and
    exp(l_i - lse) * |l_i| <= |lse| + 1), and the merged output rounded once more (BF16_U * |out|).
    An unsplit call is within the first and last terms' single rounding."""
    return BF16_U * (float(want.abs().max()) + st.vmax) + 16 * FP32_U * (st.lse_max + 1) * st.vmax + 1e-6


def reference(runner, layer_id: int, q, reqs_per_token: torch.Tensor, topk_pos: torch.Tensor,
              fp8: bool = False, stats: bool = False):
    """Dense truth: the rows of each query's top-k positions, read through req_to_token from the
    full history. q [T, H*D] -> [T, H, R] fp32. `fp8`: the kernel under test read FP8 rows (SGLang's
    flashmla_kv quantizes a BF16 cache first): the truth reads the same bytes, SGLang's quantizer
    (ref_quantize_k_cache) applied to each row and FlashMLA's layout read back. `stats`: also what it
    read (ReadStats, for split_bound)."""
    r2t = runner.req_to_token_pool.req_to_token
    locs = torch.where(topk_pos >= 0, r2t[reqs_per_token[:, None], topk_pos.long().clamp(min=0)].long(), -1)
    pool = runner.token_to_kv_pool
    if pool.dsa_kv_cache_store_fp8:             # an FP8 pool: its own 656-byte rows
        kv = dequant_flashmla_fp8(pool.get_key_buffer(layer_id), fr.KV_LORA)
    else:
        kv = pool.get_key_buffer(layer_id).reshape(-1, fr.KV_DIM)
        if fp8:
            kv = dequant_flashmla_fp8(ref_quantize_k_cache(kv, fr.KV_LORA), fr.KV_LORA)
    out, lse = ref_sparse_mla(q.view(-1, fr.HEADS, fr.KV_DIM), kv, locs, fr.KV_DIM ** -0.5, fr.KV_LORA)
    if not stats:
        return out
    read = kv[locs.clamp(min=0)][..., :fr.KV_LORA].double().abs().masked_fill((locs < 0).unsqueeze(-1), 0.0)
    fin = lse[lse.isfinite()].abs()
    return out, ReadStats(float(read.max()) if read.numel() else 0.0, float(fin.max()) if fin.numel() else 0.0)
