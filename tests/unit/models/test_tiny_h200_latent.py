"""The embedded model the whole GPU-fake server serves in an H200's default configuration
(sgl_ess/models/tiny_dsv32_h200, `python -m sgl_ess.models.make_tiny --latent h200`): the tiny
DeepSeek-V3.2 with V3.2's own latent width, the one FlashMLA's 656-byte FP8 rows hold."""
import filecmp
import json

from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.models import TINY_DSV32_DIR, TINY_DSV32_H200_DIR, make_tiny


def test_shipped_h200_latent_model_is_what_make_tiny_writes():
    with open(f"{TINY_DSV32_H200_DIR}/config.json") as fh:
        shipped = json.load(fh)
    assert shipped == dict(make_tiny.MODEL_CONFIG, **make_tiny.LATENTS["h200"],
                           bos_token_id=shipped["bos_token_id"], eos_token_id=shipped["eos_token_id"])
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):   # the same tokenizer
        assert filecmp.cmp(f"{TINY_DSV32_DIR}/{name}", f"{TINY_DSV32_H200_DIR}/{name}", shallow=False), name


def test_h200_latent_differs_from_the_tiny_model_in_the_latent_only():
    with open(f"{TINY_DSV32_DIR}/config.json") as a, open(f"{TINY_DSV32_H200_DIR}/config.json") as b:
        tiny, h200 = json.load(a), json.load(b)
    assert {k for k in tiny if tiny[k] != h200[k]} == {"kv_lora_rank", "qk_rope_head_dim"}
    assert (h200["kv_lora_rank"], h200["qk_rope_head_dim"]) == (512, 64)
    # FlashMLA's FP8 row of that latent: 512 FP8 codes, 4 fp32 tile scales, 64 bf16 RoPE values
    assert LatentLayout("fp8_flashmla", h200["kv_lora_rank"], h200["qk_rope_head_dim"]).row_bytes == 656
