"""The asynchronous data path inside the real server: greedy tokens and log-probs with ESS on
equal ESS off for every overlap level (none / da / dba / full) with both fetch engines (the
prefetch worker process over ZMQ, and inline, which runs every level as 'none'). The level is switched at run time through
SGLang's /set_internal_state, so one server per engine covers every level.

Hot buffers of 40 slots per request and layer (index_topk 32) under contexts of ~300 tokens:
most latent rows live in the host pool and every step fetches misses through the ring."""

import concurrent.futures as cf
import json
import urllib.error

import pytest

from ._server import Server, group_alive
from .conftest import HOT_SLOTS, MAX_RUNNING, _need_sglang

pytestmark = pytest.mark.integration

N_REQUESTS = 4
NEW_TOKENS = 16
LEVELS = ["none", "da", "dba", "full"]


def prompts():
    return [("class Node%d:\n    def __init__(self, v):\n        self.v = v * %d\n" % (i, i + 3)) * 14
            for i in range(N_REQUESTS)]


def run_batch(server):
    server.flush_cache()
    with cf.ThreadPoolExecutor(N_REQUESTS) as ex:
        outs = list(ex.map(lambda p: server.generate(p, NEW_TOKENS), prompts()))
    return [[(t[1], t[0]) for t in o["meta_info"]["output_token_logprobs"]] for o in outs]


def set_level(server, level):
    r = server.post("/ess/overlap_level", {"level": level})
    assert r["level"] == level and all(r["updated"]), r
    assert server.ess_usage()["overlap_level"] == level


@pytest.fixture(scope="module", params=["worker", "inline"])
def server_engine(request, tmp_path_factory):
    _need_sglang()
    profile = tmp_path_factory.mktemp("profile") / "mixed.json"   # 'full': a different mode per layer
    profile.write_text(json.dumps({"format": "sgl_ess.overlap_profile/1", "layers": ["dba", "da"]}))
    srv = Server(f"ess_{request.param}", ["--ess-prefetch-engine", request.param, "--ess-overlap-profile", str(profile),
                                          "--ess-hot-slots-per-request", str(HOT_SLOTS),
                                          "--max-running-requests", str(MAX_RUNNING), "--max-total-tokens", "32768"])
    try:
        srv.wait_healthy()
        yield request.param, srv
    finally:
        srv.stop()
    assert not group_alive(srv.pgid), f"processes of {srv.name} left behind"


@pytest.fixture(scope="module")
def reference(server_off):
    return run_batch(server_off)


def test_every_level_matches_ess_off(server_engine, reference):
    engine, srv = server_engine
    assert srv.ess_usage()["prefetch"]["engine"] == engine
    for level in LEVELS:
        set_level(srv, level)
        before = srv.ess_usage()
        got = run_batch(srv)
        after = srv.ess_usage()
        assert after["rows_h2d"] > before["rows_h2d"], f"{engine}/{level}: no host->device fetch happened"
        if engine == "inline":       # synchronous: nothing to overlap, every level runs as 'none'
            assert after["overlap_runs_as"] == "none" and after["plans_early"] == before["plans_early"]
        elif level in ("da", "dba"):  # the fetch was submitted by the indexer hand-off, not inside attention
            assert after["overlap_runs_as"] == level
            assert after["plans_early"] > before["plans_early"], f"{engine}/{level}: no early plan"
        for i, (a, b) in enumerate(zip(got, reference)):
            assert [t for t, _ in a] == [t for t, _ in b], f"{engine}/{level} request {i}: tokens differ"
            assert [lp for _, lp in a] == [lp for _, lp in b], f"{engine}/{level} request {i}: log-probs differ"
    tiers = srv.ess_usage()["prefetch"]["tiers"]
    assert tiers["immediate"]["rows"] > 0 and tiers["background"]["rows"] > 0


def test_unknown_level_is_refused_at_run_time(server_engine):
    _, srv = server_engine
    before = srv.ess_usage()["overlap_level"]
    with pytest.raises(urllib.error.HTTPError) as e:
        srv.post("/ess/overlap_level", {"level": "turbo"})
    assert e.value.code == 400 and "allowed: none, da, dba, full" in e.value.read().decode()
    assert srv.ess_usage()["overlap_level"] == before
