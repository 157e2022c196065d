"""The pure serving policy (sgl_ess.serving): guard rules, admission, pool sizing, sanitizing."""

import pytest

from sgl_ess.serving.admission import refuse_reason
from sgl_ess.serving.ops_config import OpsConfig
from sgl_ess.serving.preflight import (ModelGeometry, PreflightError, check_hot_slots, pool_tokens_from_gb,
                                       resolve_pool_tokens)
from sgl_ess.serving.request_rules import ServingFacts, check
from sgl_ess.serving.sanitize import leaks, scrub

OPS = OpsConfig()
FACTS = ServingFacts(vocab_size=2048, model_names=("tiny", "default"), deterministic=False)
GEO = ModelGeometry(layers=2, latent_row_bytes=160, index_topk=32, vocab_size=2048)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": [1, 2048]}, "prompt[1]"),
    ("/v1/completions", {"prompt": [[1], [-3]]}, "prompt[1][0]"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": ["a"] * 65}, "prompt"),
    ("/v1/completions", {"prompt": "a", "n": 9}, "n"),
    ("/v1/completions", {"prompt": "a", "n": True}, "n"),
    ("/v1/completions", {"prompt": "a", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "a", "seed": 1}, "seed"),
    ("/v1/completions", {"prompt": "a", "model": "other"}, "model"),
    ("/v1/chat/completions", {"messages": [], "model": "tiny"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "top_logprobs": 50}, "top_logprobs"),
    ("/generate", {"text": ["a", ""]}, "text[1]"),
    ("/generate", {"input_ids": [3, 5000]}, "input_ids[1]"),
    ("/generate", {"text": "a", "sampling_params": {"n": 0}}, "sampling_params.n"),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{}, {"sampling_seed": 3}]}, "sampling_params[1].sampling_seed"),
    ("/generate", {"text": "a", "top_logprobs_num": 100000}, "top_logprobs_num"),
])
def test_refusals_name_the_field(path, body, param):
    r = check(path, body, OPS, FACTS)
    assert r is not None and r.param == param and r.message.startswith(param + ":"), r
    assert r.status == (404 if param == "model" else 400)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "a", "n": 8, "logprobs": 20, "model": "default"}),
    ("/v1/completions", {"prompt": [0, 2047]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "model": "tiny", "top_logprobs": 5}),
    ("/generate", {"text": ["a", "b"], "sampling_params": {"n": 2, "max_new_tokens": 0}}),
    ("/v1/models", {"anything": 1}),
])
def test_valid_requests_pass(path, body):
    assert check(path, body, OPS, FACTS) is None


def test_limits_are_configurable_and_seed_passes_when_deterministic():
    ops = OpsConfig(guard_max_n=100, guard_allow_any_model=True)
    facts = ServingFacts(2048, ("tiny",), deterministic=True)
    assert check("/v1/completions", {"prompt": "a", "n": 100, "seed": 3, "model": "x"}, ops, facts) is None


def test_admission_refuses_what_can_never_fit_with_the_numbers():
    assert refuse_reason(3900, 100, 4096, 64, True) is None            # 4064 < 4096
    msg = refuse_reason(4030, 10, 4096, 64, True)
    assert msg and "4030" in msg and "4096" in msg and "4104" in msg and "--ess-memory-pool-size-gb" in msg
    assert refuse_reason(0, 5, 4096, 64, True).startswith("the prompt has no tokens")
    assert "expected an id in [0, 10)" in refuse_reason(2, 1, 4096, 64, False, vocab_size=10, token_ids=[1, 10])
    assert refuse_reason(4000, None, 4096, 64, True) is None            # unset max_new: first token fits


def test_admission_knows_the_pd_role():
    # prefill: the output length is the decode node's business (SGLang sets max_new_tokens 1 there)
    assert refuse_reason(3000, 100000, 4096, 64, True, role="prefill") is None
    assert refuse_reason(3000, 100000, 4096, 64, True) is not None                    # colocated: refused
    msg = refuse_reason(4040, 10, 4096, 64, True, role="prefill")
    assert msg and "Shorten the prompt below 4031" in msg and "max_tokens" not in msg
    # decode: --num-reserved-decode-tokens beyond the prompt, even for a short output
    assert refuse_reason(3600, 8, 4096, 64, True) is None                             # colocated: fits
    msg = refuse_reason(3600, 8, 4096, 64, True, role="decode", reserved_decode_tokens=512)
    assert msg and "decode node's host pool" in msg and "512 reserved decode tokens" in msg
    assert "Shorten the prompt below 3520" in msg and "4176" in msg                   # 3600 + 512 + 64
    assert refuse_reason(3400, 8, 4096, 64, True, role="decode", reserved_decode_tokens=512) is None
    msg = refuse_reason(3000, 2000, 4096, 64, True, role="decode", reserved_decode_tokens=512)
    assert msg and "Lower max_tokens / max_new_tokens to at most 1031" in msg                                              # the output is the rule
    with pytest.raises(ValueError, match="expected one of"):
        refuse_reason(10, 1, 4096, 64, True, role="Decode")


def test_pool_sizing_is_honest():
    assert pool_tokens_from_gb(0.0013312, GEO, 64) == 4096
    assert resolve_pool_tokens(True, 0.0013312, None, GEO, 64, 65536) == (4096, "--ess-memory-pool-size-gb 0.0013312")
    assert resolve_pool_tokens(True, 0.0013312, 4096, GEO, 64, 65536)[0] == 4096      # agreeing: fine
    with pytest.raises(PreflightError, match="--max-total-tokens 4000"):
        resolve_pool_tokens(True, 0.0013312, 4000, GEO, 64, 65536)
    assert resolve_pool_tokens(False, 5.0, None, GEO, 64, 16384) == (16384, "launcher default")
    with pytest.raises(PreflightError, match="index_topk=32 needs >= 33"):
        check_hot_slots(32, 0, GEO, 8)
    assert check_hot_slots(0, 0, GEO, 8) == 128


def test_scrub_removes_paths_and_tracebacks():
    raw = ('1 validation error:\n  {...}\n\n  File "/work/main/.venv/lib/python3.11/site-packages/sglang/srt/x.py", '
           'line 3, in f\n    POST /v1/completions')
    assert leaks(raw) and not leaks(scrub(raw)) and scrub(raw).startswith("1 validation error")
    assert scrub("Failed: [11:28:38] /project/cpp/regex_converter.cc:83: bad") == "Failed: [11:28:38] <path>: bad"
    assert scrub("Traceback (most recent call last):\n  boom") == "invalid request"
