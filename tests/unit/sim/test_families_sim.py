"""Every supported model family in the simulator: layer counts, row bytes, index keys only on anchor layers,
LongCat-Flash's two attention sub-layers, Hunyuan V4's sinks. Hand-computed cases and monotonicity only."""
import pytest

from sgl_ess.sim.config import DeploymentConfig, ModelSpec, OffloadConfig, SimConfig, WorkloadConfig
from sgl_ess.sim.launches import launches_per_step
from sgl_ess.sim.memory import gpu_bytes_per_request, host_bytes_per_request, weight_bytes_per_gpu
from sgl_ess.sim.ops import attention_ops, layer_ops
from sgl_ess.sim.step import simulate


def cfg(model, batch=8, ratio=1.0, context=32768):
    return SimConfig(DeploymentConfig(model=model, nodes=1, ep=8), WorkloadConfig(context_tokens=context, batch=batch),
                     OffloadConfig(ratio=ratio))


def test_longcat_has_two_attention_layers_per_decoder_layer():
    m = ModelSpec.load("longcat")
    assert m.num_layers == 28 and m.attention_sublayers == 2 and m.cached_layers == 2 * 28 + 1
    assert list(m.cached_of(0)) == [0, 1] and list(m.cached_of(27)) == [54, 55] and list(m.cached_of(28)) == [56]
    w, e = WorkloadConfig(context_tokens=32768), OffloadConfig(ratio=0.25)
    # by hand: every one of the 57 attention layers keeps 32768 x 132 B of index keys and 8192 x 656 B of hot rows
    assert gpu_bytes_per_request(m, w, e) == 32768 * 132 * 57 + 8192 * 656 * 57
    assert host_bytes_per_request(m, w, e) == 32768 * 656 * 57
    names = [op.name for op in layer_ops(m, 4, 1, 8192, False, 8)]
    assert names.count("attention.sparse") == 2 and names.count("indexer.score") == 2
    assert names.count("ffn.up") == 2 and names.count("moe.experts_up") == 1       # two dense MLPs + the MoE
    mtp = [op.name for op in layer_ops(m, 4, 1, 8192, False, 8, mtp=True)]
    assert mtp.count("attention.sparse") == 1 and "moe.experts_up" not in mtp and "ffn.up" in mtp


def test_longcat_weights_count_the_dense_mlps():
    m = ModelSpec.load("longcat")
    d = DeploymentConfig(model="longcat", nodes=1, ep=8)
    w = weight_bytes_per_gpu(m, d)
    # routed experts: 28 MoE layers (the NextN layer has a dense MLP) x 512 / 8 local experts x 3 x 6144 x 2048 B
    assert w.routed_bytes == 28 * 64 * 3 * 6144 * 2048


def test_hyv4_sinks_add_a_small_attention_op_and_anchor_layers_keep_the_index_keys():
    h = ModelSpec.load("hyv4")
    assert h.attention_sinks and h.num_layers == 34 and h.cached_layers == 35
    # indexer_types default: 'full' at layer 0 and layers 1, 5, ..., 33 -> 10 anchors (+ the MTP layer's own)
    assert sum(h.is_anchor(i) for i in range(34)) == 10 and h.is_anchor(34) and h.index_layers == 11
    ops = attention_ops(h, 4, 1, 8192)
    sink = [op for op in ops if op.name == "attention.sinks"]
    assert len(sink) == 1 and sink[0].hbm_bytes > 0
    assert "attention.sinks" not in {op.name for op in attention_ops(ModelSpec.load("glm_5"), 4, 1, 8192)}
    w, e = WorkloadConfig(context_tokens=32768), OffloadConfig(ratio=0.25)
    assert gpu_bytes_per_request(h, w, e) == 32768 * 132 * 11 + 8192 * 656 * 35


@pytest.mark.parametrize("model", ["deepseek_v32_exp", "glm_5", "glm_5_2", "hyv4", "longcat_flash_dsa"])
def test_every_family_simulates_and_counts_its_launches(model):
    off = simulate(cfg(model), check=False)
    assert off.kernels_per_step == launches_per_step(cfg(model)).total
    on = simulate(cfg(model, ratio=0.25), check=False)
    assert on.kernels_per_step > off.kernels_per_step and on.step_us > 0
    more = simulate(cfg(model, batch=16), check=False)
    assert more.step_us > off.step_us                 # a larger batch takes longer per step

