"""Write the embedded models: tiny configs + one BPE tokenizer.

  tiny_dsv32  the default model, DeepSeek-V3.2 architecture (below);
  tiny_glm5   GLM-5 / 5.1 (``GlmMoeDsaForCausalLM``): the same sizes with GLM's head shapes
              (v_head_dim > qk_nope_head_dim, as GLM-5's 256 / 192), 3 layers, an indexer on every
              layer (``indexer_types`` all "full": GLM-5.2's shared-index layers are not in it);
  tiny_longcat LongCat-Flash with sparse attention (``LongcatFlashForCausalLM``): 2 decoder layers of
              two attention sub-layers each (4 latent layers), cli_factor 2 (shared top-k), zero
              experts off (SGLang's zero-expert kernel is Triton: not on CPU);
  tiny_hyv4   Hunyuan V4 (``HYV4ForCausalLM``): the same sizes with HYV4's learnable attention sinks,
              output gate and iHC streams, 3 layers, the last a shared-index layer.
  tiny_dsv4   DeepSeek-V4-Flash-shaped (``DeepseekV4ForCausalLM``): 6 layers of the three kinds its
              ``compress_ratios`` name (0 window only, 4 C4 with its indexer, 128 C128), V4's own row
              widths (head_dim 512 = 448 + 64, index_head_dim 128), everything else tiny (docs/dsv4.md).

The generated files ship in the package (``sgl_ess/models/tiny_*/``); serving never
regenerates them. Re-run only to change a model:

    python -m sgl_ess.models.make_tiny [--model dsv32|dsv4|glm5|glm52|hyv4|longcat] [--latent tiny|h200] [OUT_DIR]

``--latent h200`` writes the same model with DeepSeek-V3.2's own latent width, kv_lora_rank 512 +
rope 64 (default directory ``tiny_<model>_h200``): the only width FlashMLA's FP8 KV rows (656 bytes)
and SGLang's FP8 quantizer take, so the GPU fake can serve an H200's default configuration
(``--kv-cache-dtype fp8_e4m3``, ``flashmla_kv``). Layers, heads and everything else stay tiny.

Architecture (``DeepseekV32ForCausalLM``): MLA latent (kv_lora_rank 64 + rope 16), a
lightning indexer per layer (4 heads x 128 dims, top-k 32), MoE (8 routed experts, 2
active + 1 shared) after one dense layer, plus one MTP (NextN) layer for EAGLE speculative decoding
(``num_nextn_predict_layers: 1``; the target model does not include it, so its outputs do not
change). Weights are random (``--load-format dummy``; the MTP layer is shaped at load time, see
``mtp_init.py``).
The tokenizer is a 2048-token byte-level BPE trained on the Python standard library
sources, which exist on every machine that runs Python.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import sysconfig

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

MODEL_CONFIG = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "kv_lora_rank": 64,
    "q_lora_rank": 96,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    # SGLang's CPU DeepSeek rope asserts deepseek_yarn.
    "rope_scaling": {
        "type": "yarn", "rope_type": "deepseek_yarn", "factor": 4.0,
        "original_max_position_embeddings": 2048, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 1.0,
    },
    "tie_word_embeddings": False,
    "attention_bias": False,
    "num_nextn_predict_layers": 1,
    "ep_size": 1,
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    # DSA lightning indexer. SGLang's DSA pool asserts index_head_dim == 128.
    "index_head_dim": 128,
    "index_n_heads": 4,
    "index_topk": 32,
    "vocab_size": VOCAB_SIZE,
    "torch_dtype": "bfloat16",
}


# GLM-5 / 5.1 (transformers' GlmMoeDsaConfig, SGLang's GlmMoeDsaForCausalLM, a DeepseekV2ForCausalLM):
# the DSV3.2 tiny sizes with GLM's own shapes. SGLang's CPU DeepSeek rope asserts deepseek_yarn.
GLM5_CONFIG = dict(
    MODEL_CONFIG,
    architectures=["GlmMoeDsaForCausalLM"],
    model_type="glm_moe_dsa",
    num_hidden_layers=3,
    qk_nope_head_dim=24,
    v_head_dim=48,
    indexer_types=["full", "full", "full"],
    rms_norm_eps=1e-5,
)
# Hunyuan V4 (SGLang's HYV4Config / HYV4ForCausalLM, hunyuan_v4.py): the DSV3.2 tiny sizes with HYV4's
# own parts: a learnable attention sink per head (learnable_sink), the elementwise output gate, iHC
# hyper-connections (hc_mult streams), rope given as rope_parameters (deepseek_yarn: see below), 3 layers whose
# last reuses the previous layer's top-k (indexer_types "shared", as 3 of every 4 layers of the real model).
HYV4_CONFIG = {
    k: v for k, v in MODEL_CONFIG.items()
    if k not in ("rope_scaling", "rope_theta", "first_k_dense_replace", "moe_layer_freq", "n_group", "topk_group",
                 "scoring_func", "topk_method", "ep_size", "aux_loss_alpha", "seq_aux")
}
HYV4_CONFIG.update(
    architectures=["HYV4ForCausalLM"],
    model_type="hy_v4",
    num_hidden_layers=3,
    mlp_layer_types=["dense", "sparse", "sparse"],
    layer_types=["deepseek_sparse_attention"] * 3,
    indexer_types=["full", "full", "shared"],
    # SGLang's CPU rope (get_rope_cpu, which the DSA indexer calls on CPU) builds only deepseek_yarn; the
    # real model's default rope would stop the tiny one at load on this CPU
    rope_parameters={"rope_theta": 10000.0, **MODEL_CONFIG["rope_scaling"]},
    rms_norm_eps=1e-5,
    enable_lm_head_fp32=True,
    enable_ihc=True, hc_mult=4, hc_magnitude=2.0, hc_eps=1e-6,
    gated_mla=True, gating_type="elementwise",
    learnable_sink=True, learnable_sink_init=0.0,
    swiglu_limit=10.0,
)
CONFIGS = {"dsv32": ("tiny_dsv32", MODEL_CONFIG), "glm5": ("tiny_glm5", GLM5_CONFIG),
           "hyv4": ("tiny_hyv4", HYV4_CONFIG)}
# --latent: the MLA latent width. "h200": DeepSeek-V3.2's 512 NoPE + 64 RoPE values, what FlashMLA's FP8
# rows hold (512 FP8 codes + 4 fp32 scales + 64 bf16 = 656 bytes)
LATENTS = {"tiny": {}, "h200": {"kv_lora_rank": 512, "qk_rope_head_dim": 64}}


# LongCat-Flash with sparse attention (SGLang's LongcatFlashConfig / LongcatFlashForCausalLM,
# longcat_flash.py): two MLA attention sub-layers per decoder layer (attention layer id 2 * layer + i),
# so its 2 decoder layers hold 4 latent layers; cli_factor 2: every second attention layer reuses the
# previous one's top-k (SGLang's dsa_layer_skips_topk). Zero experts off (zero_expert_num 0,
# zero_expert_type None): SGLang computes them with a Triton kernel, which does not run on the CPU.
LONGCAT_CONFIG = {
    k: v for k, v in MODEL_CONFIG.items()
    if k not in ("intermediate_size", "moe_intermediate_size", "n_shared_experts", "num_experts_per_tok", "n_group",
                 "topk_group", "scoring_func", "topk_method", "norm_topk_prob", "first_k_dense_replace",
                 "moe_layer_freq", "aux_loss_alpha", "seq_aux")
}
LONGCAT_CONFIG.update(
    architectures=["LongcatFlashForCausalLM"],
    model_type="longcat_flash",
    num_layers=2,
    num_hidden_layers=2,
    ffn_hidden_size=256,
    expert_ffn_hidden_size=64,
    moe_topk=2,
    zero_expert_num=0,
    zero_expert_type=None,
    router_bias=False,
    rounter_params_dtype="float32",
    mla_scale_q_lora=True,
    mla_scale_kv_lora=True,
    cli_factor=2,
    rms_norm_eps=1e-5,
)
CONFIGS["longcat"] = ("tiny_longcat", LONGCAT_CONFIG)
# GLM-5.2 / 5.3 (GlmMoeDsaForCausalLM): GLM-5's tiny sizes with shared-index layers: 5 layers, indexer_types
# "full" at layers 0 and 3 (the anchors) and "shared" at 1, 2 and 4, which reuse the previous layer's top-k
# (SGLang's dsa_layer_skips_topk; the real GLM-5.2 has 78 layers, 21 of them anchors)
GLM52_CONFIG = dict(GLM5_CONFIG, num_hidden_layers=5, indexer_types=["full", "shared", "shared", "full", "shared"])
CONFIGS["glm52"] = ("tiny_glm52", GLM52_CONFIG)
# DeepSeek-V4 (SGLang's DeepSeekV4Config, srt/configs/deepseek_v4.py, loaded through its
# _DeepseekV4ConfigAlias for model_type "deepseek_v4"; DeepseekV4ForCausalLM, deepseek_v4.py). Each layer's kind
# is compress_ratios[layer]: 0 window only (128 tokens), 4 C4 (+ the C4 indexer), 128 C128; the order follows the
# V4-Flash schedule in sgl_ess/sim/data/model_deepseek_v4_flash.json (window-only layers first, then 4 / 128
# alternating). The row widths stay V4's own: head_dim 512 = 448 NoPE + 64 RoPE (the 584-byte row SGLang's pool
# asserts) and index_head_dim 128; one KV head (MQA).
# num_hash_layers 0: hash-routed MoE layers look experts up in a per-token table a random model has no sane
# values for. The MTP (NextN) layer is window only in SGLang (COMPRESS_RATIO_NEXTN_LAYER 0, deepseek_v4_nextn.py:53).
DSV4_CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 6,
    "compress_ratios": [0, 0, 4, 128, 4, 128],
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 448,
    "qk_rope_head_dim": 64,
    "v_head_dim": 512,
    "q_lora_rank": 96,
    "o_lora_rank": 64,
    "o_groups": 2,
    "q_head_norm": True,
    "sliding_window": 128,
    "window_size": 128,
    "index_head_dim": 128,
    "index_n_heads": 4,
    "index_topk": 32,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "first_k_dense_replace": 0,
    "moe_layer_freq": 1,
    "num_hash_layers": 0,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "compress_rope_theta": 40000.0,
    "rope_scaling": {
        "type": "yarn", "rope_type": "deepseek_yarn", "factor": 4.0,
        "original_max_position_embeddings": 2048, "beta_fast": 32, "beta_slow": 1,
    },
    "tie_word_embeddings": False,
    "attention_bias": False,
    "num_nextn_predict_layers": 1,
    "vocab_size": VOCAB_SIZE,
    "torch_dtype": "bfloat16",
}
CONFIGS["dsv4"] = ("tiny_dsv4", DSV4_CONFIG)


def _training_files(limit: int = 300) -> list[str]:
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True))
    if not files:
        raise RuntimeError(f"no Python sources found under {stdlib} to train the tokenizer on")
    return files[:limit]


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(_training_files(), trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def write_model(out_dir: str, config: dict = MODEL_CONFIG) -> None:
    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer()
    bos = tok.token_to_id("<|begin_of_text|>")
    eos = tok.token_to_id("<|end_of_text|>")
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "pad_token": "<|pad|>",
        "model_max_length": config["max_position_embeddings"],
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    _dump(os.path.join(out_dir, "tokenizer_config.json"), tok_cfg)
    _dump(os.path.join(out_dir, "generation_config.json"),
          {"bos_token_id": bos, "eos_token_id": eos, "max_new_tokens": 64})
    _dump(os.path.join(out_dir, "config.json"), dict(config, bos_token_id=bos, eos_token_id=eos))


def _dump(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def main(argv: list[str]) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m sgl_ess.models.make_tiny")
    p.add_argument("--model", choices=sorted(CONFIGS), default="dsv32")
    p.add_argument("--latent", choices=sorted(LATENTS), default="tiny",
                   help="latent width: tiny (64 + 16) or h200 (DeepSeek-V3.2's 512 + 64, FlashMLA's FP8 rows)")
    p.add_argument("out_dir", nargs="?", default=None, help="default: sgl_ess/models/tiny_<model>[_h200]")
    a = p.parse_args(argv)
    name, config = CONFIGS[a.model]
    if a.latent != "tiny":
        name, config = f"{name}_{a.latent}", dict(config, **LATENTS[a.latent])
    out = a.out_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    write_model(out, config)
    print("wrote", out)


if __name__ == "__main__":
    main(sys.argv[1:])
