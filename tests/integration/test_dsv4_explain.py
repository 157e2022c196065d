"""Issue 37, "what it must show": ``python -m sgl_ess.launch_server ... --ess-explain`` knows DeepSeek-V4.

The launcher's main() runs in this process (no server starts: --ess-explain prints its plan and exits 0, a
refusal exits 2), host memory fixed by a stub /proc/meminfo. For the tiny V4 (sgl_ess/models/tiny_dsv4) every
number of the plan is recomputed here from its config.json by hand: what goes to host (C4 entries, 1 per 4
tokens per C4 layer, in the 584-byte FP8 row of a V4 pool), the host store
(one row per C4 location of the KV pool), what stays on the device per request (the fixed window, C128 entries,
index keys, compressor state) and the hot buffer. A V4-Flash-shaped config.json gives the simulator's host
bytes per token (3066). The StoreConfig the plan sizes is the one dsv4/c4_store.C4EntryStore builds."""

import json
import os

import pytest

from ._server import REPO, free_port
from .conftest import _need_sglang

pytestmark = pytest.mark.integration
TINY = os.path.join(REPO, "sgl_ess", "models", "tiny_dsv4")
GB = 10 ** 9
MEM = {"MemTotal": 512 * GB, "MemAvailable": 400 * GB}


@pytest.fixture()
def launch(monkeypatch, capsys):
    """Run the launcher's main() on `args`: (exit code, stdout, stderr)."""
    _need_sglang()
    from sgl_ess.serving import host_memory
    from sgl_ess.integration.sglang.launcher.server_args import main

    monkeypatch.setattr(host_memory, "meminfo", lambda path="/proc/meminfo": dict(MEM))

    def run(*args):
        with pytest.raises(SystemExit) as e:
            main(["--port", str(free_port()), "--load-format", "dummy", *args])
        out = capsys.readouterr()
        return e.value.code, out.out, out.err
    return run


def _plan_line(out: str, start: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.strip().startswith(start)]
    assert len(lines) == 1, (start, out)
    return lines[0]


def _bytes(line: str, label: str) -> int:
    """The exact byte count printed after `label` ("... label 1.794 MB (1794048 B)")."""
    rest = line.split(label, 1)[1]
    return int(rest.split("(", 1)[1].split(" B)", 1)[0])


def test_tiny_v4_plan_numbers_from_its_config(launch):
    with open(os.path.join(TINY, "config.json")) as fh:
        cfg = json.load(fh)
    ratios = cfg["compress_ratios"]
    c4, c128, layers = ratios.count(4), ratios.count(128), len(ratios)
    nope, rope = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    d, k = nope + rope, cfg["index_topk"]
    running, ctx = 3, cfg["max_position_embeddings"]            # no rope-scaled context: 8192
    code, out, err = launch("--model-path", TINY, "--max-running-requests", str(running), "--ess-explain")
    assert code == 0, err
    assert "no MLA latent" not in out

    # host: the C4 entries in SGLang's V4 FP8 row, as the store keeps them
    fp8 = nope + nope // 64 + 1 + 2 * rope         # FP8 NoPE + 1 scale byte per 64 + 1 pad + BF16 RoPE
    here = fp8
    assert fp8 == 584 and d == 512
    assert f"{c4} C4 (layers 2, 4) + {c128} C128 + 2 window only" in out
    assert f"SGLang's V4 FP8 row, {fp8} B" in out
    assert f"host bytes per token {c4 * fp8 // 4} = {c4} C4 layers x {fp8} B / 4" in out
    # one host row per C4 location of the KV pool: the launcher's default 65536 tokens on CPU, in 256-token
    # pages, + SGLang's padding page, // 4
    pool = 65536 // 256 * 256 + 256
    host = _plan_line(out, "host store:")
    assert _bytes(host, "host store:") == pool // 4 * c4 * here
    assert f"{pool // 4} C4 locations (the {pool}-location KV pool // 4" in host

    # the device, per request at the context length, in SGLang's V4 layout
    dev = _plan_line(out, "on the device, per request")
    window = layers * 2 * 256 * fp8                # 128-token window: at most 2 SWA pages of 256 per layer
    c128_entries = c128 * (ctx // 128) * fp8
    keys = c4 * (ctx // 4) * (128 + 4)             # index keys: FP8 [128] + a 4-byte scale
    # SGLang's compressor rings, float32: C4 8 rows of 2 x 2 x head_dim (+ its indexer's at 128); C128 128 of 2 x d
    state = c4 * 8 * (4 * d + 4 * cfg["index_head_dim"]) * 4 + c128 * 128 * 2 * d * 4
    assert _bytes(dev, "window") == window and _bytes(dev, "C128 entries") == c128_entries
    assert _bytes(dev, "C4 index keys") == keys and _bytes(dev, "compressor state") == state
    assert _bytes(dev, "context tokens):") == window + c128_entries + keys + state
    assert "fixed per request" in dev

    # the hot buffer: 4 x index_topk entries per request and C4 layer by default
    hot = _plan_line(out, "hot buffer:")
    assert f"{4 * k} C4 entries per request and C4 layer" in hot and f"needs >= index_topk + 1 = {k + 1}" in hot
    assert _bytes(hot, f"{here} B =") == c4 * 4 * k * fp8


def test_the_planned_store_is_the_one_the_runner_builds(launch):
    """v4_plan.store_config for the sizes it planned = C4EntryStore's own StoreConfig for the same sizes."""
    from sgl_ess.integration.sglang.dsv4.c4_store import C4EntryStore
    from sgl_ess.integration.sglang.launcher import v4_plan

    import torch

    rows, ctx, hot, tokens = 3, 256, 40, 3000
    pool = v4_plan.runner_pool_tokens(tokens)
    assert pool == 11 * 256 + 256
    req_to_token = torch.zeros(rows, ctx + v4_plan.REQ_TO_TOKEN_EXTRA_TOKENS, dtype=torch.int32)
    store = C4EntryStore([2, 4], 512, 32, req_to_token, pool, hot)
    try:
        assert v4_plan.store_config(2, 584, 32, rows, (ctx + 4) // 4, pool, hot, 32) == store.cfg
    finally:
        store.shutdown()
    code, out, err = launch("--model-path", TINY, "--max-running-requests", str(rows - 1), "--context-length",
                            str(ctx), "--max-total-tokens", str(tokens), "--ess-hot-slots-per-request", str(hot),
                            "--ess-explain")
    assert code == 0, err
    line = _plan_line(out, "hot buffer:")
    assert _bytes(line, "LRU state for 3 request rows:") == sum(store.cfg.device_allocation().values())
    assert _bytes(_plan_line(out, "host store:"), "host store:") == store.cfg.host_bytes


def test_v4_flash_shaped_config_host_bytes_per_token_is_the_simulators(launch, tmp_path):
    from sgl_ess.sim.dsv4 import V4Spec, host_bytes_per_token

    ratios = [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)]
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "num_hidden_layers": 43,
        "compress_ratios": ratios, "qk_nope_head_dim": 448, "qk_rope_head_dim": 64, "head_dim": 512,
        "index_head_dim": 128, "index_topk": 512}))
    code, out, err = launch("--model-path", str(tmp_path), "--max-running-requests", "1", "--context-length", "4096",
                            "--ess-explain")
    assert code == 0, err
    sim = host_bytes_per_token(V4Spec.load("deepseek_v4_flash"))
    assert sim == 21 * 584 / 4 == 3066
    assert f"host bytes per token {sim:g} = 21 C4 layers x 584 B / 4" in out


def test_what_v4_with_ess_does_not_serve_is_refused_before_loading(launch):
    code, _, err = launch("--model-path", TINY, "--ess-explain", "--ess-explain-device", "cuda:8:141")
    assert code == 2 and "on the CPU dsv4 arm only" in err and "--ess-enabled false" in err, err
    code, _, err = launch("--model-path", TINY, "--ess-memory-pool-size-gb", "4", "--ess-explain")
    assert code == 2 and "drop --ess-memory-pool-size-gb" in err, err
    code, _, err = launch("--model-path", TINY, "--ess-hot-slots-per-request", "32", "--ess-explain")
    assert code == 2 and "index_topk=32 needs >= 33" in err, err
    code, out, err = launch("--model-path", TINY, "--ess-enabled", "false", "--ess-explain")
    assert code == 0 and "ESS plan (ESS off)" in out, err


def test_v4_with_mtp_names_the_union_and_the_draft_window(launch):
    with open(os.path.join(TINY, "config.json")) as fh:
        cfg = json.load(fh)
    code, out, err = launch("--model-path", TINY, "--ess-explain", "--speculative-algorithm", "EAGLE",
                            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                            "--speculative-num-draft-tokens", "4")
    assert code == 0, err
    line = _plan_line(out, "MTP (--speculative-algorithm EAGLE, 4 draft tokens per verify)")
    assert f"its 4 top-{cfg['index_topk']} sets per request as ONE union per C4 layer" in line, line
    window = _bytes(_plan_line(out, "on the device, per request"), "window")
    assert _bytes(line, "its window on the device,") == window // len(cfg["compress_ratios"]), line
    code, out, _ = launch("--model-path", TINY, "--ess-explain")
    assert code == 0 and "MTP (" not in out
