"""Raw HTTP for the operations tests: (status, body text), never raising on 4xx/5xx."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def call(base: str, path: str, body: dict | None = None, timeout: float = 120, method: str | None = None,
         headers: dict | None = None, raw: bytes | None = None):
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    req = urllib.request.Request(base + path, data=data, method=method, headers={**hdrs, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def ids_prompt(n: int) -> list[int]:
    """n in-vocabulary token ids (the embedded tokenizer has 2048)."""
    return [5 + (i * 7) % 1000 for i in range(n)]


def probe(base: str, timeout: float = 300) -> dict:
    """A small greedy request that must succeed: the scheduler is alive and serving."""
    status, text = call(base, "/generate", {"text": "def add(a, b):", "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}, timeout=timeout)
    assert status == 200, f"probe after the bad request failed: {status} {text[:300]}"
    out = json.loads(text)
    assert out["meta_info"]["completion_tokens"] == 8
    return out
