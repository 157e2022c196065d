"""Issue 38: client patterns checked at ingress (pattern_bound.py), stop regexes evaluated with RE2
within a budget (stop_regex_eval.py), the pre-tokenization prompt bound (prompt_bound.py), and the
request rules that turn malformed values SGLang answered with a 500 into 400s."""

import json
import random
import re
import threading

import pytest

from sgl_ess.serving.ops_config import OpsConfig
from sgl_ess.serving.pattern_bound import (BACKTRACK_FLAG, SIZE_FLAG, PatternLimits, check_grammar,
                                           check_openai_patterns, check_stop_regex)
from sgl_ess.serving.prompt_bound import max_chars_per_token, prompt_too_long
from sgl_ess.serving.request_rules import ServingFacts, check
from sgl_ess.serving.stop_regex_eval import BUDGET_FLAG, PatternBudgetExceeded, budget_for, compiled

STRICT = PatternLimits(max_pattern_bytes=1024, allow_backtracking=False)
LENIENT = PatternLimits(max_pattern_bytes=1024, allow_backtracking=True)
BACKTRACKER = "(?:.|.)*\u0001"              # the 15-byte pattern: exponential in Python re


def test_stop_regex_that_does_not_compile_is_named():
    p = check_stop_regex("stop_regex", "(", STRICT)
    assert p.param == "stop_regex" and "does not compile" in p.message
    p = check_stop_regex("stop_regex", ["a", "[z-a]"], STRICT)
    assert p.param == "stop_regex[1]"
    assert check_stop_regex("stop_regex", 5, STRICT).message.startswith("stop_regex: got 5; expected a string")
    assert check_stop_regex("stop_regex", ["a", 5], STRICT).param == "stop_regex[1]"


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)b", r"(?<!x)y", r"(?P<n>a)(?P=n)"])
def test_patterns_re2_cannot_evaluate_are_refused_naming_the_flag_unless_it_is_on(pattern):
    p = check_stop_regex("stop_regex", pattern, STRICT)
    assert p is not None and BACKTRACK_FLAG in p.message and "RE2" in p.message, p
    assert check_stop_regex("stop_regex", pattern, LENIENT) is None


def test_the_backtracking_pattern_is_accepted_because_re2_evaluates_it_in_linear_time():
    assert check_stop_regex("stop_regex", BACKTRACKER, STRICT) is None
    rx, engine = compiled(BACKTRACKER, False)
    assert engine == "re2"
    budget = budget_for(1000.0, False)
    assert budget.search(BACKTRACKER, "a" * 100_000) is False     # Python re would not finish this
    assert budget.search(BACKTRACKER, "ab\u0001") is True


def test_pattern_size_is_bounded_naming_the_flag():
    p = check_stop_regex("stop_regex", "a" * 1025, STRICT)
    assert p and SIZE_FLAG in p.message and "1025 bytes" in p.message
    p = check_grammar("sampling_params.ebnf", "root ::= " + "\"a\" " * 400, STRICT)
    assert p and SIZE_FLAG in p.message


def test_json_schema_must_parse_and_nest_boundedly():
    assert "not valid JSON" in check_grammar("json_schema", "{bad", STRICT).message
    deep = {"type": "object"}
    for _ in range(80):
        deep = {"type": "object", "properties": {"x": deep}}
    assert "nested more than" in check_grammar("json_schema", json.dumps(deep), PatternLimits(1 << 20, False)).message
    assert check_grammar("json_schema", json.dumps({"type": "string"}), STRICT) is None
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}}
    p = check_openai_patterns(body, PatternLimits(1 << 20, False))
    assert p.param == "response_format.json_schema.schema" and "nested more than" in p.message


def test_re2_and_python_re_agree_on_ascii_text():
    """The scheduler's answer (RE2) is Python re's for the patterns both accept, on random ASCII text."""
    rng = random.Random(38)
    patterns = [r"\d+\s*$", r"(?:ab|ba)+c", r"[A-Z][a-z]{2,}", r"^\w+\.", r"(x|y)*z$", r"\bend\b", BACKTRACKER]
    budget = budget_for(5000.0, False)
    for _ in range(200):
        text = "".join(rng.choice("abcxyzAB .\n0123end\u0001") for _ in range(rng.randint(0, 18)))
        for p in patterns:
            assert budget.search(p, text) == (re.search(p, text) is not None), (p, text)


def test_budget_interrupts_python_re_and_names_the_flag():
    """With backtracking allowed, a pattern RE2 cannot compile runs in Python re under a deadline."""
    pattern = "(?:.|.)*(?=\u0001)"                              # lookaround: RE2 refuses it
    assert compiled(pattern, True)[1] == "re"
    budget = budget_for(50.0, True)
    with pytest.raises(PatternBudgetExceeded):
        budget.search(pattern, "a" * 60)                          # 2**60 steps unbounded
    assert budget.spent_s >= 0.05
    assert BUDGET_FLAG in budget.message("r1") and "50 ms" in budget.message("r1")
    with pytest.raises(ValueError, match="--guard-allow-backtracking-stop-regex"):
        compiled(pattern, False)


def test_budget_off_the_main_thread_is_checked_after_the_search():
    out = {}

    def run():
        b = budget_for(0.001 * 1e3, True)                        # 1 ms
        try:
            b.search("(?:.|.)*(?=\u0001)", "a" * 18)             # 2**18 backtracking paths: over 1 ms
            out["r"] = "finished"
        except PatternBudgetExceeded:
            out["r"] = "exceeded"
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert out["r"] == "exceeded"


BYTE_LEVEL = {
    "model": {"type": "BPE", "vocab": {}},
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "behavior": "Isolated"},
                                                          {"type": "ByteLevel"}]},
    "added_tokens": [{"content": "<|a_long_special_token_here|>"}],
}


def _byte_level(extra_vocab):
    from sgl_ess.serving.prompt_bound import _byte_chars

    j = json.loads(json.dumps(BYTE_LEVEL))
    j["model"]["vocab"] = {c: i for i, c in enumerate(_byte_chars())}
    j["model"]["vocab"].update({k: 300 + i for i, k in enumerate(extra_vocab)})
    return j


def test_max_chars_per_token_from_a_byte_level_bpe_description():
    m, why = max_chars_per_token(_byte_level(["ĠĠĠĠĠĠĠĠĠĠĠĠ", "hello"]))
    assert m == len("<|a_long_special_token_here|>"), why
    j = _byte_level(["x" * 40])
    assert max_chars_per_token(j)[0] == 40


@pytest.mark.parametrize("change,reason", [
    (lambda j: j.update(normalizer={"type": "NFKC"}), "normalizer"),
    (lambda j: j["model"].update(type="Unigram"), "not BPE"),
    (lambda j: j.update(pre_tokenizer={"type": "Whitespace"}), "not byte-level"),
    (lambda j: j["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed"), "remove"),
    (lambda j: j["model"]["vocab"].pop("Ġ"), "missing"),
])
def test_max_chars_per_token_is_unknown_where_the_argument_does_not_hold(change, reason):
    j = _byte_level([])
    change(j)
    m, why = max_chars_per_token(j)
    assert m is None and reason in why, why


def test_a_prompt_is_refused_only_when_it_provably_cannot_fit():
    assert prompt_too_long(4095 * 32, 4096, 32) is None            # could be 4095 tokens
    why = prompt_too_long(4096 * 32, 4096, 32)
    assert why and "at least 4096 tokens" in why
    assert prompt_too_long(10 ** 9, None, 32) is None and prompt_too_long(10 ** 9, 4096, None) is None


def test_the_bound_holds_for_a_real_tokenizer():
    """On the embedded model's tokenizer: tokens >= ceil(characters / M) for random text."""
    tokenizers = pytest.importorskip("transformers")
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[3] / "sgl_ess" / "models" / "tiny_dsv32"
    tok = tokenizers.AutoTokenizer.from_pretrained(str(path))
    from sgl_ess.serving.prompt_bound import max_chars_from_tokenizer

    m, why = max_chars_from_tokenizer(tok)
    assert m is not None, why
    rng = random.Random(7)
    alphabet = "abcdefghij     \n\t0123456789éß中文😀<|>" + "".join(a["content"] for a in [{"content": "<|im_end|>"}])
    for _ in range(50):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3000)))
        n = len(tok.encode(text, add_special_tokens=False))
        assert n >= -(-len(text) // m), (n, len(text), m)
    assert len(tok.encode(" " * 5000, add_special_tokens=False)) >= 5000 / m


FACTS = ServingFacts(vocab_size=2048, model_names=("default",), deterministic=False, context_len=4096,
                     max_chars_per_token=32)
MALFORMED = [   # (path, body, the field the 400 names): each was a 500 with a traceback in SGLang 0.5.23
    ("/generate", {"text": "hi", "sampling_params": {"stop_regex": "("}}, "sampling_params.stop_regex"),
    ("/v1/completions", {"prompt": "hi", "stop_regex": "("}, "stop_regex"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stop_regex": ["(", "a"]},
     "stop_regex[0]"),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ("/generate", {"text": "a", "sampling_params": [{}, {}]}, "sampling_params"),
    ("/generate", {"text": "hi", "sampling_params": {"custom_params": json.loads('{"a":' * 900 + "1" + "}" * 900)}},
     "sampling_params.custom_params"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "x"},
     "chat_template_kwargs"),
    ("/v1/detokenize", {"tokens": [99999]}, "tokens[0]"),
    ("/detokenize", {"tokens": [[1, 2], [3, -1]]}, "tokens[1][1]"),
    ("/generate", {"input_embeds": [], "sampling_params": {}}, "input_embeds"),
    ("/generate", {"text": "x" * (4096 * 32)}, "text"),
    ("/v1/completions", {"prompt": ["ok", "x" * (4096 * 32)]}, "prompt[1]"),
    ("/generate", {"input_ids": [5] * 4096}, "input_ids"),
    ("/generate", {"text": "hi", "sampling_params": "x"}, "sampling_params"),
]


@pytest.mark.parametrize("path,body,param", MALFORMED, ids=[f"{p}:{f}" for p, _, f in MALFORMED])
def test_malformed_values_are_refused_naming_the_field(path, body, param):
    r = check(path, body, OpsConfig(), FACTS)
    assert r is not None and r.status == 400 and r.param == param, r
    assert r.message.startswith(param), r.message


def test_well_formed_values_pass():
    for path, body in [
        ("/generate", {"text": ["a", "b"], "sampling_params": [{"stop_regex": r"\d+$"}, {}]}),
        ("/v1/completions", {"prompt": "x" * (4095 * 32), "stop_regex": BACKTRACKER}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"a": 1}}),
        ("/v1/detokenize", {"tokens": [1, 2, 2047]}),
        ("/generate", {"input_ids": [5] * 4095}),
    ]:
        assert check(path, body, OpsConfig(), FACTS) is None, body
