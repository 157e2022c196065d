"""GPU fake of a whole server (issues 16, 32) in an H200's default configuration: `python -m
sgl_ess.launch_server --attention-backend dsa` on this CPU runs the classes that ship on a GPU -
SGLang's DSA backend replaced by ESS's CUDA subclass (cuda_backend.py), its store on the CUDA
side-stream engine - in every SGLang process, with only the device kernels and the stream runtime
swapped (tests/gpu_fake_site/sitecustomize.py: FlashMLA -> a torch sparse MLA that reads FlashMLA's
656-byte FP8 rows, SGLang's FP8 quantizer -> its formula in torch, the streams -> a double that
completes work late and out of order), and SGLang asking the device answered as an H200 (sm 90,
capability (9, 0), no CPU-platform refusal of an FP8 MLA cache). The configuration is an H200's
default with ESS: FP8 KV (--kv-cache-dtype fp8_e4m3, 656-byte rows), --dsa-decode-backend flashmla_kv,
and the prefill kernel left to SGLang's own dispatch (set_dsa_prefill_impl: flashmla_kv over FP8
rows), on the embedded model with DeepSeek-V3.2's latent width (sgl_ess/models/tiny_dsv32_h200, 512 +
64: the only width FlashMLA's FP8 rows hold). Real processes, real HTTP.

Checked against a reference server under the same fake with ESS off: SGLang's own DSA backend over
the same FP8 rows in its device pool. Its dense MHA one-shot (what SGLang runs on sm_90 for batches
of at most SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD keys) reads the unquantized keys, not the
FP8 rows, so the reference sets that threshold to 0 and prefills every batch by sparse MLA over the
rows, as ESS does. Greedy tokens and log-probs equal on contexts several times the hot buffer, under
concurrent clients; request rows are reused by later requests; short prompts go through the store.
That comparison runs ESS at --ess-prefetch-overlap-level none (one FlashMLA call per layer after the
fetch): at ESS's default level, da, a decode step whose misses are still in flight is split into two
FlashMLA calls whose BF16 outputs are merged by log-sum-exp, one more BF16 rounding of each partial
than one call (docs/design.md; bounded in process by _cuda_fake.split_bound,
test_flashmla_overlap_gpu_fake.py), so its log-probs are not bit-equal to the reference (seen here:
request 0's second log-prob -5.10011 at da, -5.10044 at none and in the reference, its third token
another). A second ESS server at the default level serves the same prompts and aborts: requests
aborted mid-decode, live host rows and hot buffers back to zero without a flush. Nothing here ran a
GPU kernel."""

import concurrent.futures as cf
import os

import pytest

from sgl_ess.models import TINY_DSV32_H200_DIR

from ._server import REPO, Server, group_alive
from .conftest import _need_sglang

pytestmark = pytest.mark.integration

GPU_FAKE_ENV = {"SGLESS_TEST_GPU_FAKE": "1", "SGLANG_OPT_USE_TOPK_V2": "0",
                "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "tests", "gpu_fake_site"),
                                               os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
# An H200's default configuration with ESS (launcher_defaults.cuda_ess_defaults: FP8 656-byte rows,
# flashmla_kv decode; the prefill kernel is SGLang's pick), on the embedded model with V3.2's latent
# width. The launcher adds --load-format dummy for the default model only.
H200_ARGS = ["--model-path", TINY_DSV32_H200_DIR, "--load-format", "dummy", "--served-model-name", "tiny_dsv32_h200",
             "--attention-backend", "dsa", "--kv-cache-dtype", "fp8_e4m3", "--dsa-decode-backend", "flashmla_kv",
             "--page-size", "64"]
GPU_FAKE_H200_ENV = {**GPU_FAKE_ENV, "SGLESS_DUMMY_INIT": "scaled"}
# The reference (ESS off): SGLang's own DSA backend, every prefill by sparse MLA over the FP8 rows
REFERENCE_ENV = {**GPU_FAKE_H200_ENV, "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": "0"}
COMMON = [*H200_ARGS, "--max-running-requests", "8"]
HOT = ["--ess-hot-slots-per-request", "40"]
UNSPLIT = ["--ess-prefetch-overlap-level", "none"]    # one FlashMLA call per decode layer (see above)
FP8_ROW_BYTES = 512 + 4 * 4 + 2 * 64     # FlashMLA's V3.2 row: FP8 NoPE codes, fp32 tile scales, bf16 RoPE
PROMPTS = [("def f%d(x):\n    return x * %d + %d\n" % (i, i, i * 3)) * (20 + 9 * i) for i in range(5)]
NEW_TOKENS = 20
# Two different short prompts (far below SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD - the model's
# index_topk when unset: on sm_90 SGLang's DSA backend would prefill them as dense MHA one-shot), sent
# one at a time so the second takes the request row the first just freed (issue 32, defect 1)
SHORT = ["The capital of France is", "List three prime numbers:"]


def _batch(server):
    with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        outs = list(ex.map(lambda p: server.generate(p, NEW_TOKENS), PROMPTS))
    return [([t[1] for t in o["meta_info"]["output_token_logprobs"]],
             [t[0] for t in o["meta_info"]["output_token_logprobs"]], o["meta_info"]["prompt_tokens"]) for o in outs]


def _one(server, prompt):
    o = server.generate(prompt, NEW_TOKENS)
    lp = o["meta_info"]["output_token_logprobs"]
    return [t[1] for t in lp], [t[0] for t in lp], o["meta_info"]["prompt_tokens"]


def _abort(server, i):
    return server.generate_then_abort({"text": PROMPTS[i], "sampling_params": {
        "max_new_tokens": 300, "ignore_eos": True, "temperature": 0}}, after_s=1.5 + i)


@pytest.fixture(scope="module")
def runs():
    _need_sglang()
    out = {}
    for name, args, env in (("on", COMMON + HOT + UNSPLIT, GPU_FAKE_H200_ENV),
                            ("da", COMMON + HOT, GPU_FAKE_H200_ENV),        # ESS's default level
                            ("off", COMMON + ["--ess-enabled", "false"], REFERENCE_ENV)):
        srv = Server(f"gpu_fake_{name}", args, env)
        try:
            srv.wait_healthy()
            if name == "da":
                out["da_batch"] = _batch(srv)
                out["usage_da"] = srv.ess_usage()
                with cf.ThreadPoolExecutor(3) as ex:
                    out["aborted"] = list(ex.map(lambda i: _abort(srv, i), range(3)))
                out["after_aborts"] = srv.wait_ess_zero(timeout_s=90)
                out["da_log"] = srv.log_tail(100000)
                continue
            out[name] = {"first": _batch(srv), "again": _batch(srv)}   # the second batch reuses request rows
            if name == "on":
                out["warm_before_short"] = srv.ess_usage()["warmup_rows"]
            out[name]["short"] = [_one(srv, p) for p in SHORT]          # one at a time: one request row
            if name == "on":
                out["usage_after_short"] = out["usage_after_batches"] = srv.ess_usage()
            out[f"{name}_log"] = srv.log_tail(100000)
        finally:
            srv.stop()
        assert not group_alive(srv.pgid), f"processes of {srv.name} left behind"
    return out


@pytest.mark.parametrize("server", ["on", "da"])
def test_gpu_fake_server_runs_the_cuda_class_on_the_stream_engine(runs, server):
    u = runs["usage_after_batches" if server == "on" else "usage_da"]
    assert u["prefetch"]["engine"] == "stream", u["prefetch"]
    assert u["overlap_level"] == {"on": "none", "da": "da"}[server], u
    assert u["rows_h2d"] > 0 and u["warmup_rows"] > 0, u          # misses fetched through the side-stream engine
    # the rows moved are FlashMLA's FP8 rows (656 bytes), not BF16 latents
    assert u["bytes_h2d"] == u["rows_h2d"] * FP8_ROW_BYTES, u
    # SGLang's own pick for FP8 KV on sm_90 (server_args / set_dsa_prefill_impl), not a flag of ours
    log = runs[f"{server}_log"]
    assert "Set DSA backends for fp8_e4m3 KV Cache: prefill=flashmla_kv, decode=flashmla_kv" in log
    assert "Traceback" not in log


def test_gpu_fake_server_ess_on_equals_off(runs):
    """Both servers' attention reads FP8 rows written by the same quantizer through the same FlashMLA
    stand-in (float64 accumulation, rounded once to BF16; ESS unsplit: one call per decode layer), so
    tokens and log-probs are compared for equality. The reference prefilled by sparse MLA over its FP8
    rows too (no dense MHA one-shot)."""
    assert "Dense attention kv len threshold is manually set to 0" in runs["off_log"]
    for when in ("first", "again"):
        for i, (on, off) in enumerate(zip(runs["on"][when], runs["off"][when])):
            assert on[2] >= 5 * 40, f"context {on[2]} should be several times the hot buffer"
            assert on[0] == off[0], f"{when} batch, request {i}: tokens differ ESS on vs off through the CUDA class"
            assert on[1] == off[1], f"{when} batch, request {i}: log-probs differ"
    assert len(set(runs["on"]["first"][0][0])) > 4             # not a degenerate repetition


def test_gpu_fake_server_short_prompts_go_through_the_store(runs):
    """Issue 32, defect 1: the fake answers sm_90 (get_device_sm, the capability), where SGLang's DSA
    backend prefills short prompts as dense MHA one-shot and the ESS extend path never runs (no hot
    buffer opened or warmed); the next request on that row then decoded from the first one's slot map.
    Each short request must open and warm its hot buffer, and its tokens and log-probs equal ESS off."""
    for i, (on, off) in enumerate(zip(runs["on"]["short"], runs["off"]["short"])):
        assert on[2] <= 2048, "a short prompt: below SGLang's dense-MHA threshold"
        assert on[0] == off[0], f"short request {i}: tokens differ ESS on vs off ({on[0]} vs {off[0]})"
        assert on[1] == off[1], f"short request {i}: log-probs differ"
    u = runs["usage_after_short"]
    assert u["warmup_rows"] > runs["warm_before_short"], "short prompts never warmed a hot buffer (the ESS extend path did not run)"
    assert u["hot_requests_open"] == 0, u


def test_gpu_fake_server_aborts_release_everything_without_a_flush(runs):
    assert len(runs["aborted"]) == 3
    u = runs["after_aborts"]
    assert u["host_tokens_used"] == 0 and u["hot_requests_open"] == 0 and u["hot_slots_used"] == 0, u
