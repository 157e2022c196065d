"""The step model's mechanics: units, launch accounting, TBO, MTP passes, ESS costs, monotonicity."""
from dataclasses import replace

import pytest

from sgl_ess.sim.config import DeploymentConfig, OffloadConfig, SimConfig, SimConfigError, WorkloadConfig
from sgl_ess.sim.overlap import DA_EXTRA_KERNELS, DBA_EXTRA_KERNELS
from sgl_ess.sim.step import ESS_LAUNCHES, micro_batches, simulate


def cfg(batch=52, ratio=1.0, mtp=2, accept=1.7, context=32768, **deploy):
    return SimConfig(DeploymentConfig(**deploy), WorkloadConfig(context_tokens=context, mtp=mtp, accept=accept,
                                                                batch=batch), OffloadConfig(ratio=ratio))


def test_units_of_throughput():
    r = simulate(cfg(), check=False)
    assert r.otps == pytest.approx(1.7 / (r.step_us * 1e-6))
    assert r.tokens_per_s_per_node == pytest.approx(8 * 52 * 1.7 / (r.step_us * 1e-6))
    assert r.tpot_ms == pytest.approx(r.step_us / 1e3 / 1.7)
    assert sum(r.breakdown_us.values()) == pytest.approx(r.step_us)


def test_launch_overhead_is_linear_in_launches_without_overlap():
    # with TBO off nothing overlaps, so every launch adds exactly its overhead
    a = simulate(cfg(tbo=False), check=False, kernel_overhead_us=0.0)
    b = simulate(cfg(tbo=False), check=False, kernel_overhead_us=10.0)
    assert b.step_us - a.step_us == pytest.approx(10.0 * a.kernels_per_step)
    assert a.kernels_per_step == b.kernels_per_step
    # with TBO, longer stages can only hide more of the all-to-alls
    c = simulate(cfg(), check=False, kernel_overhead_us=0.0)
    d = simulate(cfg(), check=False, kernel_overhead_us=10.0)
    assert 0 < d.step_us - c.step_us <= 10.0 * c.kernels_per_step + 1e-6
    assert d.breakdown_us["comm_exposed"] <= c.breakdown_us["comm_exposed"]


def test_tbo_hides_communication():
    on = simulate(cfg(), check=False, kernel_overhead_us=0.0)
    off = simulate(cfg(tbo=False), check=False, kernel_overhead_us=0.0)
    assert micro_batches(52, True) == [26, 26] and micro_batches(53, True) == [27, 26]
    assert micro_batches(52, False) == [52]
    assert off.step_us > on.step_us


def test_mtp_passes():
    one = simulate(cfg(mtp=1, accept=1.0), check=False, kernel_overhead_us=0.0)
    two = simulate(cfg(mtp=2), check=False, kernel_overhead_us=0.0)
    three = simulate(cfg(mtp=3, accept=2.0), check=False, kernel_overhead_us=0.0)
    assert one.breakdown_us["mtp_draft"] == 0.0 < two.breakdown_us["mtp_draft"] < three.breakdown_us["mtp_draft"]
    # MTP 3 adds one one-token draft pass to MTP 2's draft extend
    assert three.kernels_per_step > two.kernels_per_step > one.kernels_per_step
    assert cfg(mtp=4, accept=None).work.accept_tokens == pytest.approx(1 + 0.7 + 0.49 + 0.343)


def test_ess_launches_are_counted_per_layer_and_strategy():
    base = simulate(cfg(batch=160), check=False, kernel_overhead_us=0.0)
    ess = simulate(cfg(batch=160, ratio=0.21), check=False, kernel_overhead_us=0.0)
    extra = {"da": DA_EXTRA_KERNELS, "dba": DBA_EXTRA_KERNELS, "none": 0}
    per = sum(n * (ESS_LAUNCHES + 1 + extra[s]) for s, n in ess.strategies.items())   # +1: the resolve op
    # 58 MoE layers in two micro-batches; the 3 dense layers and the MTP draft extend on the whole batch
    assert sum(ess.strategies.values()) == 2 * 58 + 3 + 1
    assert ess.kernels_per_step - base.kernels_per_step == per


def test_monotone_in_batch_and_transfer_knobs():
    tps = [simulate(cfg(batch=b), check=False).tokens_per_s_per_node for b in (8, 16, 32, 64, 128, 256, 320)]
    assert all(b > a for a, b in zip(tps, tps[1:]))
    steps = [simulate(cfg(batch=b), check=False).step_us for b in (8, 16, 32, 64, 128, 256, 320)]
    assert steps == sorted(steps)

    def t(**ess):
        c = cfg(batch=160, ratio=0.21)
        return simulate(replace(c, ess=replace(c.ess, **ess)), check=False).tokens_per_s_per_node
    assert t(pcie_h2d_gbps=4) < t(pcie_h2d_gbps=37)
    assert t(overlap="none") < t(overlap="da") <= t(overlap="full") + 1e-6
    assert t(transfer="memcpy") < t()
    assert t(hit_rate=0.8) < t(hit_rate=0.99)


def test_longer_context_costs_more_and_ratio_below_topk_is_refused():
    assert simulate(cfg(context=131072, batch=13), check=False).step_us > simulate(cfg(batch=13),
                                                                                  check=False).step_us
    with pytest.raises(SimConfigError, match="--ratio"):
        simulate(cfg(ratio=0.05))


def test_batch_that_does_not_fit_is_refused_unless_unchecked():
    with pytest.raises(SimConfigError, match="largest batch that fits"):
        simulate(cfg(batch=500))
    assert simulate(cfg(batch=500), check=False).step_us > 0


def test_model_without_mtp_layer_refuses_mtp():
    with pytest.raises(SimConfigError, match="--mtp 1"):
        simulate(cfg(model="tiny_dsv32", mtp=2), check=False)
