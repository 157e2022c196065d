"""Fixtures for the in-process backend tests (imported by those test modules)."""

import pytest

pytest.importorskip("sglang")

from sgl_ess.config import ENV_CONFIG_JSON, EssConfig  # noqa: E402


@pytest.fixture
def ess_env(monkeypatch):
    """ESS on (the inline engine unless told otherwise); the process-wide adapter registry restored afterwards."""
    from sgl_ess.integration.sglang.pools import lifecycle

    def configure(**kw):
        kw.setdefault("prefetch_engine", "inline")
        kw.setdefault("warmup_queries", 4)
        cfg = EssConfig(**kw)
        monkeypatch.setenv(ENV_CONFIG_JSON, cfg.to_json())
        return cfg

    configure(hot_slots_per_request=24)
    before = list(lifecycle._adapters)
    yield configure
    for a in lifecycle._adapters:
        if a not in before:
            a.shutdown()
    lifecycle._adapters[:] = before


@pytest.fixture
def server_args():
    """SGLang's server args published with their defaults, as a server always has them (the store reads
    its spec namespace, pools/device_budget.draft_tokens): a test module run alone has none published."""
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args():
        yield
