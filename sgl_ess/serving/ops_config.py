"""Operator settings of the launcher: request-guard limits and metrics, one table.

Flag ``--<name with dashes>``; the launcher passes the validated values to its own modules as JSON
in ``SGLESS_OPS``. No torch, no sglang.

| field                      | default | what it bounds                                                   |
| -------------------------- | ------- | ---------------------------------------------------------------- |
| guard_max_n                | 8       | ``n`` (completions, chat) and ``sampling_params.n`` (/generate)  |
| guard_max_batch            | 64      | prompts in one request (a list ``prompt`` / ``text`` / ids)       |
| guard_max_top_logprobs     | 20      | ``logprobs`` (completions), ``top_logprobs``, ``top_logprobs_num`` |
| guard_allow_any_model      | false   | accept any ``model`` name (SGLang's own behaviour)               |
| metrics_link_gb_per_s      | 25.0    | host->device link bandwidth the saturation alert compares with   |
| health_timeout_s           | 20.0    | how long /health waits for the scheduler before answering 503    |
| guard_max_body_mb          | 8.0     | request body size (MiB), checked before anything is parsed       |
| guard_enable_blocking_routes | false | weight-update-group / remote-instance routes (route_policy.py)   |
| guard_blocking_timeout_s   | 30.0    | how long one of those may take before the client gets a 504      |
| guard_operator_output_dir  | ""      | the only directory request dumps and profiler traces may go to   |
| ess_drain_timeout_s        | 30.0    | after SIGTERM: how long running requests may finish, then exit 0 |
| guard_max_pattern_kb       | 64      | each stop_regex / regex / json_schema / ebnf / structural tag     |
| guard_allow_backtracking_stop_regex | false | stop_regex RE2 cannot compile goes to Python re (budgeted) |
| guard_pattern_budget_ms    | 250     | one request's stop_regex evaluation in one scheduler step        |
| guard_header_timeout_s     | 20.0    | time for a connection to send a complete request head (0: none)  |
| guard_max_connections_per_client | 256 | open connections from one client address (0: no bound)       |
| guard_step_watchdog_s      | 30.0    | one scheduler step, before it is logged and /health says so      |
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, fields

ENV_OPS_JSON = "SGLESS_OPS"


class OpsConfigError(ValueError):
    """A ``--guard-*`` / ``--metrics-*`` / ``--health-*`` value was refused."""


@dataclass(frozen=True)
class OpsConfig:
    guard_max_n: int = 8
    guard_max_batch: int = 64
    guard_max_top_logprobs: int = 20
    guard_allow_any_model: bool = False
    metrics_link_gb_per_s: float = 25.0
    health_timeout_s: float = 20.0
    guard_max_body_mb: float = 8.0
    guard_enable_blocking_routes: bool = False
    guard_blocking_timeout_s: float = 30.0
    guard_operator_output_dir: str = ""
    ess_drain_timeout_s: float = 30.0
    guard_max_pattern_kb: float = 64.0
    guard_allow_backtracking_stop_regex: bool = False
    guard_pattern_budget_ms: float = 250.0
    guard_header_timeout_s: float = 20.0
    guard_max_connections_per_client: int = 256
    guard_step_watchdog_s: float = 30.0
    # filled by the launcher, not flags
    enable_metrics: bool = False
    enable_deterministic_inference: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


HELP = {
    "guard_max_n": "Largest 'n' (completions per prompt) a request may ask for; larger is refused with 400.",
    "guard_max_batch": "Most prompts in one request (a list 'prompt', 'text' or 'input_ids'); more is refused with 400.",
    "guard_max_top_logprobs": "Largest 'logprobs' / 'top_logprobs' / 'top_logprobs_num' (alternatives per token).",
    "guard_allow_any_model": "Accept any 'model' name in requests (SGLang's behaviour). Default: unknown names get 404.",
    "metrics_link_gb_per_s": "Host->device link bandwidth in GB/s; exported as sgless_transfer_link_bytes_per_second "
                             "for the 'transfer bandwidth saturated' alert.",
    "health_timeout_s": "Seconds /health waits for each scheduler's ESS state before answering 503.",
    "guard_max_body_mb": "Largest request body in MiB; a larger one is refused with 413 before it is parsed.",
    "guard_header_timeout_s": "Seconds a connection has to send a complete request line and headers (from "
                              "connecting, and from the first byte of each later request); then it is closed "
                              "(slow-header clients). 0: no deadline.",
    "guard_max_connections_per_client": "Open connections allowed from one client address; one more is answered "
                                        "503 and closed. Behind a proxy every client has the proxy's address: "
                                        "raise it there. 0: no bound.",
    "guard_enable_blocking_routes": "Serve the routes that can block the scheduler in a rendezvous with a peer the "
                                    "request names (/init_weights_update_group, /update_weights_from_distributed, "
                                    "remote-instance weight transfer); they also need --admin-api-key.",
    "guard_blocking_timeout_s": "With --guard-enable-blocking-routes: seconds one such request may take before "
                                "the client gets a 504 (the named peer must accept a connection first).",
    "guard_operator_output_dir": "The only directory (and below) that /configure_logging request dumps and "
                                 "/start_profile traces may be written to. Unset: requests naming a directory "
                                 "there are refused.",
    "ess_drain_timeout_s": "After SIGTERM: new requests get 503 at once; running ones may finish for this many "
                           "seconds, then every stream ends with an error event and the server exits 0.",
    "guard_max_pattern_kb": "Largest client pattern in KiB: each stop_regex, and a regex / json_schema / ebnf / "
                            "structural-tag grammar (the grammar compile cannot be interrupted); larger is a 400.",
    "guard_allow_backtracking_stop_regex": "Accept stop_regex patterns RE2 cannot compile (backreferences, "
                                           "lookaround) and evaluate them with Python re, bounded only by "
                                           "--guard-pattern-budget-ms. Default: refused with 400.",
    "guard_pattern_budget_ms": "Milliseconds one request's stop_regex patterns may take in one scheduler step; "
                               "a request over it is aborted with an error naming this budget.",
    "guard_step_watchdog_s": "Seconds one scheduler step may take before the watchdog logs its requests, /health "
                             "answers 503 saying why (until the step ends), and a request whose stop_regex is "
                             "being evaluated is aborted.",
}
FLAG_FIELDS = tuple(HELP)
MINIMUM = {"guard_header_timeout_s": 0.0, "guard_max_connections_per_client": 0,
           "guard_max_n": 1, "guard_max_batch": 1, "guard_max_top_logprobs": 0, "metrics_link_gb_per_s": 1e-9,
           "health_timeout_s": 0.1, "guard_max_body_mb": 1e-3, "guard_blocking_timeout_s": 0.1,
           "ess_drain_timeout_s": 0.0, "guard_max_pattern_kb": 0.001, "guard_pattern_budget_ms": 1.0,
           "guard_step_watchdog_s": 0.1}


def add_ops_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Request guard and operations (sgl-ess)",
                                  "Limits checked before SGLang sees a request; metrics and health settings.")
    defaults = OpsConfig()
    for name in FLAG_FIELDS:
        flag = "--" + name.replace("_", "-")
        kind = type(getattr(defaults, name))
        meta = {bool: "BOOL", str: "DIR"}.get(kind, kind.__name__.upper())
        g.add_argument(flag, dest="ops_" + name, default=None, metavar=meta,
                       help=f"{HELP[name]} (default: {getattr(defaults, name)})")
    for who, env in (("api", "SGLESS_API_KEY"), ("admin-api", "SGLESS_ADMIN_API_KEY")):
        g.add_argument(f"--{who}-key-file", dest=f"{who.replace('-', '_')}_key_file", default=None, metavar="PATH",
                       help=f"Read the --{who}-key from PATH (one line) rather than the command line, where every "
                            f"local user can read it; or set {env}. One source per key.")


def build_ops_config(ns: argparse.Namespace, **launcher_facts) -> OpsConfig:
    """Validated OpsConfig from parsed flags (None = not given). Raises OpsConfigError."""
    values = {}
    types = {f.name: f.type for f in fields(OpsConfig)}
    defaults = OpsConfig()
    for name in FLAG_FIELDS:
        raw = getattr(ns, "ops_" + name, None)
        if raw is None:
            continue
        flag = "--" + name.replace("_", "-")
        kind = type(getattr(defaults, name))
        if kind is str:
            values[name] = os.path.realpath(str(raw)) if raw else ""
            if raw and not os.path.isdir(values[name]):
                raise OpsConfigError(f"flag {flag}: got {raw!r}; expected an existing directory")
            continue
        if kind is bool:
            if str(raw).lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise OpsConfigError(f"flag {flag}: got {raw!r}; expected true or false")
            values[name] = str(raw).lower() in ("1", "true", "yes", "on")
            continue
        try:
            v = kind(raw)
        except ValueError:
            raise OpsConfigError(f"flag {flag}: got {raw!r}; expected {'an integer' if kind is int else 'a number'}")
        if v < MINIMUM[name]:
            raise OpsConfigError(f"flag {flag}: got {raw!r}; expected a value >= {MINIMUM[name]:g}")
        values[name] = v
    assert set(launcher_facts) <= set(types), launcher_facts
    return OpsConfig(**values, **launcher_facts)


def ops_from_env(environ=None) -> OpsConfig:
    environ = os.environ if environ is None else environ
    text = environ.get(ENV_OPS_JSON)
    return OpsConfig(**json.loads(text)) if text else OpsConfig()
