"""The DeepSeek-V4 attention reference (sgl_ess/attention/dsv4_*.py) against SGLang 0.5.23's own torch
code for the same pieces, on fresh random inputs:

  window rows          ``build_causal_swa_page_indices`` (kernels/ops/attention/dsv4/attn_metadata_kernels.py:528,
                       the torch arm its ``BuildCausalSwaPageIndices`` takes for CPU tensors)
  indexer scores       ``fp8_paged_mqa_logits_torch`` (srt/layers/attention/dsv4/indexer.py:82)
  indexer top-k        ``topk_transform_pytorch_vectorized`` (indexer.py:363)
  RoPE table           ``precompute_freqs_cis`` (kernels/ops/attention/dsv4/rope.py:28), used as the input
  compressor state     ``get_compress_state_ring_size`` (srt/mem_cache/deepseek_v4_memory_pool.py:60)

SGLang has no torch form of the C4/C128 pooling or of the sparse attention with sinks; those are checked
in test_dsv4_reference.py."""
import pytest
import torch

from sgl_ess.attention.dsv4_attention import window_positions
from sgl_ess.attention.dsv4_compressor import CompressorState
from sgl_ess.attention.dsv4_indexer import index_scores, select_topk, visible_c4_entries
from sgl_ess.attention.dsv4_rope import apply_rope_tail

pytest.importorskip("sglang")


def test_window_equals_sglangs_causal_swa_indices():
    from sglang.kernels.ops.attention.dsv4.attn_metadata_kernels import build_causal_swa_page_indices

    max_tokens, window = 400, 128
    req_to_token = torch.arange(max_tokens, dtype=torch.int32)[None]        # identity: slot = position
    # SGLang's full->SWA map ends with a -1 sentinel that the masked (-1) positions index (allocator/swa.py:108-118)
    full_to_swa = torch.cat([torch.arange(max_tokens, dtype=torch.int64), torch.tensor([-1])])
    positions = torch.tensor([0, 5, 126, 127, 128, 129, 399])
    theirs = build_causal_swa_page_indices(
        req_to_token=req_to_token, full_to_swa_mapping=full_to_swa,
        req_pool_indices_repeated=torch.zeros(len(positions), dtype=torch.int64),
        seq_lens_casual=(positions + 1).to(torch.int32), swa_window=window, page_index_aligned_size=64)
    assert theirs.shape == (len(positions), window)
    assert torch.equal(window_positions(positions, window), theirs.long())


def test_index_scores_equal_sglangs_paged_mqa_logits():
    """Keys are FP8 values with scale 1 (exact in both paths) and queries bf16. SGLang multiplies in bf16
    and rounds each head's q.k to bf16 (relative error <= 2^-8) after accumulating 128 products
    (<= 128 * 2^-24 of sum |q_i k_i| in float32); relu is 1-Lipschitz; the weighted sum over heads is
    float32. The bound below is that, per entry, from the inputs."""
    from sglang.srt.layers.attention.dsv4.indexer import FP8_DTYPE, fp8_paged_mqa_logits_torch

    gen = torch.Generator().manual_seed(11)
    b, h, d, page, pages = 2, 4, 128, 64, 3
    n = page * pages
    k = torch.randn(b, n, d, generator=gen).to(FP8_DTYPE)
    q = torch.randn(b, h, d, generator=gen).to(torch.bfloat16)
    w = torch.randn(b, h, generator=gen)
    seq_lens = torch.tensor([n - 7, 70])
    cache = torch.zeros(b * pages, page * (d + 4), dtype=torch.uint8)
    for i in range(b):
        for p in range(pages):
            cache[i * pages + p, : page * d] = k[i, p * page:(p + 1) * page].reshape(-1).view(torch.uint8)
            cache[i * pages + p, page * d:] = torch.ones(page, dtype=torch.float32).view(torch.uint8)
    page_table = torch.arange(b * pages, dtype=torch.int32).view(b, pages)
    theirs = fp8_paged_mqa_logits_torch(q[:, None], cache.view(b * pages, page, 1, d + 4), w, seq_lens,
                                        page_table, None, n, clean_logits=False)
    for i in range(b):
        kf, qf = k[i].float(), q[i].float()
        ours = index_scores(qf[None], w[i][None], kf)[0]
        dots = qf @ kf.T                                                     # [h, n]
        abs_dots = qf.abs() @ kf.abs().T
        bound = (w[i].abs()[:, None] * (2 ** -8 * dots.abs() + 128 * 2 ** -24 * abs_dots)).sum(0) * (1 + 2 ** -20)
        v = int(seq_lens[i])
        assert ((ours[:v] - theirs[i, :v]).abs() <= bound[:v] + 1e-30).all()
        assert (theirs[i, v:] == 0).all()                                    # SGLang zeroes past the length


@pytest.mark.parametrize("visible", [[700, 513, 512, 3], [1000, 600, 9, 0]])
def test_topk_equals_sglangs_torch_topk_transform(visible):
    from sglang.srt.layers.attention.dsv4.indexer import topk_transform_pytorch_vectorized

    gen = torch.Generator().manual_seed(sum(visible))
    topk, page = 512, 64
    n = max(visible)
    scores = torch.randn(len(visible), n, generator=gen)
    seq_lens = torch.tensor(visible, dtype=torch.int32)
    page_tables = torch.arange(-(-n // page), dtype=torch.int32)[None].repeat(len(visible), 1)
    out_pages = torch.empty(len(visible), topk, dtype=torch.int32)
    out_raw = torch.empty(len(visible), topk, dtype=torch.int32)
    topk_transform_pytorch_vectorized(scores, seq_lens, page_tables, out_pages, page, out_raw)
    ours = select_topk(scores, seq_lens, topk)
    for i in range(len(visible)):
        theirs = sorted(x for x in out_raw[i].tolist() if x >= 0)
        assert ours[i][ours[i] >= 0].tolist() == theirs
        assert len(theirs) == min(visible[i], topk)


def test_c4_visibility_matches_sglangs_compressed_lengths():
    """SGLang's C4 length per query is seq_len // 4 (metadata_kernel.py:103), seq_len = position + 1."""
    pos = torch.arange(0, 20)
    assert visible_c4_entries(pos).tolist() == [(int(p) + 1) // 4 for p in pos]
    assert visible_c4_entries(torch.tensor([2, 3, 4, 7])).tolist() == [0, 1, 1, 2]


def test_rope_with_sglangs_table_is_relative():
    """With SGLang's V4 table, rotating q at position a and k at position b gives a q.k that depends on
    a - b only (what RoPE is for; fails if the pairs were split differently for q and k)."""
    from sglang.kernels.ops.attention.dsv4.rope import precompute_freqs_cis

    table = precompute_freqs_cis(16, 512, 0, 10000.0, 1.0, 32, 1)
    gen = torch.Generator().manual_seed(12)
    q, k = torch.randn(24, generator=gen), torch.randn(24, generator=gen)
    s1 = apply_rope_tail(q, table[100], 16) @ apply_rope_tail(k, table[90], 16)
    s2 = apply_rope_tail(q, table[310], 16) @ apply_rope_tail(k, table[300], 16)
    s3 = apply_rope_tail(q, table[310], 16) @ apply_rope_tail(k, table[301], 16)
    assert s1.item() == pytest.approx(s2.item(), rel=1e-4, abs=1e-4)
    assert abs(s1.item() - s3.item()) > 1e-3


@pytest.mark.parametrize("ratio", [4, 128])
def test_compressor_state_fits_sglangs_ring(ratio):
    """Between steps the state holds at most SGLang's per-request ring (8 rows for C4, 128 for C128
    without speculative decoding and without the online C128 path)."""
    from sglang.srt.mem_cache import deepseek_v4_memory_pool as pool

    if ratio == 128 and pool.ONLINE_C128:
        pytest.fail("SGLANG_OPT_USE_ONLINE_COMPRESS is on: the C128 ring is one online (max, sum, kv) "
                    "state; run this test with it off")
    ring = pool.get_compress_state_ring_size(ratio, 0)
    d = 4
    coff = 2 if ratio == 4 else 1
    state = CompressorState(ratio, d, torch.zeros(ratio, coff * d))
    most = 0
    for _ in range(3 * ratio):
        state.append(torch.randn(1, 2 * coff * d))
        most = max(most, state.held_rows)
    assert most <= ring
    assert most == (2 * ratio - 1 if ratio == 4 else ratio - 1)
