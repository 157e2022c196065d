"""The protocol's mechanics: the fit uses the first Table 2 row and nothing else; the stored constants
are what the fit gives; the validation report covers every held-out point. No accuracy is asserted."""
import copy

import pytest

from sgl_ess.sim import fit as fitmod
from sgl_ess.sim.config import load_data
from sgl_ess.sim.constants import all_constants
from sgl_ess.sim.profile import OpProfile
from sgl_ess.sim.step import simulate
from sgl_ess.sim.validate import checks, worst

PUB = load_data("calibration.json")


def test_only_the_two_table2_rows_we_were_given_exist_in_the_data():
    rows = PUB["table2_calibration_rows"]
    assert [(r["batch"], r["ratio"]) for r in rows] == [(52, 1.0), (160, 0.21)]


def test_fit_reproduces_its_row_to_the_solver_precision():
    row = fitmod.fit_row()
    ko = fitmod.fit_kernel_overhead(OpProfile.load())
    res = simulate(fitmod.row_config(row), check=False, kernel_overhead_us=ko)
    # bisection to 1e-3 us per launch x ~4000 launches: a few us of a ~73 ms step
    assert res.step_us == pytest.approx(fitmod.target_step_us(row), abs=5.0)


def _with_published(monkeypatch, edit):
    pub = copy.deepcopy(PUB)
    edit(pub)
    monkeypatch.setattr(fitmod, "published", lambda: pub)
    fitmod._cached.cache_clear()


def test_fit_ignores_every_held_out_number(monkeypatch):
    before = (fitmod.fit_kernel_overhead(OpProfile.load()), fitmod.fit_reserve())

    def scramble(pub):
        pub["table2_calibration_rows"][1].update(tokens_per_s=1.0, batch=7, otps=0.1)
        for p in pub["figure1_throughput_vs_batch_32k_mtp2_unconstrained_memory"]:
            p["tokens_per_s"] *= 3
        pub["section3_overlap_overhead_us"].update(none=1, da=1, dba=1)
        pub["other_published"]["gain_128k_pct"] = 1
    _with_published(monkeypatch, scramble)
    assert (fitmod.fit_kernel_overhead(OpProfile.load()), fitmod.fit_reserve()) == before
    fitmod._cached.cache_clear()


def test_fit_follows_the_first_row(monkeypatch):
    ko = fitmod.fit_kernel_overhead(OpProfile.load())
    _with_published(monkeypatch, lambda pub: pub["table2_calibration_rows"][0].update(tokens_per_s=9000.0))
    assert fitmod.fit_kernel_overhead(OpProfile.load()) > ko          # a slower row needs more per launch
    fitmod._cached.cache_clear()


def test_stored_fitted_constants_are_current():
    assert fitmod.stored_fit() == fitmod.fitted_now()


def test_every_constant_is_documented_and_only_two_are_fitted():
    consts = all_constants()
    assert {k for k, v in consts.items() if v["kind"] == "fitted"} == {"kernel_overhead_us", "non_cache_reserve_GB"}
    for name, v in consts.items():
        assert v["kind"] in ("paper", "prior", "fitted") and v["source"] and v["meaning"] and v["unit"], name


def test_validation_covers_every_held_out_point_and_no_fitted_one():
    rows = checks()
    names = " | ".join(r.point for r in rows)
    assert "row 2" in names and "gain, row 2 over row 1" in names and "128K gain" in names
    assert [r.published for r in rows if r.point.startswith("Figure 1")] == [16000, 20600, 22300]
    assert sorted(r.published for r in rows if r.metric == "overlap") == [155, 423, 675]
    assert all(r.published != 9647.71 and "batch 52," not in r.point for r in rows)
    w = worst(rows)
    assert set(w) == {"throughput", "gain", "overlap", "memory"}
    for metric, c in w.items():
        assert abs(c.error) == max(abs(r.error) for r in rows if r.metric == metric)


def test_error_definitions():
    from sgl_ess.sim.validate import Check
    assert Check("a", "throughput", 100.0, 110.0, "", "").error == pytest.approx(10.0)
    assert Check("a", "gain", 69.4, 84.1, "", "").error == pytest.approx(14.7)
    assert Check("a", "gain", 69.4, 84.1, "", "").error_text == "+14.7 pt"
