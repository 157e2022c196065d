"""The speculative prefetch tier inside the real server: greedy tokens and log-probs with every
predictor (next_layer, last_step, score_ema, lstm) equal ESS off, since a prediction is never needed
for correctness; and --ess-trace-file records the server's plans in a trace the replay reads.

The precision gate is set to 0 (never fall back) so every predictor's stagings are really used. The
lstm checkpoint is trained here, in seconds, on a small synthetic trace of the embedded model's shape
(2 layers, index_topk 32)."""

import concurrent.futures as cf
import glob

import pytest

from ._server import group_alive, start_together
from .conftest import HOT_SLOTS, MAX_RUNNING, _need_sglang
from .conftest import _start as start_server

pytestmark = pytest.mark.integration

N_REQUESTS = 4
NEW_TOKENS = 16
PREDICTORS = ["next_layer", "last_step", "score_ema", "lstm"]


def prompts():
    return [("def f%d(x):\n    return [x * %d for _ in range(%d)]\n" % (i, i + 2, i + 5)) * 16
            for i in range(N_REQUESTS)]


def run_batch(server):
    server.flush_cache()
    with cf.ThreadPoolExecutor(N_REQUESTS) as ex:
        outs = list(ex.map(lambda p: server.generate(p, NEW_TOKENS), prompts()))
    return [[(t[1], t[0]) for t in o["meta_info"]["output_token_logprobs"]] for o in outs]


def _start(name, args):
    return start_server(name, ["--ess-hot-slots-per-request", str(HOT_SLOTS), "--max-running-requests",
                               str(MAX_RUNNING), "--max-total-tokens", "32768", *args])


@pytest.fixture(scope="module")
def lstm_checkpoint(tmp_path_factory):
    from sgl_ess.prefetch.lstm_model import save_checkpoint
    from sgl_ess.prefetch.synthetic_trace import SyntheticTraceConfig, generate
    from sgl_ess.prefetch.train_lstm import train

    trace = generate(SyntheticTraceConfig(num_layers=2, topk=32, context_tokens=512, steps=40, requests=2,
                                          hot_slots_per_request=HOT_SLOTS))
    model, metrics = train(trace, hidden=8, epochs=2, max_segments=1000, log=lambda _: None)
    path = str(tmp_path_factory.mktemp("lstm") / "lstm.pt")
    save_checkpoint(path, model, 24, 0.1, trace.header, metrics)
    return path


@pytest.fixture(scope="module")
def reference(server_off):
    return run_batch(server_off)


@pytest.fixture(scope="module")
def predictor_servers(lstm_checkpoint):
    """One server per predictor, all started at once (their starts overlap); server_predictor takes
    each out and stops it when its test is done; any left (a deselected predictor) are stopped here."""
    _need_sglang()
    specs = {}
    for name in PREDICTORS:
        args = ["--ess-speculative-prefetch", name, "--ess-spec-slots", "64", "--ess-predictor-min-precision", "0"]
        if name == "lstm":
            args += ["--ess-predictor-checkpoint", lstm_checkpoint]
        specs[name] = (["--ess-hot-slots-per-request", str(HOT_SLOTS), "--max-running-requests", str(MAX_RUNNING),
                        "--max-total-tokens", "32768", *args], None)
    servers = start_together(specs, prefix="spec_")
    yield servers
    for srv in servers.values():
        srv.stop()


@pytest.fixture(scope="module", params=PREDICTORS)
def server_predictor(request, predictor_servers):
    name = request.param
    srv = predictor_servers.pop(name)
    try:
        yield name, srv
    finally:
        srv.stop()
    assert not group_alive(srv.pgid), f"processes of {srv.name} left behind"


def test_every_predictor_matches_ess_off(server_predictor, reference):
    name, srv = server_predictor
    before = srv.ess_usage()
    got = run_batch(srv)
    after = srv.ess_usage()
    assert after["rows_h2d"] > before["rows_h2d"], f"{name}: no host->device fetch happened"
    spec = after["prefetch"]["speculative"]
    assert spec["predictor"] == name and spec["predict_calls"] > 0, spec
    assert spec["gate"]["fallbacks"] == 0                  # min precision 0: the gate never closes
    if name in ("next_layer", "score_ema"):
        assert spec["rows_staged"] > 0, spec
    for i, (a, b) in enumerate(zip(got, reference)):
        assert [t for t, _ in a] == [t for t, _ in b], f"{name} request {i}: tokens differ"
        assert [lp for _, lp in a] == [lp for _, lp in b], f"{name} request {i}: log-probs differ"


def test_trace_file_records_the_servers_plans(tmp_path, reference):
    _need_sglang()
    from sgl_ess.prefetch.trace_format import read_trace
    from sgl_ess.store.trace_replay import replay

    srv = _start("trace", ["--ess-trace-file", str(tmp_path / "trace-{pid}.jsonl")])
    try:
        got = run_batch(srv)
    finally:
        srv.stop()
    assert not group_alive(srv.pgid)
    assert [[t for t, _ in r] for r in got] == [[t for t, _ in r] for r in reference]
    files = glob.glob(str(tmp_path / "trace-*.jsonl"))
    assert len(files) == 1, files
    trace = read_trace(files[0])
    assert trace.header["source"] == "server" and "tiny_dsv32" in trace.header["model"]
    assert trace.num_layers == 2 and trace.topk == 32
    layers = {e["layer"] for e in trace.plans()}
    assert layers == {0, 1}
    kinds = {e["ev"] for e in trace.events}
    assert {"open", "warmup", "touch", "plan"} <= kinds
    res = replay(trace, "score_ema")
    assert res.misses > 0 and res.predict_calls > 0
