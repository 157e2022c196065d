"""Launches from structure, the model families' facts, the calibration's mechanics and the plan CLI's
spellings. Hand-computed cases and monotonicity only; no accuracy is asserted."""
import json

import pytest

from sgl_ess.sim.cli import main
from sgl_ess.sim.commands import parse_gpus
from sgl_ess.sim.config import (DeploymentConfig, ModelSpec, OffloadConfig, SimConfig, SimConfigError,
                                WorkloadConfig)
from sgl_ess.sim.launches import launch_us, launches_per_step, layer_kernels
from sgl_ess.sim.memory import gpu_bytes_per_request
from sgl_ess.sim.ops import attention_ops
from sgl_ess.sim.plan_curves import batch_grid
from sgl_ess.sim.step import simulate


def cfg(model="deepseek_v32_exp", batch=52, mtp=2, tbo=True, ratio=1.0, graph=True, context=32768):
    return SimConfig(DeploymentConfig(model=model, tbo=tbo, cuda_graph=graph),
                     WorkloadConfig(context_tokens=context, mtp=mtp, accept=1.0 if mtp == 1 else None, batch=batch),
                     OffloadConfig(ratio=ratio))


def test_launch_cost_is_the_published_figure():
    # NVIDIA's CUDA Graphs blog: 2.9 us kernel, 3.4 us per kernel in a graph, 3.8 us back to back on a stream
    assert launch_us(True) == pytest.approx(3.4 - 2.9)
    assert launch_us(False) == pytest.approx(3.8 - 2.9)


def test_launch_count_by_hand():
    m = ModelSpec.load("deepseek_v32_exp")
    c = launches_per_step(cfg(mtp=1))
    per_moe = layer_kernels(m, 26, 1, 32768, False, 32)
    per_dense = layer_kernels(m, 52, 1, 32768, True, 32)
    assert c.micro_batches == 2 and c.mtp_draft == 0
    assert c.moe_layers == 2 * 58 * per_moe and c.dense_layers == 3 * per_dense
    # TBO off: each MoE layer launches once; MTP 3 adds the draft extend and one one-token draft pass
    assert launches_per_step(cfg(mtp=1, tbo=False)).moe_layers == 58 * per_moe
    assert launches_per_step(cfg(mtp=3)).mtp_draft > launches_per_step(cfg(mtp=2)).mtp_draft > 0


@pytest.mark.parametrize("c", [cfg(), cfg(mtp=1, tbo=False), cfg(model="glm_5_2"), cfg(model="deepseek_v3", mtp=1)])
def test_step_counts_the_structural_launches(c):
    res = simulate(c, check=False)
    assert res.kernels_per_step == launches_per_step(c).total     # no ESS: nothing else launches


def test_each_launch_adds_its_gap_to_a_serial_step():
    c = cfg(mtp=1, tbo=False)
    a, b = simulate(c, check=False, kernel_overhead_us=0.0), simulate(c, check=False, kernel_overhead_us=1.0)
    assert b.step_us - a.step_us == pytest.approx(launches_per_step(c).total * 1.0)


def test_graphs_off_costs_more_per_launch_and_scale_lengthens_the_step():
    on, off = simulate(cfg(), check=False), simulate(cfg(graph=False), check=False)
    assert off.kernels_per_step == on.kernels_per_step and off.step_us > on.step_us
    a, b = simulate(cfg(), check=False, kernel_scale=1.0), simulate(cfg(), check=False, kernel_scale=2.0)
    assert b.step_us > a.step_us
    assert b.breakdown_us["ffn"] == pytest.approx(2 * a.breakdown_us["ffn"])      # compute ops scale
    assert b.breakdown_us["kernel_overhead"] == a.breakdown_us["kernel_overhead"]  # launches do not


def test_model_aliases_and_facts():
    assert ModelSpec.load("glm-5.2").name == "glm_5_2" and ModelSpec.load("GLM-5.1").name == "glm_5"
    assert DeploymentConfig(model="v3.2").model == "deepseek_v32_exp"
    g = ModelSpec.load("glm-5.2")
    assert g.num_layers == 78 and sum(g.is_anchor(i) for i in range(78)) == 21 and g.is_anchor(78)
    assert all(g.is_anchor(i) for i in range(g.num_dense_layers))
    assert sum(ModelSpec.load("glm_5").is_anchor(i) for i in range(78)) == 78
    assert ModelSpec.load("deepseek_v3").dense_attention and ModelSpec.load("deepseek_v3").index_layers == 0


def test_shared_index_layers_have_no_indexer_and_no_index_keys():
    g5, g52 = ModelSpec.load("glm_5"), ModelSpec.load("glm_5_2")
    names = {op.name for op in attention_ops(g52, 4, 1, 8192, indexer=False)}
    assert not any(n.startswith("indexer.") for n in names) and "attention.sparse" in names
    w, e = WorkloadConfig(context_tokens=32768), OffloadConfig(ratio=0.25)
    # by hand: 32768 x 132 B of index keys per index layer, 8192 x 656 B of hot slots per cached layer
    assert gpu_bytes_per_request(g52, w, e) == 32768 * 132 * 22 + 8192 * 656 * 79
    assert gpu_bytes_per_request(g5, w, e) == 32768 * 132 * 79 + 8192 * 656 * 79
    s5, s52 = simulate(cfg("glm_5"), check=False), simulate(cfg("glm_5_2"), check=False)
    assert s52.breakdown_us["indexer"] < s5.breakdown_us["indexer"]


def test_dense_model_has_full_context_attention_and_refuses_offload():
    m = ModelSpec.load("deepseek_v3")
    ops = attention_ops(m, 2, 1, 4096)
    dense = next(op for op in ops if op.name == "attention.dense")
    assert dense.hbm_bytes >= 2 * 4096 * 1152 and not any(op.name.startswith("indexer.") for op in ops)
    with pytest.raises(SimConfigError, match="dense MLA"):
        simulate(cfg("deepseek_v3", mtp=1, ratio=0.5, context=8192), check=False)


def test_parse_gpus_and_context_suffix():
    assert parse_gpus("8") == (8, None) and parse_gpus("8xH200") == (8, "h200") and parse_gpus("16x h800") == (16, "h800")
    for bad in ("0", "8xB999", "x8", "eight"):
        with pytest.raises(SimConfigError, match="--gpus"):
            parse_gpus(bad)
    assert batch_grid(1) == [1] and batch_grid(40)[0] == 1 and batch_grid(40)[-1] == 40
    assert batch_grid(40) == sorted(set(batch_grid(40)))


def test_plan_cli_spellings_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    assert main(["plan", "--model", "glm-5.2", "--gpus", "8xH200", "--context", "32k", "--slo-ms", "50",
                 "--host-gb", "2048", "--ratios", "0.25,1.0", "--plot", str(png), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best"]["model"] == "glm_5_2" and out["best"]["context"] == 32768 and out["best"]["hardware"] == "h200"
    assert out["best"]["tpot_ms"] <= 50 and png.stat().st_size > 10_000
    on = next(c for c in out["curves"] if c["ratio"] < 1.0)
    assert {"GPU memory", "host memory", "TPOT SLO 50 ms"} <= set(on["limits"])
    assert on["limits"]["TPOT SLO 50 ms"] >= out["best"]["batch"]
    # 2048 GB per node over 8 GPUs, 32768 x 656 B x 79 layers per request: the host limit by hand
    assert on["limits"]["host memory"] == int(2048e9 / 8 // (32768 * 656 * 79))
    assert main(["plan", "--gpus", "8xH200", "--hardware", "h800"]) == 2
