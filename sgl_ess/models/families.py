"""The model table: which model families ESS serves, and the one decision for every other model.

A model is described by its ``ModelFacts`` (the architecture and what its attention adds, read from
its config by ``sgl_ess.integration.sglang.model_support`` with SGLang's own helpers). ``refusal``
answers None for a model ESS serves, else the text that stops the launch: what the model is, why
ESS cannot serve it, what is supported, and that ``--ess-enabled false`` serves it with ESS off.

Every family here runs SGLang's DSA path: the lightning indexer picks top-k token positions per
layer, and the latent cache is SGLang's ``DSATokenToKVPool`` (one packed latent row per token and
layer: kv_lora_rank + qk_rope_head_dim values, bf16 on CPU; FlashMLA's FP8 row on CUDA, 656 B at
512 + 64). ESS replaces that pool's storage with its host pool and reads the rows through the
``ess`` attention backend on CPU and SGLang's ``dsa`` backend extended by ESS on CUDA.

Facts come from SGLang 0.5.23 (srt/configs/model_config.py ``is_deepseek_dsa``,
``dsa_layer_skips_topk``, ``uses_kda_attention``; the model files named per family). Plain Python:
no torch, no sglang. Owns no state.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

# What a model's attention may add to plain DSA (absorbed sparse MLA over the top-k rows).
SINKS = "sinks"                              # a learnable per-head sink logit in the softmax
SHARED_TOPK = "shared_topk"                  # layers reuse the previous layer's top-k (no indexer)
TWO_ATTENTION_SUBLAYERS = "two_attention_sublayers"   # 2 attention layers per decoder layer
SLIDING_WINDOW = "sliding_window"            # windowed layers with their own latent pool
LINEAR_ATTENTION = "linear_attention"        # hybrid: linear (KDA) layers beside the DSA ones
NOT_DSA = "not_dsa"                          # no top-k sparse attention over a latent pool at all

FEATURE_TEXT = {
    SINKS: "learnable attention sinks (a per-head sink logit in every softmax)",
    SHARED_TOPK: "shared-index layers that reuse the previous layer's top-k",
    TWO_ATTENTION_SUBLAYERS: "two attention sub-layers per decoder layer (2x num_hidden_layers latent layers)",
    SLIDING_WINDOW: "sliding-window layers with their own pool",
    LINEAR_ATTENTION: "linear-attention (KDA) layers in a hybrid pool",
    NOT_DSA: "no DSA sparse attention (no index_topk / not one of SGLang's DSA architectures)",
}


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """One row of the table. `architectures`: the target classes (``config.architectures[0]``);
    `mtp_architectures`: the draft classes SGLang's ModelConfig rewrites them to for MTP;
    `adds`: what its attention adds to plain DSA; `ess_implements`: which of those ESS serves
    exactly; `refused`: None when supported, else why not (a refused family stops the launch)."""
    name: str
    architectures: tuple[str, ...]
    mtp_architectures: tuple[str, ...]
    sglang_model_file: str
    adds: frozenset = frozenset()
    ess_implements: frozenset = frozenset()
    refused: Optional[str] = None
    checked: str = ""
    attention_sublayers: int = 1          # latent (attention) layers per decoder layer

    @property
    def supported(self) -> bool:
        return self.refused is None


POOL_KIND = "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool"
BACKENDS = {"cpu": "ess", "cuda": "dsa (extended by ESS)"}
ROW_LAYOUT = ("one latent row per token and layer: (kv_lora_rank + qk_rope_head_dim) x 2 B bf16 on CPU; "
              "FlashMLA FP8 on CUDA: kv_lora_rank + 4 x kv_lora_rank/128 + 2 x qk_rope_head_dim B")

FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily(
        "DeepSeek-V3.2", ("DeepseekV32ForCausalLM",), ("DeepseekV3ForCausalLMNextN",), "deepseek_v2.py",
        checked="embedded tiny_dsv32: ESS on == off at server level, MTP, PD, the CUDA class in the GPU fake"),
    ModelFamily(
        "GLM-5 / 5.1 / 5.2 (GLM MoE DSA)", ("GlmMoeDsaForCausalLM",), ("GlmMoeDsaForCausalLMNextN",),
        "glm4_moe.py", adds=frozenset({SHARED_TOPK}), ess_implements=frozenset({SHARED_TOPK}),
        checked="embedded tiny_glm5 (GLM-5/5.1: every layer has its indexer): ESS on == off at server level; "
                "GLM's head counts through the CUDA class in the GPU fake (FlashMLA head padding); "
                "with its MTP layer (GLM's NextN, EAGLE) through the CUDA class in the GPU fake == ESS off (tokens, "
                "log-probs, accepted drafts); PD: the ESS decode node == an ESS-off decode node behind the same "
                "prefill node, every request warm from the prefill's state. GLM-5.2/5.3 shared-index layers "
                "(indexer_types 'shared'): one LRU slot table per group, resolved once per step at the anchor, every "
                "layer of the group planned there. Embedded tiny_glm52 (5 layers, anchors 0 and 3): ESS on == off "
                "at server level on the CPU "
                "(its inline engine plans the anchors inside their attention), no shared-index layer planned inside "
                "its own attention, one resolver call per anchor plan; through the CUDA class in the GPU fake every "
                "layer planned early at its anchor's indexer hand-off, outputs within BF16 rounding of a dense "
                "reference; store "
                "level: the same bytes read as the per-layer design. With speculative decoding "
                "(--speculative-algorithm) the store keeps one LRU per layer instead, the shared-index layers "
                "planned inside their own attention (exact, not hidden behind compute): through the CUDA class in "
                "the GPU fake with EAGLE's args, decode outputs equal to the grouped store's; at server level with "
                "its MTP layer (tiny_glm52's NextN, EAGLE) on the CPU ESS on == off (tokens, log-probs, accepted "
                "drafts), the start-up warning logged: tests/integration/test_glm52_mtp.py; --ess-explain sizes the "
                "store by the same rule"),
    ModelFamily(
        "Hunyuan V4", ("HYV4ForCausalLM",), ("HYV4ForCausalLMNextN",), "hunyuan_v4.py",
        adds=frozenset({SINKS, SHARED_TOPK}), ess_implements=frozenset({SINKS, SHARED_TOPK}),
        checked="embedded tiny_hyv4 (3 layers, the last shared-index); its learnable sinks against a reference "
                "written from the model's definition, each check failing with the sink dropped: the CPU ess backend "
                "(prefill, decode at every overlap level with the sink added once after the DA/DBA merge, MTP "
                "verify's gathered rows), the Triton decode (interpreter), the CUDA class's decode in the GPU fake "
                "(not run on a GPU; its prefill hands attn_sink to SGLang's own FlashMLA sparse prefill). "
                "Server-level ESS on == off (tokens equal, log-probs within 2 fp32 ulps: its fp32 lm_head), its "
                "shared-index layer in its anchor's group: tests/integration/test_hyv4_exactness.py. With "
                "--speculative-algorithm each layer keeps its own LRU, the shared layer planned inside attention "
                "(--ess-explain and the sim size it so); with its MTP layer (HYV4's NextN, EAGLE) on the CPU ESS "
                "on == off at server level (tokens, log-probs within 2 fp32 ulps, speculation counters; every "
                "token after the first from a verify step, with the sinks; the shaped draft is still never "
                "accepted on tiny_hyv4, so rejected drafts only): tests/integration/test_hyv4_mtp.py"),
    ModelFamily(
        "LongCat-Flash (sparse attention)", ("LongcatFlashForCausalLM",), ("LongcatFlashForCausalLMNextN",),
        "longcat_flash.py", adds=frozenset({TWO_ATTENTION_SUBLAYERS, SHARED_TOPK}),
        ess_implements=frozenset({TWO_ATTENTION_SUBLAYERS, SHARED_TOPK}), attention_sublayers=2,
        checked="embedded tiny_longcat (2 decoder layers = 4 latent layers, cli_factor 2, zero experts off: "
                "SGLang's zero-expert kernel is Triton, not on CPU): ESS on == off at server level; sizing "
                "counts 2 x num_hidden_layers latent layers. Its shared top-k layers (cli_factor, over the "
                "attention layer ids) are planned at their anchor with one LRU per group, as GLM-5.2's: "
                "tests/integration/test_longcat_exactness.py"),
    ModelFamily(
        "dots.note (Dots3)", ("Dots3NoteForCausalLM",), ("Dots3NoteForCausalLMNextN",), "dots3.py",
        adds=frozenset({SLIDING_WINDOW}),
        refused="its sliding-window layers keep their own latent pool, which ESS does not offload"),
    ModelFamily(
        "GLM-5-Next (hybrid)", ("Glm5NextForConditionalGeneration",), ("Glm5NextForConditionalGenerationNextN",),
        "glm5_next.py", adds=frozenset({LINEAR_ATTENTION}),
        refused="its DSA pool sits inside a hybrid pool with linear-attention (KDA) layers, which ESS does not wrap"),
    ModelFamily(
        "DeepSeek-V3 / Mistral Large 3 / Pixtral with an indexer",
        ("DeepseekV3ForCausalLM", "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration"),
        ("DeepseekV3ForCausalLMNextN",), "deepseek_v2.py / mistral_large_3.py",
        refused="SGLang treats it as DSA, but ESS has never been run on it (use the DeepseekV32ForCausalLM "
                "architecture for a DeepSeek-V3.2 checkpoint)"),
)

# Sparse-attention families SGLang serves through other pools or backends (no DSATokenToKVPool).
OTHER_SPARSE = {
    "DeepseekV4ForCausalLM": "DeepSeek-V4 (compressed and sliding-window KV in DeepSeekV4TokenToKVPool, MHA; "
                             "refused on a CUDA node only: without CUDA ESS keeps its C4 entries in the host store "
                             "on the CPU dsv4 arm, docs/dsv4.md)",
    "MiniMaxM3SparseForCausalLM": "MiniMax-M3 sparse (its own sparse attention and pool)",
    "MiniMaxM3SparseForConditionalGeneration": "MiniMax-M3 sparse (its own sparse attention and pool)",
    "Qwen4ExpForConditionalGeneration": "Qwen4-Exp (its own attention and pool)",
    "KimiK3ForConditionalGeneration": "Kimi K3 (hybrid linear attention)",
    "KimiK3LinearForCausalLM": "Kimi K3 (hybrid linear attention)",
}


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What a model's config says, as SGLang reads it. `is_dsa`: SGLang's is_deepseek_dsa;
    `adds`: features found in the config (SHARED_TOPK, LINEAR_ATTENTION, ...), besides the family's."""
    architecture: str
    model_type: str = ""
    is_dsa: bool = False
    adds: frozenset = frozenset()


def family_of(architecture: str) -> Optional[ModelFamily]:
    for fam in FAMILIES:
        if architecture in fam.architectures or architecture in fam.mtp_architectures:
            return fam
    return None


def attention_layers(architecture: str, num_hidden_layers: int) -> int:
    """Latent layers of a model (SGLang's ModelConfig.num_attention_layers): num_hidden_layers times its
    family's attention sub-layers per decoder layer (LongCat-Flash: 2). A draft (NextN) architecture
    counts its own layers: SGLang builds its pool from num_nextn_predict_layers."""
    fam = family_of(architecture)
    if fam is None or architecture in fam.mtp_architectures:
        return int(num_hidden_layers)
    return int(num_hidden_layers) * fam.attention_sublayers


def supported_text() -> str:
    """'DeepSeek-V3.2 (DeepseekV32ForCausalLM), ...': the families ESS serves."""
    return ", ".join(f"{f.name} ({', '.join(f.architectures)})" for f in FAMILIES if f.supported)


def refusal(facts: ModelFacts) -> Optional[str]:
    """None when ESS serves the model exactly; else the message that stops the launch."""
    fam = family_of(facts.architecture)
    what = f"{facts.architecture} (model_type {facts.model_type or '?'})"
    if fam is not None:
        what = f"{fam.name}: {what}"
    why = None
    if fam is None:
        why = (f"it is {OTHER_SPARSE[facts.architecture]}, outside ESS's DSA latent pool"
               if facts.architecture in OTHER_SPARSE else "it is not a model family ESS knows")
    elif not facts.is_dsa:
        why = FEATURE_TEXT[NOT_DSA]
    elif fam.refused:
        why = fam.refused
    else:
        extra = sorted((facts.adds | fam.adds) - fam.ess_implements)
        if extra:
            why = "its attention adds what ESS does not implement: " + "; ".join(FEATURE_TEXT[a] for a in extra)
    if why is None:
        return None
    return (f"ESS cannot serve {what}: {why}. ESS serves: {supported_text()}. "
            f"Serve this model with ESS off (--ess-enabled false; on CPU also pass an --attention-backend that "
            f"serves it: the launcher's CPU default, ess, serves DSA models only), or use a supported model")
