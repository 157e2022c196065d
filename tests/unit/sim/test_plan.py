"""The capacity planner: sizes by hand, and which resource binds in cases built to make one bind."""
import math
from dataclasses import replace

import pytest

from sgl_ess.sim.config import DeploymentConfig, SimConfig, SimConfigError, WorkloadConfig
from sgl_ess.sim.planner import plan, sizes
from sgl_ess.sim.step import simulate


def work(context=32768):
    return WorkloadConfig(context_tokens=context, mtp=2, accept=1.7)


def test_sizes_by_hand():
    res = plan(SimConfig(work=work()), ratios=(0.21,), binding=False)
    b = res.best
    s = sizes(b)
    assert s["hot_slots_per_request_layer"] == math.ceil(0.21 * 32768) == 6882
    assert s["hot_buffer_gb_per_gpu"] == pytest.approx(b.cfg.work.batch * 6882 * 656 * 62 / 1e9)
    assert s["indexer_keys_gb_per_gpu"] == pytest.approx(b.cfg.work.batch * 32768 * 132 * 62 / 1e9)
    assert s["host_pool_gb_per_node"] == pytest.approx(b.cfg.work.batch * 8 * 32768 * 656 * 62 / 1e9)
    assert b.cfg.work.batch == b.memory.max_batch_gpu          # no SLO, no host limit: GPU memory stops it


def test_hbm_binds_without_offload():
    res = plan(SimConfig(work=work()), ratios=(1.0,))
    probe = simulate(SimConfig(work=replace(work(), batch=1)), check=False)
    assert res.best.cfg.work.batch == probe.memory.max_batch       # no SLO: the largest batch that fits
    assert res.binding == "HBM" and res.relief_gain["HBM"] > 0


def test_host_memory_binds_when_small():
    d = DeploymentConfig(host_mem_gb=200.0)          # 200 GB / (8 x 1.333 GB) = 18 requests per GPU
    res = plan(SimConfig(deploy=d, work=work()), ratios=(0.21,))
    assert res.best.cfg.work.batch == 18 == res.best.memory.max_batch_host
    assert res.binding == "host memory"


def test_compute_binds_under_a_tight_slo():
    res = plan(SimConfig(work=work()), slo_tpot_ms=30.0, ratios=(0.21, 1.0))
    assert res.best.tpot_ms <= 30.0
    assert res.binding == "compute" and "SLO" in res.binding_why


def test_bad_plan_inputs():
    with pytest.raises(SimConfigError, match="--slo-tpot-ms"):
        plan(SimConfig(work=work()), slo_tpot_ms=-1)
    with pytest.raises(SimConfigError, match="--ratios"):
        plan(SimConfig(work=work()), ratios=(0.0,))
