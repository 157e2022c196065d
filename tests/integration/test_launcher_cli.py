"""``python -m sgl_ess.launch_server``: --help lists the ESS flags; bad config values are
refused at start with the key, the value and what is allowed."""

import subprocess
import sys

import pytest

from sgl_ess.config import FIELDS

from ._server import REPO

pytestmark = pytest.mark.integration


def _run(args, timeout=120):
    return subprocess.run([sys.executable, "-m", "sgl_ess.launch_server", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_help_lists_ess_flags_with_meaning():
    pytest.importorskip("sglang")
    r = _run(["--help"])
    assert r.returncode == 0, r.stderr
    for f in FIELDS:
        assert "--ess-" + f.name.replace("_", "-") in r.stdout
    assert "--ess-config" in r.stdout
    assert "--model-path" in r.stdout  # SGLang's own flags are there too
    assert "host pool" in r.stdout
    # --ess-explain and how to plan for a GPU node from any machine (issue 33)
    assert "--ess-explain " in r.stdout and "--ess-explain-device" in r.stdout and "cuda:8:141" in r.stdout


def test_bad_yaml_value_is_refused_with_key_value_and_allowed(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("ess_config:\n  enabled: true\n  prefetch_overlap_level: turbo\n")
    r = _run(["--ess-config", str(cfg)])
    assert r.returncode == 2
    assert "prefetch_overlap_level" in r.stderr and "'turbo'" in r.stderr
    assert "none, da, dba, full" in r.stderr


def test_bad_flag_value_is_refused():
    r = _run(["--ess-memory-pool-size-gb", "-3"])
    assert r.returncode == 2
    assert "memory_pool_size_gb" in r.stderr and "-3" in r.stderr and ">= 0" in r.stderr
