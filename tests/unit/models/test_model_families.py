"""The model table (sgl_ess/models/families.py) and the config reader beside it
(integration/sglang/model_support.py): configs read by transformers' own loader, facts by SGLang's
own helpers, one decision. The launcher's exit 2 is checked end to end in
tests/integration/test_model_table_cli.py."""

import copy
import json

import pytest

from sgl_ess.models import TINY_DSV32_DIR, TINY_GLM5_DIR, TINY_HYV4_DIR, families, make_tiny
from sgl_ess.models.families import SHARED_TOPK, SINKS, ModelFacts, refusal

pytest.importorskip("sglang")

from sgl_ess.integration.sglang import model_support  # noqa: E402
from sgl_ess.serving.preflight import PreflightError  # noqa: E402


def _config(model_type: str, arch: str, **over):
    """A transformers config of `model_type` (its own config class) with the tiny DSV3.2 sizes."""
    from transformers import CONFIG_MAPPING

    # a deep copy: transformers' config classes rewrite the rope dict they are given in place, which
    # would change make_tiny.MODEL_CONFIG for every later test
    d = copy.deepcopy({k: v for k, v in make_tiny.MODEL_CONFIG.items() if k != "model_type"})
    d.update(architectures=[arch], **over)
    return CONFIG_MAPPING[model_type].from_dict(d)


def _auto(path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


@pytest.mark.parametrize("path", [TINY_DSV32_DIR, TINY_GLM5_DIR])
def test_embedded_models_are_served(path):
    facts = model_support.facts_of(_auto(path))
    assert facts.is_dsa and facts.adds == frozenset(), facts
    assert refusal(facts) is None
    model_support.check(_auto(path))              # raises nothing


def test_embedded_glm5_is_what_make_tiny_writes():
    with open(f"{TINY_GLM5_DIR}/config.json") as fh:
        shipped = json.load(fh)
    assert shipped == dict(make_tiny.GLM5_CONFIG, bos_token_id=shipped["bos_token_id"],
                           eos_token_id=shipped["eos_token_id"])
    assert shipped["architectures"] == ["GlmMoeDsaForCausalLM"]
    assert shipped["rope_scaling"]["rope_type"] == "deepseek_yarn"
    assert shipped["num_hidden_layers"] != make_tiny.MODEL_CONFIG["num_hidden_layers"]   # sizing must read it


@pytest.mark.parametrize("model_type,arch,named", [
    ("qwen3", "Qwen3ForCausalLM", "not a model family ESS knows"),
    ("deepseek_v4", "DeepseekV4ForCausalLM", "DeepSeek-V4"),
    ("deepseek_v3", "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM"),
])
def test_models_outside_the_table_are_refused_with_what_is_supported(model_type, arch, named, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)    # DeepSeek-V4: served on CPU only
    cfg = _config(model_type, arch)
    with pytest.raises(PreflightError) as e:
        model_support.check(cfg)
    msg = str(e.value)
    assert arch in msg and named in msg, msg
    assert "DeepseekV32ForCausalLM" in msg and "GlmMoeDsaForCausalLM" in msg, msg     # what is supported
    assert "--ess-enabled false" in msg, msg


def test_dense_deepseek_v3_without_an_indexer_is_not_dsa():
    facts = model_support.facts_of(_config("deepseek_v3", "DeepseekV3ForCausalLM", index_topk=None))
    assert not facts.is_dsa
    assert "no DSA sparse attention" in refusal(facts)


def test_glm_shared_index_layers_are_found_by_sglangs_rule():
    """GLM-5.2-style indexer_types: SGLang's dsa_layer_skips_topk says which layers reuse the top-k."""
    facts = model_support.facts_of(_config("glm_moe_dsa", "GlmMoeDsaForCausalLM", num_hidden_layers=4,
                                           indexer_types=["full", "shared", "shared", "full"]))
    assert facts.adds == frozenset({SHARED_TOPK})
    assert refusal(facts) is None       # served: the shared layers plan their fetch late (exact)


def test_a_feature_the_family_does_not_have_in_the_table_is_refused():
    """A supported architecture whose config adds what ESS does not implement is refused, never served."""
    for arch in ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"):
        text = refusal(ModelFacts(arch, "x", is_dsa=True, adds=frozenset({SINKS})))
        assert text is not None and "learnable attention sinks" in text, text
        assert refusal(ModelFacts(arch, "x", is_dsa=True)) is None


def test_the_table_agrees_with_sglangs_dsa_list():
    """Every architecture the table serves is one SGLang runs on its DSA path (is_deepseek_dsa), and
    every refused DSA family names why."""
    from sglang.srt.configs.model_config import is_deepseek_dsa

    for fam in families.FAMILIES:
        for arch in fam.architectures + fam.mtp_architectures:
            assert is_deepseek_dsa({"architectures": [arch], "index_topk": 32}), (fam.name, arch)
        assert fam.supported or fam.refused
    supported = [a for f in families.FAMILIES if f.supported for a in f.architectures]
    assert families.supported_text().count("ForCausalLM") == len(supported)
    assert {"DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "LongcatFlashForCausalLM"} <= set(supported)


def test_hyv4_is_served_with_its_sinks_and_shared_index_layers():
    """The embedded tiny_hyv4 (learnable sinks; its last layer reuses the previous top-k): served, both
    features implemented (attention paths: tests/unit/attention/test_sinks.py and beside it)."""
    facts = model_support.facts_of(_auto(TINY_HYV4_DIR))
    assert facts.is_dsa and facts.architecture == "HYV4ForCausalLM", facts
    assert SHARED_TOPK in facts.adds, facts
    fam = families.family_of("HYV4ForCausalLM")
    assert fam.supported and {SINKS, SHARED_TOPK} <= fam.adds <= fam.ess_implements, fam
    assert refusal(facts) is None
    model_support.check(_auto(TINY_HYV4_DIR))
    assert "HYV4ForCausalLM" in families.supported_text()


def test_embedded_hyv4_is_what_make_tiny_writes():
    with open(f"{TINY_HYV4_DIR}/config.json") as fh:
        shipped = json.load(fh)
    assert shipped == dict(make_tiny.HYV4_CONFIG, bos_token_id=shipped["bos_token_id"],
                           eos_token_id=shipped["eos_token_id"])
    assert shipped["learnable_sink"] is True and shipped["indexer_types"][-1] == "shared"
