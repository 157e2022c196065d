"""The embedded default served by real SGLang answers the OpenAI-compatible API."""

import json
import urllib.request

import pytest

pytestmark = pytest.mark.integration


def test_models_lists_the_embedded_model(server_on):
    models = server_on.get("/v1/models")["data"]
    assert models and "tiny_dsv32" in models[0]["id"]


def test_completion(server_on):
    r = server_on.post("/v1/completions", {"model": "default", "prompt": "def add(a, b):\n    return",
                                            "max_tokens": 12, "temperature": 0})
    choice = r["choices"][0]
    assert choice["finish_reason"] in ("length", "stop")
    assert isinstance(choice["text"], str) and choice["text"]
    assert r["usage"]["completion_tokens"] >= 1
    assert r["usage"]["prompt_tokens"] > 3


def test_chat_completion(server_on):
    r = server_on.post("/v1/chat/completions", {
        "model": "default", "messages": [{"role": "user", "content": "Write a for loop."}],
        "max_tokens": 10, "temperature": 0})
    msg = r["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str)
    assert r["usage"]["completion_tokens"] >= 1


def _stream(server, path, body):
    body = dict(body, stream=True)
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            chunks.append(json.loads(data))
    return chunks


def test_streaming_chat_matches_non_streaming(server_on):
    body = {"model": "default", "messages": [{"role": "user", "content": "import sys"}],
            "max_tokens": 12, "temperature": 0}
    full = server_on.post("/v1/chat/completions", body)["choices"][0]["message"]["content"]
    chunks = _stream(server_on, "/v1/chat/completions", body)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert len(chunks) > 2
    assert text == full


def test_streaming_completion(server_on):
    chunks = _stream(server_on, "/v1/completions", {"model": "default", "prompt": "class A:",
                                                     "max_tokens": 8, "temperature": 0})
    assert len(chunks) >= 2
    assert "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
