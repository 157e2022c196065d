"""`sim plan`'s launch flags give the numbers the launcher's --ess-explain prints for the same flags: tokens
per host pool, host pools and host bytes per node, hot slots per request per layer (issue 36, item 4).

Each case builds the sim's host-pool report and launch plan, then runs ``python -m sgl_ess.launch_server
--model-path DIR <the plan's flags> --ess-explain --ess-explain-device cuda:8:141:4096`` (an 8 x H200 node
with 4096 GiB of host memory; preflight only: nothing loads, no server starts) on a config.json with the
model's real geometry (sgl_ess/sim/data/model_<name>.json on the embedded tiny config's keys), and
compares the exact byte counts explain prints. The runs start together (seconds of CPU each).
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

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NODE = ["--ess-explain", "--ess-explain-device", "cuda:8:141:4096"]
MODELS = os.path.dirname(TINY_DSV32_DIR)
TINY = {"deepseek_v32_exp": TINY_DSV32_DIR, "glm_5_2": os.path.join(MODELS, "tiny_glm5"),
        "longcat_flash_dsa": os.path.join(MODELS, "tiny_longcat")}

# (model, serving layout, batch per GPU, ratio, context)
CASES = {
    "v32_dp8_fp8": ("deepseek_v32_exp", ServingLayoutConfig(kv_cache_dtype="fp8_e4m3"), 54, 0.1, 32768),
    "glm52_tp8_bf16_shared": ("glm_5_2", ServingLayoutConfig(tp=8, kv_cache_dtype="bf16", share_host_pool="shared"),
                              6, 0.25, 131072),
    # LongCat-Flash: two attention sub-layers per decoder layer, so the host pool has 2 x 28 layers
    "longcat_dp8_fp8": ("longcat_flash_dsa", ServingLayoutConfig(kv_cache_dtype="fp8_e4m3"), 16, 0.2, 65536),
}


def real_config(model: str) -> dict:
    with open(os.path.join(TINY[model], "config.json")) as fh:
        cfg = json.load(fh)
    real = load_data(f"model_{model}.json")
    out = {k: real.get(k, v) for k, v in cfg.items()}
    if "num_layers" in cfg:                      # LongcatFlashConfig's own name for num_hidden_layers
        out["num_layers"] = real["num_hidden_layers"]
    if "indexer_types" in cfg:
        m = ModelSpec.load(model)
        out["indexer_types"] = ["full" if m.is_anchor(i) else "shared" for i in range(m.num_layers)]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    started = {}
    for name, (model, serving, batch, ratio, ctx) in CASES.items():
        d = tmp_path_factory.mktemp(name)
        (d / "config.json").write_text(json.dumps(real_config(model)))
        deploy = DeploymentConfig(model=model, nodes=1, ep=8)
        rep = host_pool_report(serving, deploy, batch * ctx, f"batch {batch} x context {ctx}")
        lp = launch_plan(rep, ModelSpec.load(model), batch, ratio, ctx)
        argv = [sys.executable, "-m", "sgl_ess.launch_server", "--model-path", str(d), *lp.argv, *NODE]
        started[name] = (lp, rep, subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                   text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}))
    out = {}
    for name, (lp, rep, p) in started.items():
        stdout, stderr = p.communicate(timeout=300)
        out[name] = (lp, rep, p.returncode, stdout, stderr)
    return out


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


def test_the_cases_differ_where_the_layouts_do():
    """Not one number checked thrice: the cases cover shared and per-rank pools, fp8 and bf16 rows, and a
    model with two attention layers per decoder layer."""
    reps = {}
    for name, (model, serving, batch, ratio, ctx) in CASES.items():
        reps[name] = host_pool_report(serving, DeploymentConfig(model=model, nodes=1, ep=8), batch * ctx, "")
    assert {r.row_bytes for r in reps.values()} == {656, 1152}
    assert reps["v32_dp8_fp8"].for_sharing(reps["v32_dp8_fp8"].chosen).pools_per_node == 8
    assert reps["glm52_tp8_bf16_shared"].layers == 78
    assert reps["glm52_tp8_bf16_shared"].for_sharing("shared").pools_per_node == 1
    assert reps["longcat_dp8_fp8"].layers == 56
