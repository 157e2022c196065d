"""sgl_ess/models/mtp_init.py: the embedded MTP layer's shaping, on parameter names of the NextN layouts it
meets (DeepSeek-V3.2 / GLM / Hunyuan's eh_proj, DeepSeek-V4's split e_proj / h_proj)."""

import pytest

torch = pytest.importorskip("torch")

from sgl_ess.models.mtp_init import DAMP, EMBED_GAIN, HIDDEN_GAIN, shape_mtp_layer  # noqa: E402


def test_fused_eh_proj():
    h = 6
    params = {"model.eh_proj.weight": torch.randn(h, 2 * h), "model.decoder.self_attn.o_proj.weight": torch.ones(h, h)}
    changed = shape_mtp_layer(params)
    eye = torch.eye(h)
    assert torch.equal(params["model.eh_proj.weight"], torch.cat([EMBED_GAIN * eye, HIDDEN_GAIN * eye], 1))
    assert torch.equal(params["model.decoder.self_attn.o_proj.weight"], torch.full((h, h), DAMP))
    assert sorted(changed) == sorted(params)


def test_v4_split_projections_and_output():
    h = 6
    params = {"model.e_proj.weight": torch.randn(h, h), "model.h_proj.weight": torch.randn(h, h),
              "model.decoder.self_attn.wo_b.weight": torch.ones(h, 3), "model.decoder.self_attn.wo_a.weight": torch.ones(3, h),
              "model.enorm.weight": torch.ones(h)}
    changed = shape_mtp_layer(params)
    assert torch.equal(params["model.e_proj.weight"], EMBED_GAIN * torch.eye(h))
    assert torch.equal(params["model.h_proj.weight"], HIDDEN_GAIN * torch.eye(h))
    assert torch.equal(params["model.decoder.self_attn.wo_b.weight"], torch.full((h, 3), DAMP))
    assert torch.equal(params["model.decoder.self_attn.wo_a.weight"], torch.ones(3, h))     # not an output
    assert torch.equal(params["model.enorm.weight"], torch.ones(h))
    assert sorted(changed) == ["model.decoder.self_attn.wo_b.weight", "model.e_proj.weight", "model.h_proj.weight"]
