"""Installing sgl-ess does not change plain SGLang: its two ``sglang.srt.plugins`` entry points load into
every SGLang process of the environment (SGLang's own loader), and outside ``python -m
sgl_ess.launch_server`` they register nothing (plugin.py ``ess_process``).

A plain ``python -m sglang.launch_server`` runs on CPU in this environment: a tiny Llama written here
(the embedded tiny_dsv32's tokenizer, random weights with ``--load-format dummy``; plain SGLang has no
CPU path for DeepSeek-V3.2's sparse attention), the CPU flags and environment the launcher gives its
own servers. Its log must show SGLang executing both entry points, then no traceback, no failed hook
and no line of ours (sgl-ess, ESS, deterministic) anywhere. The ESS server (conftest ``server_on``)
must still have its hooks applied: /ess/status answers with the store's usage, and no hook failed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from sgl_ess.config import ENV_CONFIG_JSON
from sgl_ess.models import TINY_DSV32_DIR

from ._server import REPO, Server, group_alive

pytestmark = pytest.mark.integration

ENTRY_POINTS = ("sgl_ess", "sgl_ess_ops")
HOOK_FAILURES = ("Failed to apply hooks", "Failed to load plugin", "Failed to execute general plugin")
OURS = re.compile(r"(?i:sgl[-_]?ess|deterministic)|\bESS\b")
# SGLang's plugin loader names every entry point it finds and runs (sglang/srt/plugins/__init__.py);
# its server_args dump names every flag (enable_deterministic_inference among them).
SGLANG_LINES = re.compile(r"Available plugins for group|^\s*- \S+ -> \S+:\S+$|Loaded plugin \S+ from group|"
                          r"Executed general plugin: |server_args=\{")

TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "vocab_size": 2048, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "bos_token_id": 0, "eos_token_id": 1}


def tiny_llama(dst: str) -> str:
    os.makedirs(dst, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(TINY_DSV32_DIR, name), dst)
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(TINY_LLAMA, fh)
    return dst


class PlainSGLang(Server):
    """``python -m sglang.launch_server`` (not sgl-ess's launcher), with _server.Server's log, health wait,
    HTTP helpers and process-group stop."""

    def __init__(self, name: str, args: list[str], env: dict):
        self.name, self.admin_key, self._argv, self._env = name, None, list(args), env
        self._launch()

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "sglang.launch_server", "--port", str(self.port), *self._argv]


def plain_env() -> dict:
    """This environment without anything sgl-ess's launcher would export, plus the CPU switches it sets
    for its own servers (process_env.py): SGLang's CPU engine, no crash-dump waits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLESS_") and k != "SGLANG_PLUGINS"}
    env.update(SGLANG_USE_CPU_ENGINE="1", SGLANG_CUDA_COREDUMP_BEFORE_CRASH="0", SGLANG_PYSPY_DUMP_BEFORE_CRASH="0")
    # nothing of sgl-ess in it, _server.RUN_MARK (SGLESS_TEST_RUN_<pid>) included: the fixture checks its own
    # process group
    assert ENV_CONFIG_JSON not in env
    return env


def lines_of_ours(log: str) -> list[str]:
    """Log lines that mention sgl-ess, ESS or deterministic mode, other than SGLang's own plugin-loader
    and server_args lines."""
    return [ln for ln in log.splitlines() if OURS.search(ln) and not SGLANG_LINES.search(ln)]


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    model = tiny_llama(str(tmp_path_factory.mktemp("tiny_llama")))
    srv = PlainSGLang("plain_sglang", ["--model-path", model, "--load-format", "dummy", "--device", "cpu",
                                       "--host", "127.0.0.1", "--sleep-on-idle", "--max-total-tokens", "4096",
                                       "--max-running-requests", "4"], plain_env())
    try:
        srv.wait_healthy()
    except Exception:
        srv.stop()
        raise
    yield srv
    srv.stop()
    assert not group_alive(srv.pgid), f"processes of {srv.name} left behind (pgid {srv.pgid})"


def test_our_entry_points_are_installed_for_every_sglang_process():
    """What makes the test below say something: SGLang loads every entry point of its group (no
    SGLANG_PLUGINS in the plain server's environment), and ours are there."""
    names = {ep.name for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")}
    assert set(ENTRY_POINTS) <= names, names


def test_plain_sglang_server_runs_our_entry_points_as_no_ops(plain_server):
    out = plain_server.generate("hello there", max_new_tokens=4)
    assert out["meta_info"]["completion_tokens"] == 4, out
    log = open(plain_server.log.name, errors="replace").read()
    assert not [f for f in HOOK_FAILURES if f in log], plain_server.log_tail(200)
    assert "Traceback" not in log, plain_server.log_tail(200)
    assert lines_of_ours(log) == []


def test_ess_server_still_applies_its_hooks(server_on):
    server_on.generate("hello there", max_new_tokens=4)
    usage = server_on.ess_usage()                     # /ess/status: the store behind the ess backend
    assert usage["host_tokens_capacity"] > 0, usage
    log = open(server_on.log.name, errors="replace").read()
    assert not [f for f in HOOK_FAILURES if f in log], server_on.log_tail(200)
    assert "without CUDA/XPU" not in log              # no --enable-deterministic-inference: no warning


PROBE = """
import json, sys
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
load_plugins()
ours = sorted(m for m in sys.modules if m.startswith("sgl_ess"))
print(json.dumps({"hooks": sorted(t for t, hs in HookRegistry._hooks.items() if hs), "modules": ours}))
"""


def test_sglangs_plugin_loader_outside_the_launcher_registers_nothing():
    """SGLang's own loader, in a fresh interpreter of this environment without the launcher's config:
    both entry points are imported (their modules and the light config module) and register no hook."""
    r = subprocess.run([sys.executable, "-c", PROBE], env=plain_env(), cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["hooks"] == [], got
    assert "sgl_ess.integration.sglang.plugin" in got["modules"], got     # loaded, and a no-op
    assert "sgl_ess.integration.sglang.ops_hooks" in got["modules"], got
    heavy = [m for m in got["modules"] if m.startswith(("sgl_ess.integration.sglang.backends",
                                                        "sgl_ess.integration.sglang.pools",
                                                        "sgl_ess.integration.sglang.launcher"))]
    assert heavy == [], heavy
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
