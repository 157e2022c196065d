import pytest

from sgl_ess.sim.calibrate import (calibration_rows, calibration_table, fit, row_config, section3_overlap_check,
                                   stored_fit)
from sgl_ess.sim.config import DeploymentConfig, EssConfig, SimConfig, WorkloadConfig
from sgl_ess.sim.constants import all_constants
from sgl_ess.sim.step import simulate


def test_calibration_rows_within_5pct():
    rows = calibration_rows()
    assert [r["batch"] for r in rows] == [52, 160]
    for row in rows:
        res = simulate(row_config(row))          # check=True: the paper's batches must fit
        assert res.tokens_per_s_per_node == pytest.approx(row["tokens_per_s"], rel=0.05)
        assert res.otps == pytest.approx(row["otps"], rel=0.05)
    a, b = (simulate(row_config(r)).tokens_per_s_per_node for r in rows)
    assert b / a - 1 == pytest.approx(0.694, abs=0.05 * 0.694)


def test_stored_constants_are_what_the_fit_gives():
    f, s = fit(), stored_fit()
    assert s.compute_efficiency == pytest.approx(f.compute_efficiency, rel=0.01)
    assert s.layer_overhead_us == pytest.approx(f.layer_overhead_us, rel=0.01)
    assert s.non_cache_reserve_gb <= f.non_cache_reserve_gb


def test_every_constant_is_documented():
    consts = all_constants()
    fitted = {k for k, v in consts.items() if v["kind"] == "fitted"}
    assert fitted == {"compute_efficiency", "layer_overhead_us", "non_cache_reserve_GB"}
    for name, v in consts.items():
        assert v["kind"] in ("fitted", "prior", "paper") and v["meaning"], name


def test_figure1_predictions_are_reported_and_sane():
    fig = [r for r in calibration_table() if r["set"].startswith("figure1")]
    assert [r["batch"] for r in fig] == [52, 128, 256, 320]
    for r in fig:
        assert abs(r["error_pct"]) < 20      # predictions, not tuned; README lists the errors
    tps = [r["sim_tokens_per_s"] for r in fig]
    assert tps == sorted(tps)


def test_section3_overlap_prediction_ordering():
    s = section3_overlap_check()
    assert s["none"]["sim_us"] == pytest.approx(675, rel=0.01)
    assert s["none"]["sim_us"] > s["da"]["sim_us"] > s["dba"]["sim_us"]


def _gain(ctx: int, mtp: int = 2, accept=1.7) -> float:
    def at(r):
        probe = simulate(SimConfig(DeploymentConfig(), WorkloadConfig(context_tokens=ctx, mtp=mtp, accept=accept,
                                                                      batch=1), EssConfig(ratio=r)), check=False)
        b = probe.memory.max_batch
        return simulate(SimConfig(DeploymentConfig(), WorkloadConfig(context_tokens=ctx, mtp=mtp, accept=accept,
                                                                     batch=b), EssConfig(ratio=r)))
    return at(0.21).tokens_per_s_per_node / at(1.0).tokens_per_s_per_node - 1


def test_128k_gain_exceeds_32k_gain_and_is_near_paper():
    g32, g128 = _gain(32768), _gain(131072)
    assert g128 > g32 > 0
    assert g128 == pytest.approx(1.23, rel=0.15)      # paper: +123% at 128K


def test_mtp4_prediction_is_sane():
    cfg2 = SimConfig(DeploymentConfig(), WorkloadConfig(mtp=2, accept=1.7, batch=52), EssConfig())
    cfg4 = SimConfig(DeploymentConfig(), WorkloadConfig(mtp=4, batch=52), EssConfig())
    r2, r4 = simulate(cfg2), simulate(cfg4)
    assert cfg4.work.accept_tokens == pytest.approx(1 + 0.7 + 0.49 + 0.343)
    assert r4.step_us > r2.step_us and r4.otps > r2.otps


def test_throughput_monotone_in_batch_when_unconstrained():
    tps = [simulate(SimConfig(work=WorkloadConfig(batch=b)), check=False).tokens_per_s_per_node
           for b in (8, 16, 32, 64, 128, 256, 320)]
    assert all(b > a for a, b in zip(tps, tps[1:]))


def test_slower_pcie_and_no_overlap_cost_throughput():
    def tps(**ess):
        return simulate(SimConfig(work=WorkloadConfig(batch=160), ess=EssConfig(ratio=0.21, **ess))).tokens_per_s_per_node
    assert tps(pcie_h2d_gibps=8) < tps(pcie_h2d_gibps=37)
    assert tps(overlap="none") < tps(overlap="da") <= tps(overlap="full") + 1e-6
    assert tps(transfer="memcpy") < tps()
