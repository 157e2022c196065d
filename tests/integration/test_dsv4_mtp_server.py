"""DeepSeek-V4 with MTP (EAGLE through its NextN layer, chain drafts: 3 steps, 4 draft tokens) on the CPU dsv4 arm,
ESS on and off (issue 37 item 2): ``python -m sgl_ess.launch_server`` with the tiny V4 (random scaled weights, its
MTP layer shaped by sgl_ess/models/mtp_init.py so that drafts are sometimes accepted). Every output token after
the first comes out of a target verify; the C4 layers' verify reads its draft tokens' top-32 sets as one union
through a hot buffer of 40 entries (dsv4/cpu_backend.py, _c4_verify_ess): the misses fetched from the host rows,
the entries past the hot buffer read from the host rows for that step. The draft's own layer is window-only
(compress ratio 0), so the draft runner has no store.

Three servers, the same prompts from 3 client threads with 2 running requests at most (rows reused):
  on     ESS on, MTP          greedy tokens, log-probs and speculation counters equal to `off`, bit for bit;
                              its counters show verify steps, misses, overflow entries; live host rows, hot
                              slots and open hot buffers back to zero without a flush
  off    ESS off, MTP
  plain  ESS off, no MTP      greedy tokens equal to `off` (greedy speculative decoding changes no token),
                              a check of the arm's verify and draft modes against its decode
  da     ESS on, MTP, the worker engine (a prefetch process) at the default level da: verify steps attended
                              in two parts while misses were in flight; rows back to zero (its outputs are
                              not compared token for token: DA's merge rounds differently from one softmax;
                              in process, within a derived bound: test_dsv4_ess_verify.py)
The repetitive last prompt makes the target repeat itself, so drafts are accepted (fewer verify steps than
tokens), and entries finished by accepted draft tokens are written to the host rows by the next verify."""

import concurrent.futures as cf
import os

import pytest

from ._server import start_together, stop_all
from .conftest import _need_sglang
from .test_dsv4_ess_server import BASE, ENV, HOT, PROMPTS

pytestmark = pytest.mark.integration
SPEC = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4"]
ALL_PROMPTS = PROMPTS + [[5, 6, 7, 8] * 60]
# multi-turn: a 250-token first turn whose 8-token answer crosses the first 256-token page (SGLang's radix cache
# keeps whole pages), then a second turn on prompt + answer: its cached first page ends in the answer's tokens
TURN1, TURN1_TOKENS = [(11 * i * i + 3 * i + 5) % 2000 + 2 for i in range(250)], 8
NEW_TOKENS = 16
SPEC_KEYS = ("spec_verify_ct", "spec_num_correct_drafts")


def _generate(srv, prompt, new_tokens=NEW_TOKENS):
    out = srv.post("/generate", {"input_ids": prompt, "return_logprob": True,
                                 "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens,
                                                     "ignore_eos": True}})
    meta = out["meta_info"]
    return ([t[1] for t in meta["output_token_logprobs"]], [t[0] for t in meta["output_token_logprobs"]],
            {k: meta.get(k) for k in SPEC_KEYS})


@pytest.fixture(scope="module")
def runs():
    _need_sglang()
    servers = start_together({"on": (BASE + SPEC + ["--ess-hot-slots-per-request", str(HOT)], ENV),
                              "off": (BASE + SPEC + ["--ess-enabled", "false"], ENV),
                              "plain": (BASE + ["--ess-enabled", "false"], ENV),
                              "da": (BASE + SPEC + ["--ess-hot-slots-per-request", str(HOT), "--ess-prefetch-engine",
                                                    "worker"], ENV)}, prefix="dsv4_mtp_")
    out = {}
    try:
        for name, srv in servers.items():
            with cf.ThreadPoolExecutor(3) as ex:
                out[name] = list(ex.map(lambda p, srv=srv: _generate(srv, p), ALL_PROMPTS))
            first = _generate(srv, TURN1, TURN1_TOKENS)
            out[name + "_turns"] = [first, _generate(srv, TURN1 + first[0] + [7, 8, 9] * 10)]
            out[name + "_log"] = srv.log_tail(100000)
            if name in ("on", "da"):
                out[name + "_usage"] = srv.ess_usage()
                # a request aborted mid-generation (its verify steps running), then rows back to zero
                out[name + "_aborted"] = srv.generate_then_abort(
                    {"input_ids": PROMPTS[0], "sampling_params": {"temperature": 0, "max_new_tokens": 400,
                                                                  "ignore_eos": True}}, after_s=3.0)
                out[name + "_zero"] = srv.wait_ess_zero(timeout_s=120)
    finally:
        stop_all(servers)
    return out


def test_mtp_ess_on_equals_off(runs):
    for i, (on, off) in enumerate(zip(runs["on"], runs["off"])):
        assert len(on[0]) == NEW_TOKENS
        assert on[0] == off[0], f"request {i}: tokens differ ESS on vs off ({on[0]} vs {off[0]})"
        assert on[1] == off[1], f"request {i}: log-probs differ"
        assert on[2] == off[2] and on[2]["spec_verify_ct"], f"request {i}: speculation {on[2]} vs {off[2]}"
    assert len({tuple(r[0]) for r in runs["on"]}) > 1
    assert "Traceback" not in runs["on_log"] and "Traceback" not in runs["off_log"]


def test_second_turn_on_a_cached_answer(runs):
    """The second turn starts after the first turn's cached page, which ends in answer tokens: ESS on equals
    ESS off and reuses the page's entries from host; the post-verify hook ran in the real server
    (mtp_finalized_entries). Here the page's last entries were also written by the turn's later verifies, so
    this does not fail without the hook; test_dsv4_ess_verify's finished-prefix test is the one that does
    (a prefix whose last entries only the post-verify call writes)."""
    for i, (on, off) in enumerate(zip(runs["on_turns"], runs["off_turns"])):
        assert on[0] == off[0] and on[1] == off[1], f"turn {i + 1}: ESS on differs from off"
    u = runs["on_usage"]
    assert u["reused_entries"] >= 256 // 4 and u["mtp_finalized_entries"] > 0, u


def test_drafts_were_accepted(runs):
    """The repetitive prompt: drafts accepted, so fewer verify steps than output tokens after the first."""
    verify, correct = runs["off"][-1][2]["spec_verify_ct"], runs["off"][-1][2]["spec_num_correct_drafts"]
    assert correct and correct > 0 and verify < NEW_TOKENS - 1, runs["off"][-1][2]


def test_mtp_changes_no_greedy_token(runs):
    for i, (spec, plain) in enumerate(zip(runs["off"], runs["plain"])):
        assert spec[0] == plain[0], f"request {i}: MTP's tokens {spec[0]} differ from decode's {plain[0]}"


def test_mtp_counters_and_rows_back_to_zero(runs):
    u = runs["on_usage"]
    assert u["host_row_unit"] == "C4 entry" and u["c4_layers"] == [2, 4], u
    assert u["verify_steps"] > 0 and u["single_steps"] == u["dual_steps"] == 0, u   # the target only verifies
    assert all(m > 0 for m in u["misses_per_layer"]), u
    assert u["mtp_overflow_entries"] > 0, u          # 4 top-32 sets over 40 hot entries
    assert "draft" not in u or not u["draft"], u     # the draft's window-only layer: no store
    for name in ("on", "da"):
        aborted = runs[name + "_aborted"]
        meta = aborted.get("meta_info", {}) if isinstance(aborted, dict) else {}
        assert meta.get("completion_tokens", 0) < 400, (name, "the abort did not stop the request", meta)
        assert not isinstance(aborted, dict) or "abort" in str(meta.get("finish_reason")).lower(), (name, meta)
        z = runs[name + "_zero"]
        assert z["host_tokens_live"] == 0 and z["hot_slots_used"] == 0 and z["hot_requests_open"] == 0, (name, z)


def test_worker_engine_overlaps_the_verify_fetch(runs):
    u = runs["da_usage"]
    assert u["engine"] == "worker" and u["overlap_level"] == "da", u
    assert u["verify_dual_steps"] > 0 and all(m > 0 for m in u["misses_per_layer"]), u
    assert all(len(r[0]) == NEW_TOKENS for r in runs["da"])
    assert "Traceback" not in runs["da_log"]
    same = sum(a[0] == b[0] for a, b in zip(runs["da"], runs["off"]))
    print(f"MTP at da on the worker engine: {same} of {len(ALL_PROMPTS)} requests' greedy tokens equal ESS off's")
