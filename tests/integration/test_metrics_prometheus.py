"""Issue 7, defect 8 (metrics) and /health: a REAL Prometheus server (Debian package `prometheus`,
installed by .ci/run) scrapes the launcher's /metrics and finds the ESS metrics; `promtool check
rules` accepts the alert rules; the Grafana dashboard queries only metrics the server exports."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

from sgl_ess.obs.metrics import NAMES

from ._http import call, ids_prompt
from ._server import REPO, free_port

pytestmark = pytest.mark.integration
MON = os.path.join(REPO, "launch", "monitoring")
RULES = os.path.join(MON, "ess_alerts.yml")
DASHBOARD = os.path.join(MON, "ess_dashboard.json")


def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"'{name}' not found: install the Debian package (apt-get install -y prometheus); "
                    ".ci/run does this")
    return path


def _traffic(server):
    for i in range(3):
        st, text = call(server.base, "/generate", {"input_ids": ids_prompt(300 + 50 * i), "sampling_params": {
            "max_new_tokens": 12, "ignore_eos": True}})
        assert st == 200, text[:200]
    st, text = call(server.base, "/v1/completions", {"model": "default", "prompt": "def f(x):", "max_tokens": 8,
                                                      "stream": True})    # streaming: inter-token latency
    assert st == 200 and "[DONE]" in text, text[:200]


def _exported(server) -> set[str]:
    with urllib.request.urlopen(server.base + "/metrics", timeout=60) as r:
        text = r.read().decode()
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", text, re.M)}


def test_promtool_accepts_the_alert_rules():
    r = subprocess.run([_tool("promtool"), "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_alert_rules_cover_the_guide_and_name_declared_metrics():
    text = open(RULES).read()
    for alert in ("SglEssHitRateLow", "SglEssTransferBandwidthSaturated", "SglEssHostPoolHigh"):
        assert f"alert: {alert}" in text
    assert "< 0.95" in text
    used = set(re.findall(r"\bsgless_[a-z0-9_]+", text))
    assert used and used <= NAMES, f"rules name undeclared metrics: {used - NAMES}"


def test_server_exports_every_declared_ess_metric_and_dashboard_names_only_exported_ones(server_ops):
    _traffic(server_ops)
    time.sleep(2.5)                       # the exporter samples once a second
    exported = _exported(server_ops)
    base = {re.sub(r"_(bucket|sum|count|created)$", "", n) for n in exported} | exported
    # every declared metric is there, except prefetch ones until the store reports usage()["prefetch"]
    # prefetch metrics appear only for the keys the store's usage()["prefetch"] reports (tolerated);
    # SLO metrics only with --ess-slo-tpot-ms (tests/integration/test_slo_batch.py reads them), PD ones
    # only on a prefill or decode node (tests/integration/test_pd.py reads them)
    missing = {n for n in NAMES if n not in base and not n.startswith(("sgless_prefetch_", "sgless_slo_", "sgless_pd_"))}
    assert not missing, f"declared but not exported: {sorted(missing)}"
    dash = json.load(open(DASHBOARD))
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    named = set()
    for e in exprs:
        named |= _dashboard_names(e)
    assert any(n.startswith("sglang:") for n in named) and any(n.startswith("sgless_") for n in named)
    unknown_ess = {n for n in named if n.startswith("sgless_") and n not in NAMES}
    assert not unknown_ess, f"dashboard names undeclared ESS metrics: {unknown_ess}"
    not_exported = {n for n in named if n not in base and not (n.startswith("sgless_prefetch_") and n in NAMES)}
    assert not not_exported, f"dashboard queries metrics the server does not export: {sorted(not_exported)}"
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for guide_item in ("hit rate", "bandwidth", "host memory", "gpu memory", "throughput", "latency"):
        assert guide_item in titles, f"no dashboard panel for '{guide_item}'"


def _dashboard_names(expr: str) -> set[str]:
    """Metric names in a dashboard query; SGLang's are written {__name__=~"sglang[:_]<name>"}."""
    names = set(re.findall(r"\bsgless_[a-z0-9_]+", expr))
    names |= {"sglang:" + n for n in re.findall(r"sglang\[:_\]([a-z0-9_]+)", expr)}
    return names


def _prom_query(base: str, q: str) -> list:
    url = f"{base}/api/v1/query?query={urllib.parse.quote(q)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["data"]["result"]


def test_real_prometheus_scrapes_the_ess_metrics(server_ops, tmp_path):
    prom = _tool("prometheus")
    port = free_port()
    target = server_ops.base.split("//", 1)[1]
    cfg = tmp_path / "prometheus.yml"
    shutil.copy(RULES, tmp_path / "ess_alerts.yml")
    cfg.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [ess_alerts.yml]\n"
                   f"scrape_configs:\n  - job_name: sgl-ess\n    static_configs:\n      - targets: ['{target}']\n")
    log = tempfile.NamedTemporaryFile(prefix="prometheus_", suffix=".log", delete=False)
    proc = subprocess.Popen([prom, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _traffic(server_ops)
        want = ['sgless_host_pool_tokens{state="live"}', "sgless_hot_misses_total", "sgless_bytes_moved_total",
                "sgless_host_pool_capacity_tokens", '{__name__=~"sglang[:_]num_running_reqs"}', 'up{job="sgl-ess"}']
        found, deadline = {}, time.time() + 90
        while time.time() < deadline and len(found) < len(want):
            for q in want:
                try:
                    res = _prom_query(base, q)
                except OSError:
                    res = []
                if res:
                    found[q] = res
            time.sleep(1)
        missing = [q for q in want if q not in found]
        assert not missing, f"Prometheus did not get {missing}; log:\n{open(log.name).read()[-2000:]}"
        assert float(found['up{job="sgl-ess"}'][0]["value"][1]) == 1.0
        assert {r["metric"]["layer"] for r in found["sgless_hot_misses_total"]} == {"0", "1"}
        with urllib.request.urlopen(base + "/api/v1/rules", timeout=10) as r:
            groups = json.loads(r.read())["data"]["groups"]
        assert {rule["name"] for g in groups for rule in g["rules"]} >= {"SglEssHitRateLow", "SglEssHostPoolHigh"}
        assert all(rule.get("health") != "err" for g in groups for rule in g["rules"]), groups
        # every dashboard query is valid PromQL for this Prometheus, and names only metrics it has
        dash = json.load(open(DASHBOARD))
        with urllib.request.urlopen(base + "/api/v1/label/__name__/values", timeout=10) as r:
            stored = {n.replace("sglang_", "sglang:", 1) if n.startswith("sglang_") else n
                      for n in json.loads(r.read())["data"]}
        for panel in dash["panels"]:
            for t in panel["targets"]:
                _prom_query(base, t["expr"])           # raises on a query Prometheus rejects
                unknown = {n for n in _dashboard_names(t["expr"]) if n not in stored
                           and not n.startswith("sgless_prefetch_")}
                assert not unknown, f"panel '{panel['title']}' queries {unknown}, which Prometheus never scraped"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_health_reports_ess_state(server_ops):
    status, text = call(server_ops.base, "/health", method="GET")
    assert status == 200, text
    body = json.loads(text)
    assert body["status"] == "ok"
    s = body["schedulers"][0]
    assert s["enabled"] is True and s["host_tokens_capacity"] > 0
    assert {"host_tokens_live", "host_tokens_cached", "host_tokens_free", "queue"} <= set(s)
