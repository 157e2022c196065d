"""The route policy (issue 20): one table, the auth matrix, and redaction of secrets."""

import pytest

from sgl_ess.serving import route_policy as rp
from sgl_ess.serving.redact import REDACTED, redact, redact_argv, redact_command_line, redact_repr, secret_name

USER, ADMIN = "user-key-123", "admin-key-456"
MATRIX = {   # keys configured -> Keys
    "none": rp.Keys(),
    "user": rp.Keys(api_key=USER),
    "admin": rp.Keys(admin_api_key=ADMIN),
    "both": rp.Keys(api_key=USER, admin_api_key=ADMIN),
}
EXAMPLE = {rp.PUBLIC: "/health", rp.INFERENCE: "/generate", rp.STATUS: "/server_info",
           rp.OPERATOR: "/abort_request", rp.BLOCKING: "/init_weights_update_group"}
# (class, configured, presented) -> status; presented: None / "user" / "admin" / "wrong"
EXPECTED = {
    (rp.PUBLIC, "none"): {None: 0, "wrong": 0}, (rp.PUBLIC, "both"): {None: 0, "wrong": 0},
    (rp.INFERENCE, "none"): {None: 0, "wrong": 0},
    (rp.INFERENCE, "user"): {None: 401, "wrong": 401, "user": 0},
    (rp.INFERENCE, "admin"): {None: 0, "admin": 0},
    (rp.INFERENCE, "both"): {None: 401, "wrong": 401, "user": 0, "admin": 0},
    (rp.STATUS, "user"): {None: 401, "user": 0}, (rp.STATUS, "both"): {None: 401, "user": 0, "admin": 0},
    (rp.OPERATOR, "none"): {None: 403, "wrong": 403},
    (rp.OPERATOR, "user"): {None: 403, "user": 403},
    (rp.OPERATOR, "admin"): {None: 401, "wrong": 401, "admin": 0},
    (rp.OPERATOR, "both"): {None: 401, "user": 401, "admin": 0},
    (rp.BLOCKING, "none"): {None: 403}, (rp.BLOCKING, "both"): {None: 403, "admin": 403},
}


@pytest.mark.parametrize("cls,configured", sorted(EXPECTED))
def test_auth_matrix(cls, configured):
    keys = MATRIX[configured]
    tokens = {None: None, "user": USER, "admin": ADMIN, "wrong": "nope"}
    got = {p: rp.decide(EXAMPLE[cls], tokens[p], keys).status for p in EXPECTED[(cls, configured)]}
    assert got == EXPECTED[(cls, configured)], (cls, configured, got)


def test_blocking_routes_follow_operator_rules_once_enabled():
    keys = rp.Keys(admin_api_key=ADMIN, enable_blocking_routes=True)
    assert rp.decide("/init_weights_update_group", ADMIN, keys).allowed
    assert rp.decide("/init_weights_update_group", None, keys).status == 401
    assert rp.decide("/init_weights_update_group", ADMIN, rp.Keys(enable_blocking_routes=True)).status == 403


def test_internal_token_acts_as_admin_and_is_not_a_user_key():
    keys = rp.Keys(api_key=USER, internal_token="tok")
    assert rp.decide("/generate", "tok", keys).allowed
    assert rp.decide("/abort_request", "tok", keys).status == 403          # operator routes still off
    assert rp.decide("/generate", "", keys).status == 401


def test_launcher_freeze_gc_is_allowed_for_the_internal_token_only_even_without_an_admin_key():
    """SGLang's launcher POSTs /freeze_gc after warmup; with operator routes off that was a 403 and a
    traceback in the default server's start-up log."""
    for keys in (rp.Keys(internal_token="tok"), rp.Keys(api_key=USER, admin_api_key=ADMIN, internal_token="tok")):
        assert rp.decide("/freeze_gc", "tok", keys).allowed
        assert not rp.decide("/freeze_gc", None, keys).allowed and not rp.decide("/freeze_gc", USER, keys).allowed
    assert rp.decide("/freeze_gc", "tok", rp.Keys()).status == 403          # no internal token configured
    assert rp.decide("/flush_cache", "tok", rp.Keys(internal_token="tok")).status == 403


def test_unclassified_path_is_refused_and_patterns_match():
    assert rp.decide("/definitely_not_a_route", None, rp.Keys()).status == 404
    assert rp.classify("/v1/models/tiny/x") == rp.STATUS
    assert rp.classify("/v1/responses/abc/cancel") == rp.INFERENCE
    assert rp.classify("/dumper/start") == rp.OPERATOR
    assert rp.classify("/metrics/") == rp.STATUS


def test_bearer_parsing():
    assert rp.bearer("Bearer abc") == "abc"
    assert rp.bearer("bearer  abc ") == "abc"
    assert rp.bearer("Basic abc") is None and rp.bearer("") is None and rp.bearer("Bearer ") is None


def test_secret_names_and_redaction():
    assert secret_name("api_key") and secret_name("admin_api_key") and secret_name("--admin-api-key")
    assert secret_name("hf_token") and secret_name("ssl_keyfile_password")
    for name in ("max_total_tokens", "skip_tokenizer_init", "bos_token_id", "kv_cache_dtype", "tokenizer_path",
                 "bucket_time_to_first_token", "speculative_token_map", "max_new_tokens"):
        assert not secret_name(name), name
    body = {"api_key": USER, "admin_api_key": None, "nested": [{"hf_token": "t"}],
            "launch_command": f"python -m x --api-key {USER} --port 1", "max_total_tokens": 5}
    out = redact(body, [USER])
    assert out["api_key"] == REDACTED and out["admin_api_key"] is None and out["nested"][0]["hf_token"] == REDACTED
    assert USER not in out["launch_command"] and out["max_total_tokens"] == 5
    assert redact_argv(["--api-key", USER, "--port", "1", f"--admin-api-key={ADMIN}"]) == \
        ["--api-key", REDACTED, "--port", "1", f"--admin-api-key={REDACTED}"]
    assert USER not in redact_command_line(f"sglang --api-key {USER} --max-total-tokens 5")
    assert "--max-total-tokens 5" in redact_command_line(f"sglang --api-key {USER} --max-total-tokens 5")


def test_log_repr_redaction():
    line = "server_args=ServerArgs(model_path='m', ssl_keyfile_password='hunter2', api_key=None, port=1, " \
           "admin_api_key=\"s3cr3t\", speculative_token_map='/x/map.pt')"
    out = redact_repr(line)
    assert "hunter2" not in out and "s3cr3t" not in out
    assert "model_path='m'" in out and "api_key=None" in out and "speculative_token_map='/x/map.pt'" in out
