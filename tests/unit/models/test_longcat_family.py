"""LongCat-Flash with sparse attention (``LongcatFlashForCausalLM``) in the model table: served, and
counted in latent (attention) layers everywhere the launcher sizes by layers. Its decoder layer holds
two MLA attention sub-layers (SGLang's longcat_flash.py: layer_id * 2 + i), so SGLang's ModelConfig
counts num_attention_layers = 2 x num_hidden_layers and builds its latent pool with that many layers;
the launcher's GB -> tokens arithmetic must divide by the same number. The server-level check (the
pool SGLang built equals the plan, ESS on == off) is tests/integration/test_longcat_exactness.py."""

import json
import os

import pytest

from sgl_ess.models import families, make_tiny
from sgl_ess.models.families import SHARED_TOPK, TWO_ATTENTION_SUBLAYERS, attention_layers, refusal

pytest.importorskip("sglang")

from sgl_ess.integration.sglang import model_support  # noqa: E402
from sgl_ess.integration.sglang.launcher import model_config  # noqa: E402

TINY_LONGCAT_DIR = os.path.join(os.path.dirname(families.__file__), "tiny_longcat")


def _auto(path):
    """The config as SGLang loads it (its get_config: SGLang's own LongcatFlashConfig)."""
    from sglang.srt.utils.hf_transformers.config import get_config

    return get_config(path, trust_remote_code=False)


def test_embedded_longcat_is_what_make_tiny_writes():
    with open(os.path.join(TINY_LONGCAT_DIR, "config.json")) as fh:
        shipped = json.load(fh)
    assert shipped == dict(make_tiny.LONGCAT_CONFIG, bos_token_id=shipped["bos_token_id"],
                           eos_token_id=shipped["eos_token_id"])
    assert shipped["architectures"] == ["LongcatFlashForCausalLM"]
    assert shipped["zero_expert_num"] == 0 and shipped["zero_expert_type"] is None    # Triton-only on SGLang
    assert make_tiny.CONFIGS["longcat"] == ("tiny_longcat", make_tiny.LONGCAT_CONFIG)


def test_attention_layers_follow_sglangs_model_config():
    """Our count equals SGLang 0.5.23's own ModelConfig.num_attention_layers for the shipped config."""
    from sglang.srt.configs.model_config import ModelConfig

    mc = ModelConfig(TINY_LONGCAT_DIR, model_override_args="{}")
    assert mc.num_hidden_layers == 2 and mc.num_attention_layers == 4
    assert attention_layers("LongcatFlashForCausalLM", mc.num_hidden_layers) == mc.num_attention_layers
    # one attention layer per NextN (draft) layer and per layer of the other families
    assert attention_layers("LongcatFlashForCausalLMNextN", 1) == 1
    assert attention_layers("GlmMoeDsaForCausalLM", 78) == 78


def test_launcher_geometry_counts_both_attention_sublayers():
    """load_geometry reads the config as SGLang does: transformers' own LongcatFlashConfig derives
    num_hidden_layers as 2 x num_layers (here it parses the shipped config as 1 decoder layer),
    SGLang's keeps the decoder layers; the launcher must count what SGLang's pool will hold."""
    geo = model_config.load_geometry(TINY_LONGCAT_DIR)
    assert geo.layers == 4 and geo.latent_row_bytes == (64 + 16) * 2 and geo.index_topk == 32


def test_real_checkpoint_layout_num_layers_only(tmp_path):
    """LongCat-Flash checkpoints give num_layers (28) and no num_hidden_layers: SGLang's pool has
    2 x 28 = 56 latent layers, which transformers' config would have doubled once more."""
    with open(os.path.join(TINY_LONGCAT_DIR, "config.json")) as fh:
        cfg = json.load(fh)
    cfg.pop("num_hidden_layers")
    cfg["num_layers"] = 28
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert model_config.load_geometry(str(tmp_path)).layers == 56


def test_longcat_is_served_with_its_shared_topk_layers():
    """cli_factor 2: SGLang's dsa_layer_skips_topk, asked per attention layer id, finds shared layers;
    the table serves them (today's late-plan path, exact)."""
    facts = model_support.facts_of(_auto(TINY_LONGCAT_DIR))
    assert facts.is_dsa and facts.adds == frozenset({SHARED_TOPK}), facts
    assert refusal(facts) is None
    fam = families.family_of("LongcatFlashForCausalLM")
    assert fam.supported and {TWO_ATTENTION_SUBLAYERS, SHARED_TOPK} <= fam.ess_implements
    model_support.check(_auto(TINY_LONGCAT_DIR))          # raises nothing
    assert "LongcatFlashForCausalLM" in families.supported_text()


def test_shared_layers_are_asked_by_attention_layer_id():
    """SGLang numbers LongCat's attention layers 2 * layer + i and asks dsa_layer_skips_topk per
    attention layer: with one decoder layer and cli_factor 2 the only shared layer is attention layer
    1, which a reader asking about num_hidden_layers ids (0 only) would miss."""
    cfg = _auto(TINY_LONGCAT_DIR)
    cfg.num_hidden_layers = 1
    assert model_support.facts_of(cfg).adds == frozenset({SHARED_TOPK})
    cfg.cli_factor = 1
    assert model_support.facts_of(cfg).adds == frozenset()
