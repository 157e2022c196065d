"""Error messages for clients: no server file paths, no tracebacks, no Python reprs of internals.

SGLang 0.5.23 puts ``File "/.../http_server.py", line N`` blocks into its 400 bodies for
malformed JSON fields, and third-party errors (xgrammar) carry C++ source paths. The full text
stays in the server log; the client gets the first useful sentence.
"""

from __future__ import annotations

import json
import re
from typing import Optional

_FILE_BLOCK = re.compile(r'\s*File "[^"]*", line \d+.*', re.DOTALL)   # a traceback frame and all after it
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):.*", re.DOTALL)
# absolute paths: /a/b/c.py, /project/cpp/x.cc:83 -- two or more components
_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.\-+@]+/)+[\w.\-+@]*(?::\d+)?")
MAX_CHARS = 600


def scrub(message: str) -> str:
    """Client-safe version of an error message (idempotent)."""
    text = _TRACEBACK.sub("", str(message))
    text = _FILE_BLOCK.sub("", text)
    text = _PATH.sub("<path>", text)
    text = text.strip()
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS] + "..."
    return text or "invalid request"


def leaks(text: str) -> bool:
    """True if `text` still shows a server path or a traceback (used by tests and the guard)."""
    return bool(_TRACEBACK.search(text) or re.search(r'File "[^"]*", line \d+', text) or _PATH.search(text))


def error_body(path: str, status: int, message: str, param: Optional[str] = None, code: str = "") -> bytes:
    """SGLang's own error shapes: OpenAI-style for /v1/*, {"error": {...}} elsewhere."""
    if path.startswith("/v1/"):
        body = {"object": "error", "message": message, "type": code or "BadRequestError", "param": param,
                "code": status}
    else:
        body = {"error": {"message": message, "param": param, "code": status}}
    return json.dumps(body).encode()
