"""sim/dsv4.spec_from_config: a V4 model's config.json read into the simulator's V4Spec (what the launcher's
--ess-explain sizes V4 with, launcher/v4_plan.py). A V4-Flash-shaped config gives the V4-Flash data file's
cache spec, so its host bytes per token are the simulator's 3066 (21 C4 layers x 584 B / 4); the per-request
device parts split out of request_parts are the same bytes; what the model does not describe is refused."""
import pytest

from sgl_ess.sim.config import SimConfigError
from sgl_ess.sim.dsv4 import (V4Spec, c4_bytes, c4_entries, device_parts, host_bytes_per_token, request_parts,
                              spec_from_config, weight_bytes_per_gpu)

FLASH = V4Spec.load("deepseek_v4_flash")
# V4-Flash's schedule as its model card gives it: layers 0-1 window only, then even layers C4, odd C128
FLASH_RATIOS = [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)]
# SGLang's DeepseekV4Config keys (srt/configs/deepseek_v4.py) with V4-Flash's values
FLASH_CONFIG = {"architectures": ["DeepseekV4ForCausalLM"], "num_hidden_layers": 43, "compress_ratios": FLASH_RATIOS,
                "head_dim": 512, "qk_nope_head_dim": 448, "qk_rope_head_dim": 64, "index_head_dim": 128,
                "index_topk": 512, "window_size": 128, "hidden_size": 4096, "vocab_size": 129280}
CACHE_FIELDS = ("ratios", "window_tokens", "swa_page_tokens", "entry_bytes", "topk_entries", "index_head_dim",
                "indexer_bytes_per_entry", "head_dim", "state_bytes_per_value", "c4_state_ring", "c128_state_ring")


def test_a_v4_flash_shaped_config_is_the_simulators_v4_flash():
    spec = spec_from_config(FLASH_CONFIG, "flash")
    assert {f: getattr(spec, f) for f in CACHE_FIELDS} == {f: getattr(FLASH, f) for f in CACHE_FIELDS}
    assert host_bytes_per_token(spec) == host_bytes_per_token(FLASH) == 3066 == 21 * 584 / 4
    for ctx in (4096, 131072, 1 << 20):
        assert request_parts(spec, ctx, True, 0.2) == request_parts(FLASH, ctx, True, 0.2)


def test_transformers_layer_types_read_as_the_same_ratios():
    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    cfg = {k: v for k, v in FLASH_CONFIG.items() if k != "compress_ratios"}
    cfg["layer_types"] = [kinds[r] for r in FLASH_RATIOS]
    assert spec_from_config(cfg).ratios == tuple(FLASH_RATIOS)


def test_device_parts_are_request_parts_without_the_c4_entries():
    ctx = 65536
    resident = request_parts(FLASH, ctx, False, 0.3)
    assert resident["c4_entries"] == c4_bytes(FLASH, c4_entries(FLASH, ctx)) == 21 * (ctx // 4) * 584
    assert device_parts(FLASH, ctx) == {k: v for k, v in resident.items() if k != "c4_entries"}
    assert host_bytes_per_token(FLASH, 2048) == 21 * 2048 / 4          # another entry layout (the CPU arm's)


def test_what_the_spec_does_not_model_is_refused():
    with pytest.raises(SimConfigError, match=r"compress ratios \[2\].*V4.1"):
        spec_from_config({**FLASH_CONFIG, "compress_ratios": [0, 4, 2, 128]})
    with pytest.raises(SimConfigError, match="missing"):
        spec_from_config({"num_hidden_layers": 4})
    with pytest.raises(SimConfigError, match="total parameters are not known"):
        weight_bytes_per_gpu(spec_from_config(FLASH_CONFIG), 8)
