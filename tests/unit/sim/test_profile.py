"""Op profiles: loading, the format's checks, table interpolation, and tables replacing the model."""
import json

import numpy as np
import pytest

from sgl_ess.sim.config import DeploymentConfig, ModelSpec, SimConfig, SimConfigError, WorkloadConfig
from sgl_ess.sim.hardware import get_hardware
from sgl_ess.sim.profile import CONSTANT_NAMES, FORMAT, OpProfile, Table
from sgl_ess.sim.step import simulate

M = ModelSpec.load()


def _write(tmp_path, name, d):
    p = tmp_path / name
    p.write_text(d if isinstance(d, str) else json.dumps(d))
    return str(p)


def _measured(**tables):
    return {"format": FORMAT, "name": "t", "hardware": "h200", "base": "h200_published",
            "model": {"name": "deepseek_v32_exp", "shape": M.shape_signature()},
            "tables": {k: {"x_unit": "tokens", "points": v} for k, v in tables.items()}}


def test_shipped_profile_loads_with_every_constant_sourced():
    p = OpProfile.load()
    assert p.name == "h200_published" and p.hardware == "h200" and not p.tables
    assert set(CONSTANT_NAMES) <= set(p.constants)
    for name, c in p.constants.items():
        assert c["kind"] in ("sourced", "derived", "prior") and c["source"] and c["unit"], name


def test_table_interpolation_hand_cases():
    t = Table("tokens", np.array([10.0, 20.0, 40.0]), np.array([5.0, 7.0, 11.0]))
    assert t.at(1) == 5.0                      # held at the first point below it
    assert t.at(15) == pytest.approx(6.0)      # linear between points
    assert t.at(40) == 11.0
    assert t.at(60) == pytest.approx(15.0)     # extended along the last segment (slope 0.2)
    one = Table("tokens", np.array([10.0]), np.array([4.0]))
    assert one.at(5) == 4.0 and one.at(20) == pytest.approx(8.0)


def test_a_table_replaces_its_op_and_only_it(tmp_path):
    base = simulate(SimConfig(), kernel_overhead_us=0.0)
    path = _write(tmp_path, "p.json", _measured(**{"attention.sparse": [[1, 0.0], [10000, 0.0]]}))
    fast = simulate(SimConfig(deploy=DeploymentConfig(op_profile=path)), kernel_overhead_us=0.0)
    assert fast.breakdown_us["attention"] == 0.0 < base.breakdown_us["attention"]
    assert fast.breakdown_us["ffn"] == pytest.approx(base.breakdown_us["ffn"])


@pytest.mark.parametrize("content, needle", [
    ("{not json", "not valid JSON"),
    ({"format": "other/9", "hardware": "h200", "constants": {}}, "format"),
    ({"format": FORMAT, "constants": {"gemm_mem_eff": {"value": 1}}}, "hardware"),
    ({"format": FORMAT, "hardware": "h200", "constants": {"gemm_mem_eff": {"value": 0.7}}}, "constants lack"),
    ({"format": FORMAT, "hardware": "h200", "base": "h200_published",
      "tables": {"attention.sparse": {"x_unit": "tokens", "points": [[1, 2]]}}}, "model.shape"),
    ({"format": FORMAT, "hardware": "h200", "base": "nope"}, "base"),
    (_measured(**{"attention.sparse": [[1, -2]]}), ">= 0"),
    (_measured(**{"attention.sparse": [["a", 2]]}), "numbers"),
    ({"format": FORMAT, "hardware": "h200"}, "neither constants nor tables"),
])
def test_bad_profiles_are_refused_naming_the_flag(tmp_path, content, needle):
    path = _write(tmp_path, "bad.json", content)
    with pytest.raises(SimConfigError, match="--op-profile") as e:
        OpProfile.load(path)
    assert needle in str(e.value)


def test_missing_file():
    with pytest.raises(SimConfigError, match="no such file"):
        OpProfile.load("/no/such/profile.json")


def test_tables_at_other_shapes_or_hardware_are_refused(tmp_path):
    tiny = ModelSpec.load("tiny_dsv32")
    d = _measured(**{"attention.sparse": [[1, 2.0]]})
    d["model"] = {"name": "tiny_dsv32", "shape": tiny.shape_signature()}
    p = OpProfile.load(_write(tmp_path, "tiny.json", d))
    with pytest.raises(SimConfigError, match="--model") as e:
        p.check(M, get_hardware("h200"))
    assert "hidden 128 vs 7168" in str(e.value)
    p2 = OpProfile.load(_write(tmp_path, "h200.json", _measured(**{"attention.sparse": [[1, 2.0]]})))
    p2.check(M, get_hardware("h200"))
    with pytest.raises(SimConfigError, match="--hardware"):
        p2.check(M, get_hardware("h100"))


def test_wrong_x_unit_is_refused(tmp_path):
    d = _measured()
    d["tables"]["indexer.score"] = {"x_unit": "tokens", "points": [[1, 2.0]]}
    with pytest.raises(SimConfigError, match="token_keys"):
        simulate(SimConfig(deploy=DeploymentConfig(op_profile=_write(tmp_path, "u.json", d))), kernel_overhead_us=0)


def test_a_profile_without_constants_must_cover_every_op(tmp_path):
    d = _measured(**{"attention.sparse": [[1, 2.0]]})
    d.pop("base")
    cfg = SimConfig(deploy=DeploymentConfig(op_profile=_write(tmp_path, "nobase.json", d)))
    with pytest.raises(SimConfigError, match="no table for op"):
        simulate(cfg, kernel_overhead_us=0.0)


def test_measured_cpu_profile_simulates_the_tiny_model_when_present():
    from pathlib import Path
    path = Path(__file__).resolve().parents[3] / "bench" / "results" / "ops_cpu.json"
    if not path.exists():
        pytest.skip("bench/results/ops_cpu.json not written yet (python -m bench ops)")
    cfg = SimConfig(DeploymentConfig(hardware="cpu", model="tiny_dsv32", op_profile=str(path), nodes=1,
                                     gpus_per_node=1, ep=1, tbo=False),
                    WorkloadConfig(context_tokens=2048, mtp=1, batch=4))
    res = simulate(cfg)
    prof = OpProfile.load(str(path))
    assert res.kernels_per_step > 0 and res.step_us > 0
    assert res.breakdown_us["kernel_overhead"] == 0.0    # not fitted for this model: tables carry launch cost
    assert set(prof.tables) >= {"attention.sparse", "indexer.score", "moe.experts_up", "head.lm"}
