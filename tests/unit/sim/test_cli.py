import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_ess.sim.cli import main

ROOT = Path(__file__).resolve().parents[3]
KEYS = {"context", "mtp", "accept", "batch", "ratio", "tokens_per_s_per_node", "otps", "step_ms",
        "max_batch_fits", "misses_per_layer"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "sgl_ess.sim", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def test_run_json_rows():
    p = _cli("run", "--context", "32768", "--mtp", "2", "--accept", "1.7", "--batch", "52,160",
             "--ratio", "1.0,0.21", "--json")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(rows) == 2 and KEYS <= set(rows[0])
    assert rows[0]["tokens_per_s_per_node"] == pytest.approx(9647.71, rel=0.05)
    assert rows[1]["misses_per_layer"] > 0 and rows[0]["misses_per_layer"] == 0


def test_no_arguments_prints_headline():
    p = _cli()
    assert p.returncode == 0, p.stderr
    assert "+69.4%" in p.stdout and "9647" in p.stdout and "16347" in p.stdout


@pytest.mark.parametrize("args, needle", [
    (["run", "--ratio", "1.5"], "--ratio"),
    (["run", "--ratio", "0"], "(0, 1]"),
    (["run", "--batch", "-4"], "--batch"),
    (["run", "--batch", "500"], "largest batch that fits"),
    (["run", "--hardware", "b300"], "h200"),
    (["run", "--batch", "abc"], "integer"),
    (["run", "--ratio", "0.05"], "top-k"),
    (["plan", "--gpus", "12"], "--gpus"),
])
def test_bad_input_exits_2_with_message(args, needle, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_bad_input_via_subprocess_has_no_traceback():
    p = _cli("run", "--gpu-mem-gb", "-80")
    assert p.returncode == 2 and "--gpu-mem-gb" in p.stderr and "Traceback" not in p.stderr


def test_table_output_and_unconstrained_run(capsys):
    assert main(["run", "--batch", "256", "--no-fit-check"]) == 0
    out = capsys.readouterr().out
    assert "tok/s/node" in out and "step breakdown" in out


def test_plan_json(capsys):
    assert main(["plan", "--context", "32768", "--json", "--slo-tpot-ms", "90"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["gain_pct"] > 30
    assert plan["best"]["step_ms"] / plan["best"]["accept"] <= 90
    assert set(plan["by_overlap"]) == {"none", "da", "dba", "full"}


def test_sensitivity_json(capsys):
    assert main(["sensitivity", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    knobs = {r["knob"] for r in rows}
    assert {"pcie_h2d_gibps", "hit_rate", "overlap"} <= knobs
    pcie = [r["gain_pct"] for r in rows if r["knob"] == "pcie_h2d_gibps"]
    assert pcie == sorted(pcie)


def test_measured_profile_replaces_an_op(tmp_path, capsys):
    prof = tmp_path / "ops.json"
    prof.write_text(json.dumps({"ops": {"attention.sparse": [[1, 5.0], [10000, 5.0]]}}))
    assert main(["run", "--json"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert main(["run", "--json", "--op-profile", str(prof)]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert fast["step_ms"] < base["step_ms"]


def test_sweep_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sweep.png"
    assert main(["sweep", "--batches", "32,64,128", "--ratios", "0.21,0.5", "--plot", str(out)]) == 0
    assert out.stat().st_size > 10_000
    assert "misses" in capsys.readouterr().out


def test_sim_imports_no_torch_or_sglang():
    code = ("import sys, sgl_ess.sim.cli, sgl_ess.sim.commands, sgl_ess.sim.plot; "
            "assert 'torch' not in sys.modules and 'sglang' not in sys.modules; "
            "assert 'matplotlib' not in sys.modules; print('ok')")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr
    for src in (ROOT / "sgl_ess" / "sim").glob("*.py"):
        text = src.read_text()
        assert "import torch" not in text and "import sglang" not in text, src
