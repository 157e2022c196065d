"""sgl_ess.config: one validated ESS config from YAML, environment and flags."""

import json

import pytest

from sgl_ess.config import EssConfig, EssConfigError, build_config


def _yaml(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


def test_user_format_parses(tmp_path):
    path = _yaml(tmp_path, """
inference_engine: {model_name: m, attention_mode: sparse, decode_batch_size: 64}
ess_config:
  enabled: true
  offload_target: cpu_memory
  prefetch_overlap_level: full
  max_gpu_buffer_size_gb: 16
  memory_pool_size_gb: 200
""")
    cfg = build_config(path, {}, environ={})
    assert cfg.enabled and cfg.prefetch_overlap_level == "full"
    assert cfg.max_gpu_buffer_size_gb == 16.0 and cfg.memory_pool_size_gb == 200.0
    assert cfg.engine["decode_batch_size"] == 64
    assert EssConfig.from_json(cfg.to_json()) == cfg


def test_precedence_flags_over_env_over_yaml(tmp_path):
    path = _yaml(tmp_path, "ess_config: {hot_slots_per_request: 64, warmup_queries: 8}\n")
    cfg = build_config(path, {"hot_slots_per_request": "100"}, environ={"SGLESS_WARMUP_QUERIES": "16",
                                                                        "SGLESS_HOT_SLOTS_PER_REQUEST": "80"})
    assert cfg.hot_slots_per_request == 100 and cfg.warmup_queries == 16


@pytest.mark.parametrize("text, needles", [
    ("ess_config: {offload_target: ssd}\n", ["offload_target", "'ssd'", "cpu_memory"]),
    ("ess_config: {enabled: maybe}\n", ["enabled", "'maybe'", "true or false"]),
    ("ess_config: {memory_pool_size_gb: -1}\n", ["memory_pool_size_gb", "-1", ">= 0"]),
    ("ess_config: {hot_slots: 5}\n", ["ess_config.hot_slots", "unknown", "hot_slots_per_request"]),
    ("inference_engine: {attention_mode: dense}\n", ["attention_mode", "'dense'", "sparse"]),
    ("ess_config: {enable_mtp: perhaps}\n", ["enable_mtp", "'perhaps'", "true or false"]),
    ("something_else: 1\n", ["something_else", "ess_config"]),
])
def test_bad_values_name_key_value_and_allowed(tmp_path, text, needles):
    with pytest.raises(EssConfigError) as e:
        build_config(_yaml(tmp_path, text), {}, environ={})
    for n in needles:
        assert n in str(e.value), f"{n!r} missing from: {e.value}"


def test_missing_file_is_named():
    with pytest.raises(EssConfigError, match="does not exist"):
        build_config("/nonexistent/ess.yaml", {}, environ={})


def test_summary_lists_every_key():
    s = build_config(None, {}, environ={}).summary()
    for k in json.loads(EssConfig().to_json()):
        if k != "engine":
            assert k + "=" in s
