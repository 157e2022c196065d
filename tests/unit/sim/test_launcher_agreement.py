"""`sim plan`'s launch flags give the numbers the launcher's --ess-explain prints for the same flags: tokens
per host pool, host pools and host bytes per node, hot slots per request per layer, request rows, and the
ESS store's device bytes per GPU, total and by tensor (issue 36, item 4).

Each case builds the sim's host-pool report and launch plan, then has the launcher handle ``--model-path DIR
<the plan's flags> --ess-explain --ess-explain-device cuda:8:141:4096`` (an 8 x H200 node with 4096 GiB of
host memory; preflight only: nothing loads, no server starts) on a config.json with the model's real
geometry (sgl_ess/sim/data/model_<name>.json on the embedded tiny config's keys), and compares the exact
byte counts explain prints. All cases run in ONE child process (launcher_explain.py: the launcher's
main() per case, its stdout captured), so the launcher and SGLang's flags are imported once.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from sgl_ess.models import TINY_DSV32_DIR
from sgl_ess.sim.config import DeploymentConfig, ModelSpec, ServingLayoutConfig, load_data
from sgl_ess.sim.host_pools import host_pool_report
from sgl_ess.sim.launch_flags import launch_plan
from sgl_ess.sim.store_device import lru_tables

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NODE = ["--ess-explain", "--ess-explain-device", "cuda:8:141:4096"]
MODELS = os.path.dirname(TINY_DSV32_DIR)
TINY = {"deepseek_v32_exp": TINY_DSV32_DIR, "glm_5_2": os.path.join(MODELS, "tiny_glm5"),
        "longcat_flash_dsa": os.path.join(MODELS, "tiny_longcat"), "hyv4": os.path.join(MODELS, "tiny_hyv4")}
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher_explain.py")

# (model, serving layout, batch per GPU, ratio, context, mtp: tokens verified per step, 1 = no MTP)
CASES = {
    "v32_dp8_fp8": ("deepseek_v32_exp", ServingLayoutConfig(kv_cache_dtype="fp8_e4m3"), 54, 0.1, 32768, 1),
    # MTP: 2 draft tokens' scratch rows per request row (the hot buffer holds 2 x topk)
    "v32_dp8_fp8_mtp2": ("deepseek_v32_exp", ServingLayoutConfig(kv_cache_dtype="fp8_e4m3"), 32, 0.2, 65536, 2),
    "glm52_tp8_bf16_shared": ("glm_5_2", ServingLayoutConfig(tp=8, kv_cache_dtype="bf16", share_host_pool="shared"),
                              6, 0.25, 131072, 1),
    # LongCat-Flash: two attention sub-layers per decoder layer, so the host pool has 2 x 28 layers
    "longcat_dp8_fp8": ("longcat_flash_dsa", ServingLayoutConfig(kv_cache_dtype="fp8_e4m3"), 16, 0.2, 65536, 1),
    # Hunyuan V4: shared-index layers; MTP 4 with 4 x topk > hot slots: scratch rows for the union's overflow
    "hyv4_dp8_fp8_mtp4": ("hyv4", ServingLayoutConfig(kv_cache_dtype="fp8_e4m3"), 24, 0.2, 32768, 4),
}
# shared-index models: the store keeps one LRU table per anchor layer (StoreConfig.layer_anchors)
SHARED_INDEX = {n for n, c in CASES.items() if ModelSpec.load(c[0]).index_anchor_layers > 0}


def real_config(model: str) -> dict:
    with open(os.path.join(TINY[model], "config.json")) as fh:
        cfg = json.load(fh)
    real = load_data(f"model_{model}.json")
    out = {k: real.get(k, v) for k, v in cfg.items()}
    if "num_layers" in cfg:                      # LongcatFlashConfig's own name for num_hidden_layers
        out["num_layers"] = real["num_hidden_layers"]
    m = ModelSpec.load(model)
    for key in ("layer_types", "mlp_layer_types"):   # per-layer lists (Hunyuan V4): the real layer count
        if key in cfg:
            out[key] = [cfg[key][0] if i < m.num_dense_layers else cfg[key][-1] for i in range(m.num_layers)]
    if "cli_factor" in cfg:                      # LongCat: the simulator's model runs an indexer in every layer
        out["cli_factor"] = real.get("cli_factor", 1)
    if "indexer_types" in cfg:
        out["indexer_types"] = ["full" if m.is_anchor(i) else "shared" for i in range(m.num_layers)]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    plans, argvs = {}, {}
    for name, (model, serving, batch, ratio, ctx, mtp) in CASES.items():
        d = tmp_path_factory.mktemp(name)
        (d / "config.json").write_text(json.dumps(real_config(model)))
        deploy = DeploymentConfig(model=model, nodes=1, ep=8)
        rep = host_pool_report(serving, deploy, batch * ctx, f"batch {batch} x context {ctx}")
        plans[name] = (launch_plan(rep, ModelSpec.load(model), batch, ratio, ctx, mtp), rep)
        argvs[name] = ["--model-path", str(d), *plans[name][0].argv, *NODE]
    io = tmp_path_factory.mktemp("explain")
    (io / "argv.json").write_text(json.dumps(argvs))
    p = subprocess.run([sys.executable, DRIVER, str(io / "argv.json"), str(io / "out.json")], cwd=REPO,
                       capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads((io / "out.json").read_text())
    return {name: (*plans[name], *results[name]) for name in CASES}


def _bytes(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in:\n{text}"
    return int(m.group(1))


@pytest.mark.parametrize("name", list(CASES))
def test_plan_flags_give_the_same_numbers_as_ess_explain(runs, name):
    lp, rep, rc, out, err = runs[name]
    assert rc == 0, err[-3000:]
    m = ModelSpec.load(CASES[name][0])
    assert rep.layers == m.num_layers * m.attention_sublayers
    assert f"{rep.layers} layers, latent row {rep.row_bytes} B" in out          # the same geometry and row
    assert _bytes(r"host pool per node: [0-9.]+ GB \((\d+) B\)", out) == lp.host_bytes_per_node
    assert _bytes(r"= (\d+) host pool\(s\) per node", out) == lp.pools_per_node
    assert _bytes(r"host pool per pool: (\d+) tokens", out) == lp.tokens_per_pool
    assert _bytes(r"hot slots per request: (\d+) per layer", out) == lp.hot_slots_per_request
    assert _bytes(r"for (\d+) request rows", out) == lp.max_running_requests // (rep.layout.dp if rep.layout.dp_attention
                                                                                else 1) + 1
    assert _bytes(r"for (\d+) request rows", out) == lp.request_rows


def _by_tensor(out: str) -> dict[str, int]:
    line = next((ln for ln in out.splitlines() if ln.strip().startswith("by tensor:")), None)
    assert line, out
    return {k: int(v) for k, v in re.findall(r"(\w+) [0-9.]+ [MG]B \((\d+) B\)", line)}


@pytest.mark.parametrize("name", list(CASES))
def test_plan_device_bytes_per_gpu_equal_ess_explain(runs, name):
    """The ESS store's device bytes per GPU, total and every tensor, as explain prints them."""
    lp, rep, rc, out, err = runs[name]
    assert rc == 0, err[-3000:]
    assert _by_tensor(out) == {k: v for k, v in lp.device_allocation if v}
    assert _bytes(r"device bytes per GPU \(ESS store\): [0-9.]+ [MG]B \((\d+) B\)", out) == lp.device_bytes_per_gpu


@pytest.mark.parametrize("name", sorted(SHARED_INDEX))
def test_shared_index_lru_tables_one_per_anchor_or_per_layer_with_mtp(runs, name):
    """A shared-index model's LRU state in explain (the launcher's StoreConfig with the scheduler's
    layer_anchors): one table per anchor layer without MTP (GLM-5.2 here), one per layer with it (Hunyuan V4,
    MTP 4: --speculative-algorithm drops the groups)."""
    lp, rep, rc, out, err = runs[name]
    assert rc == 0, err[-3000:]
    m, mtp = ModelSpec.load(CASES[name][0]), CASES[name][5]
    per_table = (lp.request_rows + 1) * lp.hot_slots_per_request * 12
    tables = rep.layers if mtp > 1 else m.index_anchor_layers
    assert m.index_anchor_layers < rep.layers and lru_tables(m, mtp) == tables
    assert _by_tensor(out)["lru_state"] == tables * per_table


def test_the_shared_index_cases_cover_both_rules():
    assert {CASES[n][5] > 1 for n in SHARED_INDEX} == {False, True}


def test_mtp_cases_plan_scratch_rows():
    """The MTP cases carry EAGLE's draft-token flag and so scratch rows in the slot rows: without MTP the
    same point has fewer slot rows (hot slots x layers x rows fill whole pages either way)."""
    for name in ("v32_dp8_fp8_mtp2", "hyv4_dp8_fp8_mtp4"):
        model, serving, batch, ratio, ctx, mtp = CASES[name]
        rep = host_pool_report(serving, DeploymentConfig(model=model, nodes=1, ep=8), batch * ctx, "")
        m = ModelSpec.load(model)
        on, off = launch_plan(rep, m, batch, ratio, ctx, mtp), launch_plan(rep, m, batch, ratio, ctx, 1)
        assert on.argv[on.argv.index("--speculative-num-draft-tokens") + 1] == str(mtp)
        assert "--speculative-algorithm" not in off.argv
        assert dict(on.device_allocation)["slot_rows"] > dict(off.device_allocation)["slot_rows"]


def test_the_cases_differ_where_the_layouts_do():
    """Not one number checked thrice: the cases cover shared and per-rank pools, fp8 and bf16 rows, and a
    model with two attention layers per decoder layer."""
    reps = {}
    for name, (model, serving, batch, ratio, ctx, mtp) in CASES.items():
        reps[name] = host_pool_report(serving, DeploymentConfig(model=model, nodes=1, ep=8), batch * ctx, "")
    assert {r.row_bytes for r in reps.values()} == {656, 1152}
    assert reps["v32_dp8_fp8"].for_sharing(reps["v32_dp8_fp8"].chosen).pools_per_node == 8
    assert reps["glm52_tp8_bf16_shared"].layers == 78
    assert reps["glm52_tp8_bf16_shared"].for_sharing("shared").pools_per_node == 1
    assert reps["longcat_dp8_fp8"].layers == 56
