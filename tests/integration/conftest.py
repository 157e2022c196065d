"""Real SGLang servers for the integration tests, started once per session and shared.

  server_on   the embedded default (ESS on), hot buffer of 40 slots per request and layer
              (index_topk is 32), so contexts of several hundred tokens live mostly in the host pool
  server_off  the same model with ESS off: every latent in SGLang's own device pool, capped at
              DEVICE_BUDGET_TOKENS -- the same device latent budget server_on spends on hot buffers
"""

import importlib.util

import pytest

from ._server import Server, group_alive

HOT_SLOTS = 40
MAX_RUNNING = 48
DEVICE_BUDGET_TOKENS = HOT_SLOTS * MAX_RUNNING      # 1920 latent rows per layer on the device

pytestmark = pytest.mark.integration


def _need_sglang():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (run launch/setup.sh)")


def _start(name, args, env=None, **kw):
    _need_sglang()
    srv = Server(name, args, env, **kw)
    try:
        srv.wait_healthy()
    except Exception:
        srv.stop()
        raise
    return srv


@pytest.fixture(scope="session")
def server_on():
    srv = _start("ess_on", ["--ess-hot-slots-per-request", str(HOT_SLOTS),
                            "--max-running-requests", str(MAX_RUNNING), "--max-total-tokens", "32768"])
    yield srv
    srv.stop()
    assert not group_alive(srv.pgid), f"processes of {srv.name} left behind (pgid {srv.pgid})"


@pytest.fixture(scope="session")
def server_off():
    srv = _start("ess_off", ["--ess-enabled", "false", "--max-running-requests", str(MAX_RUNNING),
                             "--max-total-tokens", str(DEVICE_BUDGET_TOKENS)])
    yield srv
    srv.stop()
    assert not group_alive(srv.pgid), f"processes of {srv.name} left behind (pgid {srv.pgid})"


# --- operations (issue 7): guard, admission, metrics, health -------------------------------------
OPS_HOST_POOL_GB = 0.0013312   # = (4096 + one 64-token page) x 2 layers x 160 B: a 4096-token host pool
OPS_POOL_TOKENS = 4096


@pytest.fixture(scope="session")
def server_ops():
    """ESS on, --enable-metrics, the host pool sized by --ess-memory-pool-size-gb alone (4096 tokens); no keys
    (the launcher's default: operator routes off, inference and status open)."""
    srv = _start("ess_ops", ["--ess-hot-slots-per-request", str(HOT_SLOTS), "--max-running-requests", "8",
                             "--ess-memory-pool-size-gb", str(OPS_HOST_POOL_GB), "--enable-metrics"],
                 admin_key=None)
    yield srv
    srv.stop()
    assert not group_alive(srv.pgid), f"processes of {srv.name} left behind (pgid {srv.pgid})"
