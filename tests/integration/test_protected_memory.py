"""Issue 19: on the real server, every latent-row mapping (memfd `sgl_ess_host`, `sgl_ess_slots`) of
the scheduler AND of its prefetch worker process is excluded from core dumps (VmFlag `dd` in
/proc/PID/smaps) and, started with --ess-lock-host-memory, mlocked (`lo`) and fully resident.

The lock is asked for when this machine allows it for the tiny pool below (about 1.6 MB per
process: CAP_IPC_LOCK, or RLIMIT_MEMLOCK >= 4 MiB); otherwise the server starts without it and
only `dd` is checked (the skip reason in test_latent_mappings_are_locked says why)."""


import pytest

from sgl_ess.serving.preflight import has_cap_ipc_lock, memlock_limit_bytes
from tests.unit.store.smaps import mappings

from ._server import group_alive, group_processes
from .conftest import HOT_SLOTS, _start

pytestmark = pytest.mark.integration

LATENT = ("/memfd:sgl_ess_host", "/memfd:sgl_ess_slots")
WORKER_CMD = "sgl_ess.prefetch.worker"
_limit = memlock_limit_bytes()
CAN_LOCK = has_cap_ipc_lock() or _limit is None or _limit >= 4 << 20


@pytest.fixture(scope="module")
def server():
    args = ["--ess-prefetch-engine", "worker", "--ess-hot-slots-per-request", str(HOT_SLOTS),
            "--max-running-requests", "8", "--max-total-tokens", "4096"]
    if CAN_LOCK:
        args += ["--ess-lock-host-memory", "true"]
    srv = _start("ess_protected", args)
    yield srv
    srv.stop()
    assert not group_alive(srv.pgid), f"processes of {srv.name} left behind (pgid {srv.pgid})"


def _latent_maps(server):
    """{pid: (role, [latent mappings])} for every process that maps latent rows; requires a scheduler
    and a prefetch worker among them."""
    r = server.generate("protected memory " * 40, 8)      # decode steps through the worker
    assert r["meta_info"]["completion_tokens"] == 8
    found = {}
    for pid, cmd in group_processes(server.pgid).items():
        maps = [m for m in mappings(pid) if m.name.startswith(LATENT)]
        if maps:
            found[pid] = ("worker" if WORKER_CMD in cmd else "scheduler", maps)
    roles = sorted(role for role, _ in found.values())
    assert roles == ["scheduler", "worker"], f"expected one scheduler and one worker mapping latent rows: {found}"
    for role, maps in found.values():
        assert {m.name.split()[0] for m in maps} == set(LATENT), (role, [m.name for m in maps])
    return found


def test_every_latent_mapping_is_excluded_from_core_dumps(server):
    for pid, (role, maps) in _latent_maps(server).items():
        for m in maps:
            assert "dd" in m.flags, f"{role} pid {pid}: {m.name} at {m.start:#x} lacks VmFlag dd: {sorted(m.flags)}"


def test_latent_mappings_are_locked(server):
    if not CAN_LOCK:
        pytest.skip(f"RLIMIT_MEMLOCK is {_limit} bytes and no CAP_IPC_LOCK: the server was started without "
                    "--ess-lock-host-memory (raise `ulimit -l` to 4 MiB or more to check `lo`)")
    sizing = server.get("/ess/status")["pool_sizing"]
    for pid, (role, maps) in _latent_maps(server).items():
        for m in maps:
            assert "lo" in m.flags, f"{role} pid {pid}: {m.name} lacks VmFlag lo: {sorted(m.flags)}"
            assert m.kb["Rss"] == m.kb["Size"] and m.kb["Swap"] == 0, (role, m.name, m.kb)
        locked = sum(m.kb["Size"] for m in maps) * 1024
        assert sizing["locked_bytes_expected"] >= locked, \
            f"preflight checked {sizing['locked_bytes_expected']} bytes; {role} pid {pid} locked {locked}"
