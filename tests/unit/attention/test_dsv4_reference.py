"""The DeepSeek-V4 attention reference (sgl_ess/attention/dsv4_*.py) against hand-derived cases and
invariants that can fail. SGLang 0.5.23 has no torch reference for the compressor (its C4/C128 pooling
is CUDA only: kernels/jit/csrc/deepseek_v4/c4_v2.cuh, c128_v2.cuh) nor for the sparse attention with
sinks (FlashMLA, Triton): those pieces are checked here against hand-computed values, two independent
implementations of the compressor (vectorised prefix vs the streaming state), and sgl_ess's own
float64 sink reference. The pieces SGLang does have in torch are checked in test_dsv4_against_sglang.py."""
import math

import pytest
import torch

from sgl_ess.attention import sink_reference
from sgl_ess.attention.dsv4_attention import layer_attention, sink_attention, visible_entries, window_positions
from sgl_ess.attention.dsv4_compressor import CompressorState, compress_prefix, pool_block
from sgl_ess.attention.dsv4_indexer import index_scores, select_topk
from sgl_ess.attention.dsv4_rope import apply_rope_tail, finish_entry, rms_norm


def _rows(n, ratio, d, gen):
    coff = 2 if ratio == 4 else 1
    return torch.randn(n, 2 * coff * d, generator=gen)


# --- the compressor ---------------------------------------------------------------------------------

def test_c4_equal_scores_pool_to_the_mean_of_own_and_previous_block():
    """Scores all 0 and ape 0: every candidate weighs the same, so block 0 is the mean of its own 4
    tokens' kv_b (no previous block) and block 1 the mean of block 0's kv_a and block 1's kv_b."""
    d = 3
    kv = torch.arange(8 * 2 * d, dtype=torch.float32).view(8, 2 * d)          # [kv_a | kv_b] per token
    rows = torch.cat([kv, torch.zeros(8, 2 * d)], dim=1)
    out = compress_prefix(rows, torch.zeros(4, 2 * d), 4, d)
    assert out.shape == (2, d)
    torch.testing.assert_close(out[0], kv[0:4, d:].mean(0))
    torch.testing.assert_close(out[1], torch.cat([kv[0:4, :d], kv[4:8, d:]]).mean(0))


def test_c128_equal_scores_pool_to_the_block_mean():
    d = 2
    kv = torch.randn(256, d, generator=torch.Generator().manual_seed(1))
    rows = torch.cat([kv, torch.zeros(256, d)], dim=1)
    out = compress_prefix(rows, torch.zeros(128, d), 128, d)
    torch.testing.assert_close(out, torch.stack([kv[:128].mean(0), kv[128:].mean(0)]))


def test_the_position_bias_picks_a_token_per_channel():
    """ape is a per-(position in block, channel) bias: a bias of +60 on position 2 for channel 0 and on
    the previous block's position 1 (overlap half) for channel 1 makes those tokens carry all the weight
    (e^-60 is below float32's resolution of 1)."""
    d = 2
    gen = torch.Generator().manual_seed(2)
    kv = torch.randn(8, 2 * d, generator=gen)
    rows = torch.cat([kv, torch.zeros(8, 2 * d)], dim=1)
    ape = torch.zeros(4, 2 * d)
    ape[2, d + 0] = 60.0            # the block's own half (kv_b), channel 0, position 2
    ape[1, 1] = 60.0                # the overlap half (kv_a), channel 1, position 1
    out = compress_prefix(rows, ape, 4, d)
    assert out[1, 0].item() == pytest.approx(kv[6, d + 0].item(), abs=1e-6)     # token 4 + 2, kv_b
    assert out[1, 1].item() == pytest.approx(kv[1, 1].item(), abs=1e-6)         # token 0 + 1, kv_a
    # block 0 has no previous block: channel 1's overlap bias has nothing to pick
    assert out[0, 1].item() == pytest.approx(kv[0:4, d + 1].mean().item(), abs=1e-6)


@pytest.mark.parametrize("ratio", [4, 128])
def test_streaming_state_equals_one_pass_prefix(ratio):
    """Prefill of n tokens then decodes of 1 equals one prefill of the whole sequence (two separate
    implementations: the per-block loop of CompressorState, the vectorised compress_prefix)."""
    d, gen = 8, torch.Generator().manual_seed(3 + ratio)
    n = 3 * ratio + ratio // 2 + 1
    rows = _rows(n, ratio, d, gen)
    ape = torch.randn(ratio, (2 if ratio == 4 else 1) * d, generator=gen)
    expected = compress_prefix(rows, ape, ratio, d)
    for split in (1, ratio - 1, ratio + 1, 2 * ratio + 3):
        state = CompressorState(ratio, d, ape)
        got = state.append(rows[:split])
        for i in range(split, n):                                  # one decode token at a time
            got += state.append(rows[i:i + 1])
        assert [b for b, _ in got] == list(range(n // ratio))
        torch.testing.assert_close(torch.stack([e for _, e in got]), expected)
        assert state.num_tokens == n
        assert state.held_rows == n % ratio + (ratio if ratio == 4 else 0)


def test_pool_block_rejects_a_partial_block_and_wrong_widths():
    with pytest.raises(ValueError, match="4 rows"):
        pool_block(None, torch.zeros(3, 16), torch.zeros(4, 8), 4, 4)
    with pytest.raises(ValueError, match="needs 2 \\* 2 \\* 4 = 16"):
        compress_prefix(torch.zeros(4, 8), torch.zeros(4, 8), 4, 4)
    with pytest.raises(ValueError, match="ratio 4 or 128"):
        CompressorState(2, 4, torch.zeros(2, 4))


# --- norm and rope ----------------------------------------------------------------------------------

def test_rope_rotates_interleaved_pairs_of_the_tail_only():
    """(1, 0) in pair i times e^{i theta} is (cos theta, sin theta); the first d - rope_dim channels are
    untouched; the inverse undoes it."""
    theta = torch.tensor([0.3, -1.1])
    freqs = torch.polar(torch.ones(2), theta)
    x = torch.tensor([5.0, 7.0, 1.0, 0.0, 1.0, 0.0])               # 2 nope + 2 rope pairs
    y = apply_rope_tail(x, freqs, 4)
    expected = torch.tensor([5.0, 7.0, math.cos(0.3), math.sin(0.3), math.cos(-1.1), math.sin(-1.1)])
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(apply_rope_tail(y, freqs, 4, inverse=True), x)


def test_rms_norm_and_finish_entry_rope_at_the_blocks_first_position():
    x = torch.tensor([[3.0, 4.0, 0.0, 0.0]])
    w = torch.tensor([1.0, 2.0, 1.0, 1.0])
    rms = math.sqrt((9 + 16) / 4)
    torch.testing.assert_close(rms_norm(x, w, 0.0), torch.tensor([[3 / rms, 8 / rms, 0.0, 0.0]]))
    table = torch.polar(torch.ones(64, 1), torch.arange(64, dtype=torch.float32)[:, None] * 0.1)
    e = torch.tensor([[0.0, 0.0, 2.0, 0.0]])                        # rope pair (2, 0), rms = 1
    got = finish_entry(e, torch.tensor([3]), 4, torch.ones(4), 0.0, table, 2)
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.0, 2 * math.cos(1.2), 2 * math.sin(1.2)]]))


# --- the indexer ------------------------------------------------------------------------------------

def test_index_scores_by_hand():
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])                     # T=1, H=2, d=2
    w = torch.tensor([[2.0, 3.0]])
    k = torch.tensor([[1.0, 1.0], [-1.0, 2.0], [1.0, -5.0]])
    # entry 0: 2*1 + 3*1 = 5; entry 1: 2*relu(-1) + 3*2 = 6; entry 2: 2*1 + 3*relu(-5) = 2
    torch.testing.assert_close(index_scores(q, w, k), torch.tensor([[5.0, 6.0, 2.0]]))


def test_select_topk_takes_the_best_visible_or_all_of_them():
    scores = torch.tensor([[0.1, 9.0, 0.2, 8.0, 99.0],
                           [0.1, 9.0, 0.2, 8.0, 99.0]])
    got = select_topk(scores, torch.tensor([4, 2]), 2)
    assert got.tolist() == [[1, 3], [0, 1]]           # entry 4 is not visible; 2 visible <= top-2: all
    assert select_topk(scores[:1], torch.tensor([1]), 3).tolist() == [[0, -1, -1]]


# --- attention --------------------------------------------------------------------------------------

def test_one_row_and_a_sink_by_hand():
    q = torch.tensor([[[1.0, 0.0]]])
    rows = torch.tensor([[[2.0, 3.0]]])
    out = sink_attention(q, rows, torch.ones(1, 1, dtype=torch.bool), torch.tensor([0.5]), 1.0)
    p = math.exp(2.0) / (math.exp(2.0) + math.exp(0.5))
    torch.testing.assert_close(out, torch.tensor([[[2.0 * p, 3.0 * p]]]))


def test_sink_attention_equals_the_float64_sink_reference():
    gen = torch.Generator().manual_seed(5)
    t, h, k, d = 3, 4, 9, 16
    q, rows = torch.randn(t, h, d, generator=gen), torch.randn(t, k, d, generator=gen)
    keep = torch.rand(t, k, generator=gen) > 0.3
    sink = torch.randn(h, generator=gen)
    expected = sink_reference.sink_attention(q, rows, keep, sink, d, d ** -0.5)
    torch.testing.assert_close(sink_attention(q, rows, keep, sink, d ** -0.5).double(), expected,
                               rtol=1e-5, atol=1e-6)


def test_no_sink_is_plain_softmax_attention():
    gen = torch.Generator().manual_seed(6)
    q, rows = torch.randn(2, 3, 8, generator=gen), torch.randn(2, 5, 8, generator=gen)
    out = sink_attention(q, rows, torch.ones(2, 5, dtype=torch.bool), torch.full((3,), float("-inf")), 0.25)
    expected = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], rows[:, None], rows[:, None],
                                                                scale=0.25)
    torch.testing.assert_close(out, expected.squeeze(2))


def test_window_holds_the_last_128_positions():
    assert window_positions(torch.tensor([2]), 4).tolist() == [[2, 1, 0, -1]]
    assert window_positions(torch.tensor([200]))[0].tolist() == list(range(200, 72, -1))


@pytest.mark.parametrize("ratio", [0, 4, 128])
def test_layer_attention_reads_the_window_and_only_the_chosen_entries(ratio):
    """Rows older than the window and entries not chosen do not change the output; a row in the window
    and a chosen entry do."""
    gen = torch.Generator().manual_seed(7 + ratio)
    d, h, n = 16, 2, 300
    pos = torch.tensor([n - 1])
    q = torch.randn(1, h, d, generator=gen)
    swa = torch.randn(n, d, generator=gen)
    sink = torch.randn(h, generator=gen)
    comp = chosen = None
    if ratio:
        comp = torch.randn(n // ratio, d, generator=gen)
        vis = int(visible_entries(pos, ratio)[0])
        chosen = (torch.arange(vis)[None] if ratio == 128 else
                  select_topk(torch.randn(1, vis, generator=gen), torch.tensor([vis]), 8))
    base = layer_attention(q, pos, swa, sink, d ** -0.5, comp, chosen)
    swa2 = swa.clone()
    swa2[: n - 128] += 5.0                                            # outside the window
    torch.testing.assert_close(layer_attention(q, pos, swa2, sink, d ** -0.5, comp, chosen), base)
    swa2[n - 128] += 5.0                                              # the window's oldest row
    assert not torch.allclose(layer_attention(q, pos, swa2, sink, d ** -0.5, comp, chosen), base)
    if ratio:
        comp2 = comp.clone()
        unchosen = torch.ones(comp.shape[0], dtype=torch.bool)
        unchosen[chosen[chosen >= 0]] = False
        comp2[unchosen] += 5.0
        torch.testing.assert_close(layer_attention(q, pos, swa, sink, d ** -0.5, comp2, chosen), base)
        comp2[chosen[0, 0]] += 5.0
        assert not torch.allclose(layer_attention(q, pos, swa, sink, d ** -0.5, comp2, chosen), base)
