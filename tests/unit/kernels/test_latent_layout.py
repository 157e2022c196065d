import pytest
import torch

from sgl_ess.kernels.latent_layout import LatentLayout


def test_fp8_flashmla_row_is_656_bytes_for_v32():
    assert LatentLayout("fp8_flashmla", 512, 64).row_bytes == 656
    assert LatentLayout("bf16", 512, 64).row_bytes == 1152


def test_fp8_layout_fields():
    lay = LatentLayout("fp8_flashmla", 512, 64)
    x = (torch.randn(33, 576, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16).float()
    rows = lay.encode(x)
    assert rows.shape == (33, 656) and rows.dtype == torch.uint8
    y = lay.decode(rows)
    # fp8 e4m3 has 3 mantissa bits: relative rounding error <= 2^-4 of the value, and every value
    # is at most its tile's amax, so the error is <= amax / 16 per tile
    amax = x[:, :512].reshape(33, 4, 128).abs().amax(2, keepdim=True)
    err = (y[:, :512] - x[:, :512]).reshape(33, 4, 128).abs()
    assert bool((err <= amax / 16).all())
    assert torch.equal(y[:, 512:], x[:, 512:])          # rope: raw bf16 bytes
    # scales are fp32, one per 128-value tile, at byte offset 512: amax / 448 of the bf16 input
    scales = rows[:, 512:528].contiguous().view(torch.float32)
    assert torch.equal(scales, amax.squeeze(2) / 448.0)
    # codes are round-to-nearest of value * (1 / scale), as SGLang's writer computes them
    q = (x[:, :512].reshape(33, 4, 128) * (1.0 / scales).unsqueeze(2)).clamp(-448, 448)
    assert torch.equal(rows[:, :512], q.to(torch.float8_e4m3fn).reshape(33, 512).view(torch.uint8))


def test_fp8_zero_rows_decode_to_zero():
    lay = LatentLayout("fp8_flashmla", 128, 16)
    assert torch.equal(lay.decode(lay.encode(torch.zeros(2, 144))), torch.zeros(2, 144))


@pytest.mark.parametrize("kind", ["fp32", "bf16"])
def test_plain_layouts(kind):
    lay = LatentLayout(kind, 32, 8)
    x = torch.randn(5, 40)
    y = lay.decode(lay.encode(x))
    want = x if kind == "fp32" else x.to(torch.bfloat16).float()
    assert torch.equal(y, want)


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="divisible by 128"):
        LatentLayout("fp8_flashmla", 100, 8)
    with pytest.raises(ValueError, match="expected fp8_flashmla, bf16 or fp32"):
        LatentLayout("int4", 32, 8)
    with pytest.raises(ValueError, match=r"uint8 \[\.\.\., 160\]"):
        LatentLayout("fp32", 32, 8).decode(torch.zeros(2, 10, dtype=torch.uint8))
