"""GLM-5 / 5.1 (the embedded tiny_glm5) with its MTP layer (GLM's NextN, ``GlmMoeDsaForCausalLMNextN``)
for EAGLE speculative decoding, served with ESS on through the CUDA class in the GPU fake (SGLang's DSA
backend replaced by ESS's subclass in the target and draft runners, the side-stream engine; only FlashMLA,
the FP8 quantizer and the stream runtime swapped: tests/gpu_fake_site) and with ESS off (CPU). Greedy
tokens, log-probs and the speculation itself (verify steps, accepted drafts) are equal; 4 concurrent
clients on 2 request rows, twice (rows reused), contexts several times the 40-slot hot buffer (the
draft window's overflow read from the host); both stores (target: 3 layers, draft: its one MTP layer)
back to zero without a flush. GLM's plain decode on the CPU backend: test_glm5_exactness.py. One
server per configuration, two in this module, started together."""

import pytest

from sgl_ess.models import TINY_GLM5_DIR

from ._server import ess_usage_zero, group_alive, start_together
from .conftest import _need_sglang
from .test_gpu_fake_server import GPU_FAKE_ENV
from .test_spec_eagle import NEW_TOKENS, SPEC, _batch

pytestmark = pytest.mark.integration

COMMON = ["--model-path", TINY_GLM5_DIR, "--load-format", "dummy", "--max-running-requests", "2",
          "--max-total-tokens", "16384", *SPEC]
SCALED_WEIGHTS = {"SGLESS_DUMMY_INIT": "scaled"}     # and the MTP layer shaped (sgl_ess/models/mtp_init.py)
CONFIGS = {
    # unsplit, as every GPU-fake server compared bit for bit with ESS off (test_multi_rank.GPU_FAKE_ARGS)
    "gpu_fake_on": (["--attention-backend", "dsa", "--dsa-decode-backend", "flashmla_sparse",
                     "--ess-hot-slots-per-request", "40", "--ess-prefetch-overlap-level", "none"],
                    {**GPU_FAKE_ENV, **SCALED_WEIGHTS}),
    "off": (["--ess-enabled", "false"], SCALED_WEIGHTS),
}


@pytest.fixture(scope="module")
def runs():
    _need_sglang()
    out = {}
    # started together (their starts overlap), then used one at a time, each stopped when done
    servers = start_together({name: (COMMON + args, env) for name, (args, env) in CONFIGS.items()},
                             prefix="glm5_mtp_")
    try:
        for name in CONFIGS:
            srv = servers.pop(name)
            try:
                res = {"first": _batch(srv), "again": _batch(srv)}
                if name != "off":
                    res["usage"] = srv.ess_usage()
                    res["after"] = srv.wait_ess_zero(timeout_s=90)       # polls WITHOUT a flush first
                res["log"] = srv.log_tail(100000)
                out[name] = res
            finally:
                srv.stop()
            assert not group_alive(srv.pgid), f"processes of {srv.name} left behind"
    finally:
        for srv in servers.values():
            srv.stop()
    return out


def test_glm_mtp_through_the_cuda_class_equals_ess_off(runs):
    on, off = runs["gpu_fake_on"], runs["off"]
    assert min(r["prompt_tokens"] for r in off["first"]) >= 120
    for when in ("first", "again"):
        for i, (a, b) in enumerate(zip(on[when], off[when])):
            assert len(a["tokens"]) == NEW_TOKENS
            assert a["tokens"] == b["tokens"], f"{when} request {i}: tokens differ from ESS off"
            assert a["logprobs"] == b["logprobs"], f"{when} request {i}: log-probs differ from ESS off"
            for k in ("spec_verify_ct", "spec_num_correct_drafts", "spec_correct_drafts_histogram"):
                assert a[k] == b[k], f"{when} request {i}: {k} {a[k]} != ESS off {b[k]}"
    assert any(r["spec_num_correct_drafts"] > 0 for r in off["first"]), "no draft token was ever accepted"
    assert "Traceback" not in on["log"] and "Traceback" not in off["log"]


def test_glm_mtp_ran_both_stores_on_the_cuda_class(runs):
    u = runs["gpu_fake_on"]["usage"]
    assert u["prefetch"]["engine"] == "stream", u["prefetch"]         # the CUDA class's side-stream engine
    assert u["rows_h2d"] > 0 and u["mtp_steps"] > 0 and u["mtp_overflow_entries"] > 0, u
    assert len(u["misses_per_layer"]) == 3                              # tiny_glm5's 3 layers
    (draft,) = u["draft"]                                               # the NextN runner's own store
    assert len(draft["misses_per_layer"]) == 1 and draft["mtp_steps"] > 0 and draft["rows_h2d"] > 0


def test_glm_mtp_stores_back_to_zero_without_a_flush(runs):
    u = runs["gpu_fake_on"]["after"]
    assert ess_usage_zero(u) and ess_usage_zero(u["draft"][0]), u
