"""Issue 20: every route of SGLang's real app is classified, and the route guard applies the auth
matrix to each of them, for every key configuration (no key / user key / admin key / both).

The app is SGLang 0.5.23's own ``http_server.app`` with sgl-ess's routes installed; the guard is the
real middleware. Behind it stands a recorder instead of SGLang's handlers (no model is loaded), so
the test sees exactly which requests the guard lets through.
"""

import asyncio
import json

import pytest

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.routes import route_guard, runtime_config, status_route  # noqa: E402
from sgl_ess.serving import route_policy as rp  # noqa: E402
from sgl_ess.serving.ops_config import OpsConfig  # noqa: E402

pytestmark = pytest.mark.integration
USER, ADMIN = "u-key", "a-key"
CONFIGS = {"none": rp.Keys(), "user": rp.Keys(api_key=USER), "admin": rp.Keys(admin_api_key=ADMIN),
           "both": rp.Keys(api_key=USER, admin_api_key=ADMIN)}


def _app_routes():
    from sglang.srt.entrypoints import http_server

    status_route.install()
    runtime_config.install_route()
    out = []

    def walk(routes):
        for r in routes:
            if getattr(r, "path", None) is not None:
                out.append((r.path, sorted(getattr(r, "methods", None) or ["WEBSOCKET"])))
            if hasattr(r, "routes"):
                walk(r.routes)
            sub = getattr(getattr(r, "app", None), "routes", None)     # mounted apps
            if sub:
                walk(sub)
    walk(http_server.app.routes)
    return out


ROUTES = _app_routes()


def test_every_route_of_the_app_is_classified():
    missing = sorted({p for p, _ in ROUTES if rp.classify(p) is None})
    assert not missing, (f"routes of SGLang's app that sgl_ess/serving/route_policy.py does not classify (an "
                         f"SGLang upgrade added them?): {missing}")
    assert len({p for p, _ in ROUTES}) >= 80, f"only {len(ROUTES)} routes found: is this SGLang's app?"


def _concrete(path: str) -> str:
    return path.replace("{model:path}", "m").replace("{response_id}", "r1").replace("{method}", "x")


def _drive(mw, method: str, path: str, token):
    reached = {}

    async def inner(scope, receive, send):
        reached["yes"] = True
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def run():
        guard = route_guard.RouteGuardMiddleware(inner, ops=mw["ops"], keys=mw["keys"])
        headers = [(b"content-type", b"application/json")]
        if token:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        scope = {"type": "http", "method": method, "path": path, "headers": headers}
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(m):
            sent.append(m)
        await guard(scope, receive, send)
        return next(m["status"] for m in sent if m["type"] == "http.response.start")
    status = asyncio.run(run())
    return 0 if reached else status


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_auth_matrix_on_every_route(config, tmp_path):
    keys = CONFIGS[config]
    mw = {"ops": OpsConfig(guard_operator_output_dir=str(tmp_path)), "keys": keys}
    wrong = []
    for path, methods in ROUTES:
        if methods == ["WEBSOCKET"]:
            continue
        p = _concrete(path)
        for who, token in (("anonymous", None), ("user", USER), ("admin", ADMIN)):
            want = rp.decide(p, token, keys).status
            got = _drive(mw, methods[0], p, token)
            if got != want:
                wrong.append(f"{methods[0]} {p} as {who}: guard answered {got}, policy says {want}")
    assert not wrong, "\n".join(wrong[:20])


def test_expected_columns_of_the_matrix():
    """The table in launch/OPERATIONS.md, read back from the policy for the routes of each finding."""
    none, both = CONFIGS["none"], CONFIGS["both"]
    for p in ("/abort_request", "/configure_logging", "/start_profile", "/pause_generation", "/slow_down",
              "/update_weight_version", "/weights_checker", "/ess/overlap_level", "/flush_cache"):
        assert rp.decide(p, None, none).status == 403, p
        assert rp.decide(p, USER, both).status == 401, p
        assert rp.decide(p, ADMIN, both).allowed, p
    assert rp.decide("/ess/status", ADMIN, both).allowed and rp.decide("/ess/status", None, both).status == 401
    assert rp.decide("/init_weights_update_group", ADMIN, both).status == 403


def test_operations_guide_has_the_matrix():
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[2] / "launch" / "OPERATIONS.md").read_text()
    for cls in rp.CLASSES:
        assert f"| {cls} " in text, f"launch/OPERATIONS.md: the auth matrix lacks the row for {cls!r}"
    assert json.dumps(sorted(rp.CLASSES))  # the classes are the table's rows
