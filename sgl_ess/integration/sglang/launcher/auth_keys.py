"""The server's API keys: taken from the command line by the launcher and kept in this process only.

``--api-key`` / ``--admin-api-key`` are removed from the arguments SGLang sees, so SGLang's own
auth middleware is not installed (the route guard is the one policy), and no key can surface in
``/server_info``, ``launch_command`` or SGLang's ``server_args`` log lines. SGLang's warmup
requests (the default of ``launch_server(execute_warmup_func=)``, then ``/freeze_gc``) authenticate
with a random internal token: the launcher passes ``warmup_func`` as that argument, which sets
the token as SGLang's key for the warmup only; ``end_warmup`` (from the launch callback) restores
SGLang's value (none). The token is never logged and is redacted from every status body.

Where a key may come from, one source per key (two is a configuration error, exit 2):
  * ``--api-key-file PATH`` / ``--admin-api-key-file PATH``: the file's content, without its
    trailing newline (a file other users may read gets a warning);
  * ``SGLESS_API_KEY`` / ``SGLESS_ADMIN_API_KEY``: removed from this process's environment once
    read, so no process the launcher starts inherits them;
  * ``--api-key K`` / ``--admin-api-key K``: readable by every local user in ``/proc/PID/cmdline``
    of the launcher from its exec on. The launcher overwrites its own argument memory with a
    redacted command line (setproctitle) and its ``sys.argv`` (which multiprocessing hands to the
    processes it spawns) as soon as it has read the keys, and warns: in the second or so before
    that, and in any process listing taken then, the key is visible. Use the file or environment
    forms. The server's own processes are spawned (never forked), so their command lines are
    ``sglang::scheduler`` and the like, without the launcher's arguments.
"""

from __future__ import annotations

import inspect
import logging
import os
import stat
import sys
from typing import Optional

from sgl_ess.serving.ops_config import OpsConfigError
from sgl_ess.serving.redact import redact_argv
from sgl_ess.serving.route_policy import Keys

logger = logging.getLogger("sgl_ess")
KEY_FLAGS = ("--api-key", "--admin-api-key")
FILE_FLAGS = {"--api-key-file": "--api-key", "--admin-api-key-file": "--admin-api-key"}
ENV_KEYS = {"--api-key": "SGLESS_API_KEY", "--admin-api-key": "SGLESS_ADMIN_API_KEY"}
_override = None


def _take_flags(argv: list[str], flags) -> tuple[list[str], dict[str, Optional[str]]]:
    """(argv without `flags`, {flag: value}). A flag without a value is left in place."""
    out, found, i = [], {f: None for f in flags}, 0
    while i < len(argv):
        a = argv[i]
        flag = next((f for f in flags if a == f or a.startswith(f + "=")), None)
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


def read_key_file(flag: str, path: str) -> str:
    """The key in `path`: the file's content without one trailing newline (``\n`` or ``\r\n``); any other
    whitespace is part of the key. Raises OpsConfigError."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(64 * 1024 + 1)
        mode = os.stat(path).st_mode
    except (OSError, UnicodeDecodeError) as e:
        raise OpsConfigError(f"flag {flag}: cannot read {path!r} ({e.__class__.__name__}: {e.strerror or e}); "
                             f"expected a readable file holding the key") from None
    key = text[:-1] if text.endswith("\n") else text
    key = key[:-1] if key.endswith("\r") else key
    if not key or len(text) > 64 * 1024 or "\n" in key or "\r" in key:
        raise OpsConfigError(f"flag {flag}: {path!r} holds {'nothing' if not key else 'more than one line'}; "
                             f"expected the key on one line")
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        logger.warning("%s: %s is readable by other users (mode %o); chmod 600 it", flag, path, mode & 0o777)
    return key


def take_keys(argv: list[str], environ=None, key_files=None) -> tuple[list[str], dict[str, Optional[str]]]:
    """(argv without any key flag, {"--api-key": key or None, "--admin-api-key": ...}) from the
    command line, the key files and the environment (module docstring). A key flag without a value
    is left in argv for SGLang's own parser to refuse. `key_files`: the launcher's parsed flags
    (``api_key_file`` / ``admin_api_key_file``, ops_config.add_ops_args): the launcher's parser takes
    the key-file flags, so they never appear in `argv`.
    Raises OpsConfigError when a key is given twice. Environment variables read here are removed
    from `environ`; a key given on the command line makes this process hide it
    (hide_keys_from_cmdline)."""
    environ = os.environ if environ is None else environ
    argv, on_cmdline = _take_flags(argv, KEY_FLAGS)
    files = {f: getattr(key_files, f[2:].replace("-", "_"), None) for f in FILE_FLAGS}
    found: dict[str, Optional[str]] = {}
    for flag in KEY_FLAGS:
        file_flag = next(f for f, k in FILE_FLAGS.items() if k == flag)
        env_name = ENV_KEYS[flag]
        sources = [name for name, given in ((flag, on_cmdline[flag] is not None),
                                            (file_flag, files[file_flag] is not None),
                                            (env_name, bool(environ.get(env_name)))) if given]
        if len(sources) > 1:
            raise OpsConfigError(f"the {flag[2:]} is given {len(sources)} times ({', '.join(sources)}); "
                                 f"expected one of {flag} KEY, {file_flag} PATH or {env_name}")
        if files[file_flag] is not None:
            found[flag] = read_key_file(file_flag, files[file_flag])
        elif environ.get(env_name):
            found[flag] = environ[env_name]
        else:
            found[flag] = on_cmdline[flag]
        environ.pop(env_name, None)
    if any(on_cmdline[f] is not None for f in KEY_FLAGS):
        hide_keys_from_cmdline()
    return argv, found


def hide_keys_from_cmdline() -> None:
    """Overwrite this process's argument memory (/proc/self/cmdline, ps) and sys.argv with the
    key values redacted, and warn that they were visible until now."""
    flags = ", ".join(f for f in KEY_FLAGS)
    sys.argv[:] = redact_argv(sys.argv)
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            shown = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
        import setproctitle

        setproctitle.setproctitle(" ".join(redact_argv(shown)))
        done = "its command line now shows them redacted, "
    except (OSError, ImportError) as e:
        done = f"its command line could not be rewritten ({type(e).__name__}), "
    logger.warning("sgl_ess.launch_server: a key was given on the command line (%s): every local user could read "
                   "it in /proc/%d/cmdline until now; %sbut use --api-key-file / --admin-api-key-file or "
                   "SGLESS_API_KEY / SGLESS_ADMIN_API_KEY instead", flags, os.getpid(), done)


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
