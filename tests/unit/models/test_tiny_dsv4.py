"""The embedded DeepSeek-V4-Flash-shaped tiny model (sgl_ess/models/tiny_dsv4,
`python -m sgl_ess.models.make_tiny --model dsv4`): what make_tiny writes, loadable by SGLang 0.5.23's own
config path (its _DeepseekV4ConfigAlias for model_type deepseek_v4, then ModelConfig), with layers of each
V4 kind. Serving it needs a CPU attention backend SGLang does not have (docs/dsv4.md); this checks the
config only."""
import filecmp
import json
import os

import pytest

from sgl_ess.models import TINY_DSV32_DIR, make_tiny

TINY_DSV4_DIR = os.path.join(os.path.dirname(make_tiny.__file__), "tiny_dsv4")


def test_shipped_tiny_dsv4_is_what_make_tiny_writes():
    with open(os.path.join(TINY_DSV4_DIR, "config.json")) as fh:
        shipped = json.load(fh)
    assert shipped == dict(make_tiny.DSV4_CONFIG, bos_token_id=shipped["bos_token_id"],
                           eos_token_id=shipped["eos_token_id"])
    assert make_tiny.CONFIGS["dsv4"] == ("tiny_dsv4", make_tiny.DSV4_CONFIG)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):     # the same tokenizer
        assert filecmp.cmp(os.path.join(TINY_DSV32_DIR, name), os.path.join(TINY_DSV4_DIR, name), shallow=False)


def test_sglang_loads_it_as_deepseek_v4_with_each_layer_kind():
    pytest.importorskip("sglang")
    from sglang.srt.configs.model_config import ModelConfig, get_num_indexer_layers, is_deepseek_v4
    from sglang.srt.utils.hf_transformers.config import get_config

    hf = get_config(TINY_DSV4_DIR, trust_remote_code=False)
    assert type(hf).__name__ == "_DeepseekV4ConfigAlias" and hf.model_type == "deepseek_v4"
    assert is_deepseek_v4(hf)
    mc = ModelConfig(TINY_DSV4_DIR, model_override_args="{}")
    assert set(mc.compress_ratios) == {0, 4, 128}
    assert all(mc.compress_ratios.count(r) >= 2 for r in (0, 4, 128))
    assert len(mc.compress_ratios) == mc.num_hidden_layers == 6
    assert get_num_indexer_layers(mc.hf_config) == 2           # SGLang's count of C4 (indexer) layers
    # V4's own row widths: SGLang's pool asserts the 584-byte row of 448 NoPE + 64 RoPE
    assert (mc.qk_nope_head_dim, mc.qk_rope_head_dim, mc.head_dim, mc.v_head_dim) == (448, 64, 512, 512)
    assert mc.window_size == 128 and mc.index_head_dim == 128
    assert hf.num_key_value_heads == 1 and hf.num_attention_heads % hf.o_groups == 0
    assert getattr(hf, "num_hash_layers", 0) == 0
