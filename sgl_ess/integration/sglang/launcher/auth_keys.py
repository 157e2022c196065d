"""The server's API keys: taken from the command line by the launcher and kept in this process only.

``--api-key`` / ``--admin-api-key`` are removed from the arguments SGLang sees, so SGLang's own
auth middleware is not installed (the route guard is the one policy), and no key can surface in
``/server_info``, ``launch_command`` or SGLang's ``server_args`` log lines. SGLang's warmup
requests (the default of ``launch_server(execute_warmup_func=)``, then ``/freeze_gc``) authenticate
with a random internal token: the launcher passes ``warmup_func`` as that argument, which sets
the token as SGLang's key for the warmup only; ``end_warmup`` (from the launch callback) restores
SGLang's value (none). The token is never logged and is redacted from every status body.
"""

from __future__ import annotations

import inspect
import logging
from typing import Optional

from sgl_ess.serving.route_policy import Keys

logger = logging.getLogger("sgl_ess")
KEY_FLAGS = ("--api-key", "--admin-api-key")
_override = None


def take_keys(argv: list[str]) -> tuple[list[str], dict[str, Optional[str]]]:
    """(argv without the key flags, {flag: value}). A key flag without a value is left for SGLang's
    own parser to refuse."""
    out, found, i = [], {f: None for f in KEY_FLAGS}, 0
    while i < len(argv):
        a = argv[i]
        flag = next((f for f in KEY_FLAGS if a == f or a.startswith(f + "=")), None)
        if flag is None:
            out.append(a)
        elif "=" in a:
            found[flag] = a.split("=", 1)[1]
        elif i + 1 < len(argv):
            found[flag] = argv[i + 1]
            i += 1
        else:
            out.append(a)
        i += 1
    return out, found


def warmup_func(keys: Keys):
    """SGLang's own warmup, authenticated with the internal token."""
    def run(server_args):
        global _override
        from sglang.srt.entrypoints.http_server import launch_server
        from sglang.srt.runtime_context import get_serving

        sglang_warmup = inspect.signature(launch_server).parameters["execute_warmup_func"].default
        _override = get_serving().override(api_key=keys.internal_token, admin_api_key=keys.internal_token)
        _override.__enter__()
        return sglang_warmup(server_args)
    return run


def end_warmup() -> None:
    global _override
    if _override is not None:
        _override.__exit__(None, None, None)
        _override = None


def startup_line(keys: Keys) -> str:
    user = "set" if keys.api_key else "not set (inference and status routes are open to anyone who can connect)"
    admin = "set" if keys.admin_api_key else ("not set: operator routes (abort, flush, pause, weights, profiler, "
                                              "logging, /ess/overlap_level) are OFF")
    blocking = "on" if keys.enable_blocking_routes else "off"
    return f"sgl_ess.launch_server: auth: user key {user}; admin key {admin}; blocking routes {blocking}"
