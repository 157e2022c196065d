"""DeepSeek-V4 with ESS on: on a CUDA node refused before loading (ESS serves V4 only on the CPU dsv4 arm so
far), and the refusal (which --ess-explain prints too) says what ESS for V4 would move, from the config as
transformers reads it; without CUDA accepted (dsv4/ess_setup.py refuses what that slice does not implement)."""
import json

import pytest

from sgl_ess.serving.preflight import PreflightError

transformers = pytest.importorskip("transformers")
model_support = pytest.importorskip("sgl_ess.integration.sglang.model_support")

V4_FLASH_RATIOS = [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)]


def _v4_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "num_hidden_layers": 43,
        "compress_ratios": V4_FLASH_RATIOS}))
    return transformers.AutoConfig.from_pretrained(str(tmp_path))


def test_v4_accepted_without_cuda(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model_support.check(_v4_config(tmp_path))


def test_v4_refusal_on_cuda_names_the_bytes_ess_would_move(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = _v4_config(tmp_path)
    with pytest.raises(PreflightError) as e:
        model_support.check(cfg)
    msg = str(e.value)
    assert "ESS cannot serve DeepseekV4ForCausalLM" in msg and "--ess-enabled false" in msg
    # 21 C4 layers x 584 B / 4 tokens; 20 C128 layers x 584 / 128; 21 x 132 B index keys / 4
    assert "43 layers (21 C4, 20 C128, 2 other)" in msg, msg
    assert "584-byte entries" in msg and "3066 B per token" in msg and "91.2 B per token" in msg, msg
    assert "693 B per token" in msg and "python -m sgl_ess.sim v4" in msg, msg
