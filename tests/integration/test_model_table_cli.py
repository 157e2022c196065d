"""``python -m sgl_ess.launch_server`` with ESS on and a model outside the table
(sgl_ess/models/families.py) stops before anything loads: exit 2, the architecture named, what ESS
serves listed, and the flag that serves it with ESS off. Random-weight configs written here; no
server starts (a launch that got past the check would load SGLang's scheduler and log its weights)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from sgl_ess.models import TINY_DSV32_DIR

from ._server import REPO

pytestmark = pytest.mark.integration

CONFIGS = {
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "vocab_size": 2048},
    "dsv3": None,            # the tiny DSV3.2 config under DeepSeek-V3's architecture (DSA, never run with ESS)
}


def _model(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(TINY_DSV32_DIR, f), d)
    cfg = CONFIGS[name]
    if cfg is None:
        with open(os.path.join(TINY_DSV32_DIR, "config.json")) as fh:
            cfg = dict(json.load(fh), architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3")
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def _launch(*args):
    return subprocess.run([sys.executable, "-m", "sgl_ess.launch_server", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=180)


@pytest.mark.parametrize("name,arch,why", [("qwen3", "Qwen3ForCausalLM", "not a model family ESS knows"),
                                           ("dsv3", "DeepseekV3ForCausalLM", "never been run")])
def test_model_outside_the_table_exits_2_before_loading(tmp_path, name, arch, why):
    r = _launch("--model-path", _model(tmp_path, name), "--load-format", "dummy")
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    err = r.stderr
    assert f"ESS cannot serve" in err and arch in err and why in err, err[-3000:]
    assert "DeepseekV32ForCausalLM" in err and "GlmMoeDsaForCausalLM" in err, err[-3000:]
    assert "--ess-enabled false" in err
    assert "Load weight" not in err + r.stdout and "scheduler" not in (err + r.stdout).lower(), err[-3000:]


def test_with_ess_off_the_table_is_not_asked(tmp_path):
    """--ess-enabled false: the launcher's plan (--ess-explain, exit 0 without loading) has no refusal."""
    r = _launch("--model-path", _model(tmp_path, "qwen3"), "--ess-enabled", "false", "--ess-explain")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ESS cannot serve" not in r.stderr + r.stdout
