"""The protocol's mechanics: the step-time fit reads DeepSeek's measured decode deployment and nothing
else; the stored constants are what the fit gives; the validation report covers every held-out point,
names its source and says per point whether it is covered. No accuracy is asserted."""
import copy

import pytest

from sgl_ess.sim import fit as fitmod
from sgl_ess.sim.config import load_data
from sgl_ess.sim.constants import all_constants
from sgl_ess.sim.step import simulate
from sgl_ess.sim.validate import Check, checks, worst

PUB = load_data("calibration.json")


def test_only_the_two_table2_rows_we_were_given_exist_in_the_data():
    rows = PUB["table2_calibration_rows"]
    assert [(r["batch"], r["ratio"]) for r in rows] == [(52, 1.0), (160, 0.21)]


def test_calibration_target_is_the_measured_step():
    pt = fitmod.calibration_point()
    assert pt["simulated"] is False and pt["model"] == "deepseek_v3" and pt["ep"] == 128
    # 128 requests per GPU, one token each per step, at 2,324 tok/s per GPU
    assert fitmod.calibration_target_us() == pytest.approx(128 / 2324 * 1e6)


def test_fit_reproduces_its_point_to_the_solver_precision():
    scale = fitmod.fit_kernel_scale()
    res = simulate(fitmod.calibration_config(), check=False, kernel_scale=scale)
    # the scale is rounded to 1e-4 of a ~1.2 factor on a ~55 ms step: well under 0.01 ms
    assert res.step_us == pytest.approx(fitmod.calibration_target_us(), abs=10.0)


def test_fit_ignores_every_paper_number(monkeypatch):
    before = fitmod.fit_kernel_scale()
    pub = copy.deepcopy(PUB)
    for r in pub["table2_calibration_rows"]:
        r.update(tokens_per_s=1.0)
    for p in pub["figure1_throughput_vs_batch_32k_mtp2_unconstrained_memory"]:
        p["tokens_per_s"] *= 3
    pub["section3_overlap_overhead_us"].update(none=1, da=1, dba=1)
    monkeypatch.setattr(fitmod, "published", lambda: pub)
    assert fitmod.fit_kernel_scale() == before


def test_fit_follows_the_calibration_point(monkeypatch):
    scale = fitmod.fit_kernel_scale()
    slower = dict(fitmod.calibration_point(), tokens_per_s_per_gpu=2000)
    monkeypatch.setattr(fitmod, "calibration_point", lambda: slower)
    assert fitmod.fit_kernel_scale() > scale          # a slower deployment means slower kernels


def test_stored_fitted_constants_are_current():
    assert fitmod.stored_fit() == fitmod.fitted_now()


def test_every_constant_is_documented_and_only_one_is_fitted():
    consts = all_constants()
    assert {k for k, v in consts.items() if v["kind"] == "fitted"} == {"kernel_time_scale"}
    # the GPU reserve is SGLang's floor on a > 60 GiB GPU (10 GiB) + DeepEP's decode-graph buffers (2 GiB)
    assert consts["non_cache_reserve_GB"]["value"] == round(12 * 1024 ** 3 / 1e9, 3)
    assert "kernel_overhead_us" not in consts             # the launch gap is a published figure now
    for name, v in consts.items():
        assert v["kind"] in ("paper", "prior", "fitted", "published") and v["source"] and v["meaning"] and v["unit"], name


def test_validation_covers_every_held_out_point_and_names_sources():
    rows = checks()
    names = " | ".join(r.point for r in rows)
    assert "row 1" in names and "row 2" in names and "gain, row 2 over row 1" in names and "128K gain" in names
    assert [r.published for r in rows if r.point.startswith("Figure 1")] == [16000, 20600, 22300]
    assert sorted(r.published for r in rows if r.metric == "overlap") == [155, 423, 675]
    assert all(r.source for r in rows)
    assert all(r.simulated_source for r in rows if "ESS paper" in r.source)      # the paper's numbers are simulated
    assert all(r.reason for r in rows if not r.covered)                          # every uncovered point says why
    assert any("HiSparse" in r.point for r in rows) and any("DeepSeek-V3 production" in r.point for r in rows)
    assert all(r.published != 2324 for r in rows)                                # the calibration point is not held out
    # the coverage rule: a covered row is a measurement, or a memory fact (arithmetic of shapes and memory)
    assert all(not r.simulated_source or r.metric == "memory" for r in rows if r.covered)
    assert all(not r.covered for r in rows if r.simulated_source and r.metric != "memory")
    assert any(r.point.startswith("Memory: largest batch at 32K, r=1.0") and r.covered for r in rows)
    w = worst(rows)
    assert set(w) == {r.metric for r in rows if r.covered and r.simulated is not None}
    for metric, c in w.items():
        assert c.covered
        assert abs(c.error) == max(abs(r.error) for r in rows if r.metric == metric and r.covered)


def test_error_definitions():
    assert Check("a", "throughput", 100.0, 110.0, "", "").error == pytest.approx(10.0)
    assert Check("a", "gain", 69.4, 84.1, "", "").error == pytest.approx(14.7)
    assert Check("a", "gain", 69.4, 84.1, "", "").error_text == "+14.7 pt"
    assert Check("a", "throughput", 100.0, 109.0, "", "").within_goal is True
    assert Check("a", "throughput", 100.0, 111.0, "", "").within_goal is False
    assert Check("a", "gain", 50.0, 61.0, "", "", covered=False, reason="r").within_goal is None
    assert Check("a", "throughput", 100.0, None, "", "").error_text == "-"
