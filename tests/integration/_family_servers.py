"""Serve an embedded tiny model ESS on and ESS off and collect what the family exactness tests
(test_glm5_exactness, test_glm52_shared_index, test_hyv4_exactness, test_longcat_exactness) compare.

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


def pool_gb(layers: int, row_bytes: int) -> float:
    """The host-pool budget that holds POOL_TOKENS tokens of `layers` latent rows (SGLang adds one padding page)."""
    return (POOL_TOKENS + DSA_PAGE_SIZE) * layers * row_bytes / 1e9


def serve_on_and_off(model_dir: str, layers: int, row_bytes: int, prefix: str,
                     batches: tuple[str, ...] = ("first", "again")) -> dict[str, dict]:
    """{"on": collected, "off": collected}; see _collect for what each holds."""
    _need_sglang()
    common = ["--model-path", model_dir, "--load-format", "dummy", "--max-running-requests", str(ROWS)]
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
    name, "prompt_tokens" (the first request of the first batch) and "log"; ESS on also "before" and
    "usage" (scheduler usage before and after the batches), "fetched" (host->device rows in between) and
    "after" (usage once live rows and hot buffers are back to zero, polled WITHOUT a flush first)."""
    try:
        out = {"status": srv.get("/ess/status")}
        before = srv.ess_usage() if ess_on else {}
        first = None
        for when in batches:
            out[when], raw = _run_batch(srv)
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
