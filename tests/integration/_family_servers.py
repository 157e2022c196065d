"""Serve an embedded tiny model ESS on and ESS off and collect what the family exactness tests
(test_glm5_exactness, test_glm52_shared_index, test_hyv4_exactness, test_longcat_exactness; with MTP:
test_glm52_mtp, test_hyv4_mtp) compare.

One pair of servers per test module, started together (their starts overlap), then used one after the
other: 6 concurrent clients on ROWS request rows (rows reused within a batch and by the next batch),
contexts several times the hot buffer. The ESS-on host pool is sized from a GB budget that holds
POOL_TOKENS tokens of the model's own latent layers; the ESS-off server gets POOL_TOKENS device tokens.
Each server is stopped once collected, with no process of it left behind."""

from sgl_ess.serving.preflight import DSA_PAGE_SIZE

from ._server import group_alive, start_together
from .conftest import HOT_SLOTS, _need_sglang
from .test_exactness import _run_batch

ROWS = 4                                  # --max-running-requests: fewer than the 6 concurrent clients
POOL_TOKENS = 8192
# the launcher's unit-variance random weights (launcher/dummy_init.py; it sets this for the default model
# only): SGLang's own dummy weights leave the logits flat, attention barely reaching them, sinks all zero
SCALED_WEIGHTS = {"SGLESS_DUMMY_INIT": "scaled"}
# what a request's meta_info says of its speculation (EAGLE / MTP): verify steps, accepted draft tokens
SPEC_KEYS = ("spec_verify_ct", "spec_num_correct_drafts", "spec_correct_drafts_histogram")


def pool_gb(layers: int, row_bytes: int) -> float:
    """The host-pool budget that holds POOL_TOKENS tokens of `layers` latent rows (SGLang adds one padding page)."""
    return (POOL_TOKENS + DSA_PAGE_SIZE) * layers * row_bytes / 1e9


def serve_on_and_off(model_dir: str, layers: int, row_bytes: int, prefix: str,
                     batches: tuple[str, ...] = ("first", "again"), extra: tuple[str, ...] = ()) -> dict[str, dict]:
    """{"on": collected, "off": collected}; see _collect for what each holds. `extra`: arguments both
    servers get (speculative decoding: test_spec_eagle.SPEC)."""
    _need_sglang()
    common = ["--model-path", model_dir, "--load-format", "dummy", "--max-running-requests", str(ROWS), *extra]
    servers = start_together({"on": (common + ["--ess-hot-slots-per-request", str(HOT_SLOTS),
                                               "--ess-memory-pool-size-gb", repr(pool_gb(layers, row_bytes))],
                                      SCALED_WEIGHTS),
                              "off": (common + ["--ess-enabled", "false", "--max-total-tokens", str(POOL_TOKENS)],
                                      SCALED_WEIGHTS)}, prefix=prefix)
    try:
        return {"on": _collect(servers.pop("on"), True, batches),
                "off": _collect(servers.pop("off"), False, batches)}
    finally:
        for srv in servers.values():
            srv.stop()


def _collect(srv, ess_on: bool, batches: tuple[str, ...]) -> dict:
    """Run the batches (each: flush, then 6 concurrent greedy requests), then stop the server. Returns
    "status" (/ess/status before the batches), one list of (token, log-prob) per request under each batch
    name, "spec" (each batch's per-request speculation counters, SPEC_KEYS, None without speculative
    decoding), "prompt_tokens" (the first request of the first batch) and "log"; ESS on also "before" and
    "usage" (scheduler usage before and after the batches), "fetched" (host->device rows in between) and
    "after" (usage once live rows and hot buffers are back to zero, polled WITHOUT a flush first)."""
    try:
        out = {"status": srv.get("/ess/status"), "spec": {}}
        before = srv.ess_usage() if ess_on else {}
        first = None
        for when in batches:
            out[when], raw = _run_batch(srv)
            out["spec"][when] = [{k: o["meta_info"].get(k) for k in SPEC_KEYS} for o in raw]
            first = first or raw
        out["prompt_tokens"] = first[0]["meta_info"]["prompt_tokens"]
        if ess_on:
            out["before"], out["usage"] = before, srv.ess_usage()
            out["fetched"] = out["usage"]["rows_h2d"] - before["rows_h2d"]
            out["after"] = srv.wait_ess_zero(timeout_s=90)
        out["log"] = srv.log_tail(100000)
    finally:
        srv.stop()
    assert not group_alive(srv.pgid), f"processes of {srv.name} left behind (pgid {srv.pgid})"
    return out


def serve_mtp(model_dir: str, layers: int, row_bytes: int, prefix: str) -> dict[str, dict]:
    """serve_on_and_off with EAGLE speculative decoding through the model's MTP (NextN) layer
    (test_spec_eagle.SPEC), one batch: 6 clients on ROWS rows, so rows are reused within it."""
    from .test_spec_eagle import SPEC

    return serve_on_and_off(model_dir, layers, row_bytes, prefix=prefix, batches=("first",), extra=tuple(SPEC))


def assert_equal_outputs(on: dict, off: dict, when: str, new_tokens: int, logprobs_equal) -> None:
    """Batch `when` of ESS on (which fetched host rows, contexts several times the hot buffer) and off: equal
    greedy tokens (not a degenerate repetition), log-probs equal by `logprobs_equal(x, y)`, equal speculation
    counters (SPEC_KEYS, each present: a speculative server)."""
    assert on["fetched"] > 0, "ESS on fetched nothing: the store was not used"
    assert on["prompt_tokens"] >= 5 * HOT_SLOTS
    assert len(on[when]) == len(off[when]) > 0 and len({t for t, _ in on[when][0]}) > 4
    for i, (a, b) in enumerate(zip(on[when], off[when])):
        assert len(a) == new_tokens
        assert [t for t, _ in a] == [t for t, _ in b], f"{when} request {i}: tokens differ ESS on vs off"
        for k, ((_, x), (_, y)) in enumerate(zip(a, b)):
            assert logprobs_equal(x, y), f"{when} request {i}, token {k}: log-probs differ: {x} vs {y}"
    for i, (a, b) in enumerate(zip(on["spec"][when], off["spec"][when])):
        for k in SPEC_KEYS:
            assert a[k] is not None and a[k] == b[k], f"{when} request {i}: {k} {a[k]} != ESS off {b[k]}"
    assert "Traceback" not in on["log"] and "Traceback" not in off["log"]


def assert_mtp_stores(on: dict, off: dict, layers: int, warning: str) -> None:
    """A shared-index model served with speculative decoding (ESS on): `warning` logged once at start (the
    store keeps one LRU per layer), not by ESS off; every target step after a prefill is an MTP verify (no
    decode plan): each layer, shared-index ones included, resolves its requests' union of draft top-k sets
    in its own attention (pools/pool_adapter.verify) and reads misses from the host pool; the draft runner's
    own store (its one NextN layer) ran MTP steps and fetched."""
    assert on["log"].count(warning) == 1, [ln for ln in on["log"].splitlines() if "speculative" in ln]
    assert warning not in off["log"]
    u = on["usage"]
    assert u["mtp_steps"] > 0 and u["mtp_overflow_entries"] > 0, u
    assert len(u["misses_per_layer"]) == layers and all(m > 0 for m in u["misses_per_layer"]), u
    (draft,) = u["draft"]
    assert len(draft["misses_per_layer"]) == 1 and draft["mtp_steps"] > 0 and draft["rows_h2d"] > 0, draft
