"""Issue 33, items 3 and 4: ``python -m sgl_ess.launch_server ... --ess-explain`` as a GPU user calls it.

The CUDA branch of the launcher's resolver is forced with ``--ess-explain-device cuda:8:141`` (an
8 x H200 node) on this CPU machine; DeepSeek-V3.2's config comes from a Hugging Face cache made in a
tmp dir (HF_HOME, HF_HUB_OFFLINE=1), as ``hf download`` leaves it, with the model's real geometry
(sgl_ess/sim/data/model_deepseek_v32_exp.json) on the embedded tiny config's keys. Nothing is
loaded and no server starts: each run ends by itself (exit 0, or 2 for a refused configuration).
"""

import json
import os
import re
import subprocess
import sys

import pytest

from sgl_ess.models import TINY_DSV32_DIR

from ._server import REPO, free_port

pytestmark = pytest.mark.integration
HUB_ID = "deepseek-ai/DeepSeek-V3.2"
H200_NODE = ["--ess-explain", "--ess-explain-device", "cuda:8:141"]
REAL = os.path.join(REPO, "sgl_ess", "sim", "data", "model_deepseek_v32_exp.json")


def dsv32_config() -> dict:
    """The tiny config's keys with DeepSeek-V3.2's values wherever the architecture facts give one."""
    with open(os.path.join(TINY_DSV32_DIR, "config.json")) as fh:
        cfg = json.load(fh)
    with open(REAL) as fh:
        real = json.load(fh)
    return {k: real.get(k, v) for k, v in cfg.items()}


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    """An HF cache holding only DeepSeek-V3.2's config.json, laid out as huggingface_hub lays it out."""
    home = tmp_path_factory.mktemp("hf_home")
    repo = home / "hub" / ("models--" + HUB_ID.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps(dsv32_config(), indent=1))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return home


def _start(args, hf_home):
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    env.pop("HUGGINGFACE_HUB_CACHE", None)
    return subprocess.Popen([sys.executable, "-m", "sgl_ess.launch_server", "--port", str(free_port()), *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.fixture(scope="module")
def runs(hf_home, tmp_path_factory):
    """The module's launcher runs, started together (each only imports and plans: seconds of CPU)."""
    model = tmp_path_factory.mktemp("dsv32")
    (model / "config.json").write_text(json.dumps(dsv32_config()))
    cases = {
        "hub_tp8": (["--model-path", HUB_ID, "--tp", "8", *H200_NODE], hf_home),
        "abbreviated": (["--model-p", str(model), "--max-total-tok", "1000", "--tp", "8", *H200_NODE], hf_home),
        "too_large": (["--model-path", HUB_ID, "--tp", "8", "--ess-memory-pool-size-gb", "100000", *H200_NODE],
                      hf_home),
        "not_cached": (["--model-path", "deepseek-ai/No-Such-Model", "--tp", "8", *H200_NODE],
                       tmp_path_factory.mktemp("empty_hf_home")),
    }
    procs = {name: _start(*case) for name, case in cases.items()}
    out = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            pytest.fail(f"--ess-explain run {name} still running after 300 s: it must end by itself")
        out[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    out["model_dir"] = str(model)
    return out


def _bytes(out: str, label: str) -> int:
    m = re.search(rf"^\s*{re.escape(label)}: [^\n]*?\((\d+) B\)", out, re.M)
    assert m, f"no '{label}: ... (N B)' line in:\n{out}"
    return int(m.group(1))


def _one_error(err: str) -> str:
    lines = [l for l in err.splitlines() if l.startswith("sgl_ess.launch_server: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def test_hub_id_tp8_on_an_h200_node_passes_with_defaults_that_fit_the_node(runs):
    r = runs["hub_tp8"]
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "preflight passed" in out and "8 CUDA GPU(s) of 141.0 GiB" in out
    per_node = _bytes(out, "host pool per node")
    usable = int(re.search(r"usable host memory [^\n]*?\((\d+) B\)", out).group(1))
    assert 0 < per_node <= usable, out
    # CUDA keeps one pool per rank: 8 pools share the node's budget (before the fix each got all of it)
    assert "8 host pool(s) per node" in out
    sized_by = re.search(r"host pool sized by: (.*)", out).group(1)
    assert sized_by.startswith("default ") and "usable host memory" in sized_by and \
        "set --ess-memory-pool-size-gb to change" in sized_by, sized_by
    # DeepSeek-V3.2 read through transformers from the cache: 61 layers, FlashMLA's 656-byte FP8 row
    assert "61 layers, latent row 656 B" in out and "index_topk 2048" in out
    tokens = int(re.search(r"host pool per pool: (\d+) tokens", out).group(1))
    assert per_node == 8 * (tokens + 64) * 61 * 656
    argv = re.search(r"SGLang 0\.5\.23\):\n  (.*)", out).group(1).split()
    assert argv[argv.index("--model-path") + 1] == HUB_ID and argv[argv.index("--tp-size") + 1] == "8"
    assert argv[argv.index("--max-total-tokens") + 1] == str(tokens)
    assert argv[argv.index("--attention-backend") + 1] == "dsa" and argv[argv.index("--kv-cache-dtype") + 1] == \
        "fp8_e4m3"
    dev = _bytes(out, "device bytes per GPU (ESS store)")
    # the store's whole allocation: at least 4 x index_topk slots x (64 + 1) request rows of hot buffers, and
    # it fits the GPU
    assert 65 * 8192 * 61 * 656 < dev < 141 << 30
    assert "request rows" in out and "context tokens (the model's config)" in out


def test_abbreviated_flags_keep_the_users_values(runs):
    """SGLang's parser accepts unambiguous prefixes: the launcher must read them the same way."""
    r, model = runs["abbreviated"], runs["model_dir"]
    assert r.returncode == 0, r.stderr[-3000:]
    argv = re.search(r"SGLang 0\.5\.23\):\n  (.*)", r.stdout).group(1).split()
    assert argv.count("--model-path") == 1 and argv[argv.index("--model-path") + 1] == str(model), argv
    assert argv.count("--max-total-tokens") == 1 and argv[argv.index("--max-total-tokens") + 1] == "1000", argv
    assert re.search(r"max_total_tokens = 1000 .*--max-total-tokens \(given\)", r.stdout)
    assert re.search(rf"model_path = '{re.escape(model)}' .*\(given\)", r.stdout)
    assert "host pool per pool: 1000 tokens" in r.stdout


def test_a_pool_larger_than_the_node_is_refused_naming_the_flag(runs):
    r = runs["too_large"]
    line = _one_error(r.stderr)
    assert r.returncode == 2 and "--ess-memory-pool-size-gb 100000" in line and "lower --ess-memory-pool-size-gb" \
        in line and "available" in line, line
    assert "preflight passed" not in r.stdout


def test_an_unreadable_hub_config_is_refused_with_what_helps(runs):
    r = runs["not_cached"]
    line = _one_error(r.stderr)
    assert r.returncode == 2 and "deepseek-ai/No-Such-Model" in line and "HF_HUB_OFFLINE" in line and \
        "hf download" in line and "local directory" in line, line
