"""DeepSeek-V4 served with ESS on (issue 37 item 2, the CPU slice): ``python -m sgl_ess.launch_server`` with the
tiny V4 (sgl_ess/models/tiny_dsv4, deterministic scaled dummy weights) and ESS on keeps its C4 layers'
compressed entries in ESS's host store, one row per entry, and reads each decode step's top-32 through a
per-request hot buffer of 40 entries with ESS's exact LRU, warm-started from the prefill's top-k
(dsv4/c4_store.py); window rows and C128 entries stay in the CPU arm's rows. One pair of servers (ESS on,
ESS off, the same flags otherwise) serves the module; the same prompts go to both from 3 client threads
with 2 running requests at most, so request rows are reused, and every prompt (200-320 tokens: 50-80 C4
entries) is longer than the hot buffer, so decode steps miss and fetch. With overlap level none, greedy
tokens and the top-3 log-probs of every output token are equal (the same entries in the same top-k order); the ESS
counters show fetched rows, misses and warm-up rows; live host rows, hot slots and open hot buffers are
back to zero without a flush. A third server runs the worker engine (a prefetch process) at the default
overlap level, da, with SGLang's radix cache: its counters show decode steps attended in two parts while
misses were in flight, and two later prompts sharing a cached 256-token page reuse its C4 entries from host."""

import concurrent.futures as cf
import os

import pytest

from ._server import start_together, stop_all
from .conftest import _need_sglang

pytestmark = pytest.mark.integration
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "sgl_ess", "models", "tiny_dsv4")
BASE = ["--model-path", MODEL, "--load-format", "dummy", "--max-total-tokens", "4096", "--swa-full-tokens-ratio",
        "0.5", "--max-running-requests", "2"]
COMMON = BASE + ["--disable-radix-cache"]
ENV = {"SGLESS_DUMMY_INIT": "scaled"}
HOT = 40
PROMPTS = [[(7 * i * i + 13 * i + 5 * s + 3) % 2000 + 2 for i in range(200 + 30 * s)] for s in range(5)]
NEW_TOKENS = 12
# two prompts after the first batch that share PROMPTS[4]'s first 256 tokens (one V4 page): radix-cache hits
SHARED = [PROMPTS[4][:256] + [(11 * i + 7 * s) % 2000 + 2 for i in range(24)] for s in range(2)]


def _generate(srv, prompt):
    out = srv.post("/generate", {"input_ids": prompt, "return_logprob": True, "top_logprobs_num": 3,
                                 "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS,
                                                     "ignore_eos": True}})
    meta = out["meta_info"]
    return ([t[1] for t in meta["output_token_logprobs"]], [t[0] for t in meta["output_token_logprobs"]],
            [[(t[1], t[0]) for t in top] for top in meta["output_top_logprobs"]])


def _batch(srv):
    with cf.ThreadPoolExecutor(3) as ex:
        return list(ex.map(lambda p: _generate(srv, p), PROMPTS))


@pytest.fixture(scope="module")
def runs():
    _need_sglang()
    servers = start_together({"on": (COMMON + ["--ess-hot-slots-per-request", str(HOT),
                                               "--ess-prefetch-overlap-level", "none"], ENV),
                              "da": (BASE + ["--ess-hot-slots-per-request", str(HOT),
                                             "--ess-prefetch-engine", "worker"], ENV),
                              "off": (COMMON + ["--ess-enabled", "false"], ENV)}, prefix="dsv4_ess_")
    out = {}
    try:
        for name, srv in servers.items():
            out[name] = _batch(srv)
            if name == "da":                    # the radix cache: sequential, so the prefix is cached first
                out["da_shared"] = [_generate(srv, p) for p in SHARED]
            if name in ("on", "da"):
                out[name + "_usage"] = srv.ess_usage()
                out[name + "_zero"] = srv.wait_ess_zero(timeout_s=120)
                out[name + "_log"] = srv.log_tail(100000)
    finally:
        stop_all(servers)
    return out


def test_ess_on_equals_off(runs):
    for i, (on, off) in enumerate(zip(runs["on"], runs["off"])):
        assert len(on[0]) == NEW_TOKENS
        assert on[0] == off[0], f"request {i}: tokens differ ESS on vs off ({on[0]} vs {off[0]})"
        assert on[1] == off[1], f"request {i}: log-probs differ"
        assert on[2] == off[2], f"request {i}: top-3 log-probs differ"
    assert len({tuple(r[0]) for r in runs["on"]}) > 1            # not one degenerate answer


def test_ess_counters_show_the_c4_store_at_work(runs):
    u = runs["on_usage"]
    assert u["host_row_unit"] == "C4 entry" and u["c4_layers"] == [2, 4], u
    assert u["hot_slots_per_request"] == HOT and u["request_rows"] < len(PROMPTS), u   # rows reused
    assert u["warmup_rows"] > 0, u                              # warm-started from each prefill's top-k
    assert all(m > 0 for m in u["misses_per_layer"]), u          # 40 slots, top-32 of 50-83 entries
    assert u["rows_h2d"] >= sum(u["misses_per_layer"]) > 0, u
    assert sum(u["hits_per_layer"]) > 0, u
    assert u["opens"] >= len(PROMPTS), u        # each request opened a hot buffer (and the server's warm-up ones)
    assert "Traceback" not in runs["on_log"]


def test_live_rows_back_to_zero_without_a_flush(runs):
    for name in ("on", "da"):
        u = runs[name + "_zero"]
        assert u["host_tokens_live"] == 0 and u["hot_slots_used"] == 0 and u["hot_requests_open"] == 0, (name, u)


def test_worker_engine_overlaps_the_fetch(runs):
    """The worker engine (a prefetch process the scheduler starts) at the default level, da: decode steps whose
    misses were in flight attended in two parts. Its outputs are not compared token for token: DA's merge
    rounds differently from one softmax (in process, within a derived bound: test_dsv4_ess_overlap.py)."""
    u = runs["da_usage"]
    assert u["engine"] == "worker" and u["overlap_level"] == "da", u
    assert u["dual_steps"] > 0 and all(m > 0 for m in u["misses_per_layer"]), u
    assert all(len(r[0]) == NEW_TOKENS for r in runs["da"] + runs["da_shared"])
    assert "Traceback" not in runs["da_log"]
    same = sum(a[0] == b[0] for a, b in zip(runs["da"], runs["off"]))
    print(f"DA server: reused C4 entries {u['reused_entries']}, cached {u['host_tokens_cached']}")
    print(f"DA server: {same} of {len(PROMPTS)} requests' greedy tokens equal ESS off's")


def test_radix_cache_prefix_entries_are_reused(runs):
    """The da server runs SGLang's radix cache: the two SHARED prompts start after PROMPTS[4]'s first 256-token
    page, whose 64 C4 entries per layer each finds on host (written when PROMPTS[4] was served) instead of
    recomputing them; they stay cached (used, not live) until the flush of wait_ess_zero zeroes them."""
    u = runs["da_usage"]
    assert u["reused_entries"] >= 64 * len(SHARED), u
    assert u["host_tokens_cached"] >= 64 and u["host_tokens_live"] == 0, u
    z = runs["da_zero"]
    assert z["host_tokens_used"] == 0 and z["host_tokens_cached"] == 0, z
