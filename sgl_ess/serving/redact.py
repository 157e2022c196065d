"""No secret in a response body or a log line: redact secret-shaped fields, flags and values.

Pure Python. A field or flag is secret-shaped when one of its ``_``/``-`` separated words is a
key, secret, password or credential word (``api_key``, ``admin_api_key``, ``hf_token`` ...), and
its value is a non-empty string. Known secret values (the server's own keys) are also replaced
wherever they appear inside other strings (a launch command line, an error message).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

REDACTED = "<redacted>"
_SECRET_WORDS = {"key", "apikey", "secret", "password", "passwd", "credential", "credentials"}
# "token" alone means a model token (max_tokens, first_token ...) unless it is one of these
_SECRET_TOKENS = ("hf_token", "access_token", "auth_token", "api_token", "bearer_token", "refresh_token",
                  "session_token")
_NOT_SECRET = {"key_id"}


def secret_name(name: str) -> bool:
    """True for field / flag names that hold secrets ('api_key', '--admin-api-key', 'hf_token')."""
    n = name.lstrip("-").lower().replace("-", "_")
    if any(n.endswith(x) for x in _NOT_SECRET):
        return False
    if n == "token" or n.endswith(_SECRET_TOKENS):
        return True
    return any(w in _SECRET_WORDS for w in n.split("_"))


def redact_values(text: str, secrets: Iterable[str]) -> str:
    for s in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    return text


def redact(obj: Any, secrets: Iterable[str] = ()) -> Any:
    """A copy of JSON-like `obj` with secret-shaped fields and known secret values redacted."""
    secrets = tuple(s for s in secrets if s)
    if isinstance(obj, dict):
        return {k: (REDACTED if isinstance(k, str) and secret_name(k) and isinstance(v, str) and v
                    else redact(v, secrets)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, str) and secrets:
        return redact_values(obj, secrets)
    return obj


def redact_argv(argv: list[str]) -> list[str]:
    """`argv` with the value of every secret-shaped flag replaced (``--flag V`` and ``--flag=V``)."""
    out, hide_next = [], False
    for a in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if a.startswith("--") and "=" in a and secret_name(a.split("=", 1)[0]):
            out.append(a.split("=", 1)[0] + "=" + REDACTED)
            continue
        out.append(a)
        hide_next = a.startswith("--") and secret_name(a)
    return out


_ARGV_SECRET = re.compile(r"(--[\w-]*(?:key|secret|password|token)[\w-]*)(=|\s+)(\S+)", re.IGNORECASE)


def redact_command_line(line: str) -> str:
    """A command line as one string, with secret-shaped flags' values replaced."""
    return _ARGV_SECRET.sub(lambda m: m.group(1) + m.group(2) + REDACTED if secret_name(m.group(1))
                            else m.group(0), line)


_REPR_FIELD = re.compile(r"""\b(\w+)=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


def redact_repr(text: str) -> str:
    """A repr / log line with the quoted value of every secret-shaped ``name='value'`` replaced
    (SGLang logs its ``ServerArgs(...)`` repr, which holds e.g. ``ssl_keyfile_password``)."""
    return _REPR_FIELD.sub(lambda m: f"{m.group(1)}='{REDACTED}'" if secret_name(m.group(1)) else m.group(0), text)
