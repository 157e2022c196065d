"""EAGLE / NextN (MTP) speculative decoding on the real server with the embedded model's MTP layer:

  python -m sgl_ess.launch_server --speculative-algorithm EAGLE --speculative-num-steps 3 \\
      --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 [--ess-enabled false]

Greedy tokens, their log-probs and the speculation itself (verify steps, accepted draft tokens per
request) are identical with ESS on - a hot buffer of 160 slots per request and layer (the union
of a request's 4 top-32 sets, <= 128 entries, fits) and of 40 slots (it does not: the overflow is
read from the host pool) - and with ESS off. Equal accepted drafts show the draft runner's own
store serves the draft's attention exactly. Acceptance length is printed (pytest -s).
Then requests are aborted in the middle of speculative steps: both stores (target and draft)
return to zero. The 40-slot server runs twice: on the CPU ``ess`` backend, and as a GPU fake
through the CUDA class in an H200's default configuration (test_gpu_fake_server.H200_ARGS: FP8
656-byte rows, flashmla_kv, SGLang's own prefill pick, on the V3.2-latent tiny model and its MTP
layer; SGLang's DSA backend replaced by ESS's subclass in target and draft runners, the side-stream
engine with late, out-of-order streams; only the device kernels and the stream runtime swapped,
tests/gpu_fake_site). The GPU fake's reference is the same fake with ESS off (SGLang's own DSA
backend over the same FP8 rows in target verify, draft decode and draft extend: the fused top-k
stand-in maps the indexer's positions to slots in every one of them, _cuda_fake.ref_fused_topk_transform),
not the CPU path (FP8 rows are not the CPU path's BF16 latents). Five servers, started together,
used one at a time (2 cores)."""

import concurrent.futures as cf

import pytest

from ._server import ess_usage_zero, group_alive, start_together
from .conftest import _need_sglang
from .test_gpu_fake_server import FP8_ROW_BYTES, GPU_FAKE_H200_ENV, H200_ARGS, REFERENCE_ENV

pytestmark = pytest.mark.integration

SPEC = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4"]
COMMON = ["--max-running-requests", "8", "--max-total-tokens", "16384"]
CONFIGS = {
    "on_fit": ["--ess-hot-slots-per-request", "160"] + SPEC,
    "on_overflow": ["--ess-hot-slots-per-request", "40"] + SPEC,
    # an H200's default configuration (FP8 rows, flashmla_kv, SGLang's prefill pick), unsplit
    # (--ess-prefetch-overlap-level none), as every GPU-fake server compared bit for bit with ESS off: at
    # da a draft decode step whose misses are in flight merges two FlashMLA calls' BF16 outputs (one more
    # rounding; test_gpu_fake_server.py)
    "gpu_fake_overflow": H200_ARGS + ["--ess-hot-slots-per-request", "40", "--ess-prefetch-overlap-level",
                                      "none"] + SPEC,
    "off": ["--ess-enabled", "false"] + SPEC,
    # its reference: the same fake and model with ESS off (test_gpu_fake_server.REFERENCE_ENV)
    "gpu_fake_off": H200_ARGS + ["--ess-enabled", "false"] + SPEC,
}
ENVS = {"gpu_fake_overflow": GPU_FAKE_H200_ENV, "gpu_fake_off": REFERENCE_ENV}
# which reference each ESS-on server is compared with
REFERENCE = {"on_fit": "off", "on_overflow": "off", "gpu_fake_overflow": "gpu_fake_off"}
NEW_TOKENS = 40
# repetitive prompts make the random target repeat itself, so drafts get accepted; the others are
# contexts several times the hot buffer
PROMPTS = ["a" * 400, "xy " * 150,
           "import os\nimport sys\ndef f(argv):\n    return argv[1] + 7\n" * 16,
           "class Node:\n    def __init__(self, v):\n        self.v = v * 3\n" * 14]


def _batch(server):
    server.flush_cache()
    with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        outs = list(ex.map(lambda p: server.generate(p, NEW_TOKENS), PROMPTS))
    return [{"tokens": [t[1] for t in o["meta_info"]["output_token_logprobs"]],
             "logprobs": [t[0] for t in o["meta_info"]["output_token_logprobs"]],
             "prompt_tokens": o["meta_info"]["prompt_tokens"],
             **{k: o["meta_info"].get(k) for k in ("spec_verify_ct", "spec_num_correct_drafts",
                                                   "spec_accept_length", "spec_correct_drafts_histogram")}}
            for o in outs]


def _abort_mid_speculation(server, i):
    """/generate aborted while it is in its speculative steps."""
    return server.generate_then_abort({"text": PROMPTS[i % len(PROMPTS)], "sampling_params": {
        "max_new_tokens": 400, "ignore_eos": True, "temperature": 0}}, after_s=2.0 + i)


@pytest.fixture(scope="module")
def runs():
    _need_sglang()
    out = {}
    # started together (their starts overlap), then used one at a time, each stopped when done
    servers = start_together({name: (COMMON + args, ENVS.get(name)) for name, args in CONFIGS.items()},
                             prefix="spec_")
    try:
        for name in CONFIGS:
            srv = servers.pop(name)
            try:
                res = {"batch": _batch(srv), "log": srv.log_tail(100000)}
                if name in REFERENCE:
                    res["usage"] = srv.ess_usage()
                if name in ("on_overflow", "gpu_fake_overflow"):
                    with cf.ThreadPoolExecutor(3) as ex:
                        aborted = list(ex.map(lambda i: _abort_mid_speculation(srv, i), range(3)))
                    res["aborted"] = aborted
                    res["after_aborts"] = srv.wait_ess_zero(timeout_s=90)
                out[name] = res
            finally:
                srv.stop()
            assert not group_alive(srv.pgid), f"processes of {srv.name} left behind"
    finally:
        for srv in servers.values():
            srv.stop()
    return out


def test_greedy_output_and_speculation_equal_with_ess_on_and_off(runs):
    for ref in ("off", "gpu_fake_off"):
        off = runs[ref]["batch"]
        assert min(r["prompt_tokens"] for r in off) >= 120
        assert any(r["spec_num_correct_drafts"] > 0 for r in off), f"{ref}: no draft token was ever accepted"
        assert any(r["spec_num_correct_drafts"] < r["spec_verify_ct"] * 3 for r in off), f"{ref}: no draft was rejected"
    for name, ref in REFERENCE.items():
        for i, (a, b) in enumerate(zip(runs[name]["batch"], runs[ref]["batch"])):
            assert len(a["tokens"]) == NEW_TOKENS
            assert a["tokens"] == b["tokens"], f"{name} request {i}: tokens differ from {ref}"
            assert a["logprobs"] == b["logprobs"], f"{name} request {i}: log-probs differ from {ref}"
            for k in ("spec_verify_ct", "spec_num_correct_drafts", "spec_correct_drafts_histogram"):
                assert a[k] == b[k], f"{name} request {i}: {k} {a[k]} != {ref} {b[k]}"
    for name in ("on_fit", "on_overflow", "gpu_fake_overflow"):
        acc = [r["spec_accept_length"] for r in runs[name]["batch"]]
        print(f"\n{name}: acceptance length per request {[round(a, 3) for a in acc]}")


def test_gpu_fake_runs_an_h200s_default_configuration(runs):
    """Both GPU-fake servers: SGLang's own pick for FP8 KV on sm_90 (flashmla_kv prefill and decode);
    the ESS one moves FlashMLA's 656-byte rows; the reference prefilled by sparse MLA over its FP8 rows
    (no dense MHA one-shot, which reads unquantized keys)."""
    for name in ("gpu_fake_overflow", "gpu_fake_off"):
        log = runs[name]["log"]
        assert "Set DSA backends for fp8_e4m3 KV Cache: prefill=flashmla_kv, decode=flashmla_kv" in log, name
        assert "Traceback" not in log, name
    assert "Dense attention kv len threshold is manually set to 0" in runs["gpu_fake_off"]["log"]
    u = runs["gpu_fake_overflow"]["usage"]
    assert u["bytes_h2d"] == u["rows_h2d"] * FP8_ROW_BYTES, u


def test_stores_served_the_union_and_the_overflow(runs):
    fit, over, fake = runs["on_fit"]["usage"], runs["on_overflow"]["usage"], runs["gpu_fake_overflow"]["usage"]
    assert fake["prefetch"]["engine"] == "stream", fake["prefetch"]      # the CUDA class's side-stream engine
    assert fake["mtp_overflow_entries"] > 0
    for u in (fit, over, fake):
        assert u["rows_h2d"] > 0 and u["mtp_steps"] > 0 and u["mtp_rows_admitted"] > 0
        assert u["mtp_window_entries"] > 0
        (draft,) = u["draft"]                       # the draft runner's own store: one MTP layer
        assert len(draft["misses_per_layer"]) == 1 and draft["mtp_steps"] > 0 and draft["rows_h2d"] > 0
    assert fit["mtp_overflow_entries"] == 0, "the union fits 160 slots: nothing should overflow"
    assert over["mtp_overflow_entries"] > 0, "the union exceeds 40 slots: the overflow path never ran"
    print(f"\nhit rate: 160 slots {fit['hit_rate']:.3f}, 40 slots {over['hit_rate']:.3f}; overflow entries read "
          f"from the host (40 slots): {over['mtp_overflow_entries']}")


@pytest.mark.parametrize("name", ["on_overflow", "gpu_fake_overflow"])
def test_usage_back_to_zero_after_aborts_mid_speculation(runs, name):
    res = runs[name]
    assert len(res["aborted"]) == 3
    u = res["after_aborts"]
    assert ess_usage_zero(u) and ess_usage_zero(u["draft"][0])
