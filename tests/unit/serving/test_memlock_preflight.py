"""--ess-lock-host-memory before the model loads (issue 19): the bytes each process will mlock are
checked against RLIMIT_MEMLOCK; a request above it is refused with one line naming what was
wanted, the limit and the fix, and the launcher exits 2."""
import pytest

from sgl_ess.config import build_config
from sgl_ess.integration.sglang.launcher import launcher_defaults as ld
from sgl_ess.serving import exit_codes, preflight
from sgl_ess.serving.preflight import PreflightError, check_memlock, has_cap_ipc_lock, slot_space_bytes

MB = 10 ** 6


def _cfg(**flags):
    return build_config(None, {k: str(v) for k, v in flags.items()}, environ={})


def test_a_lock_above_the_limit_is_refused_with_wanted_limit_and_fix():
    with pytest.raises(PreflightError) as e:
        check_memlock(200 * MB, "host pool 200000000 B", limit_bytes=8 << 20, cap_ipc_lock=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert "locks 200000000 bytes (200.0 MB: host pool 200000000 B)" in msg, msg
    assert "RLIMIT_MEMLOCK is 8388608 bytes (8.4 MB) per process" in msg, msg
    for fix in ("ulimit -l", "LimitMEMLOCK", "--ulimit memlock", "drop --ess-lock-host-memory"):
        assert fix in msg, (fix, msg)


def test_within_the_limit_unlimited_or_with_cap_ipc_lock_passes():
    check_memlock(8 << 20, "x", limit_bytes=8 << 20, cap_ipc_lock=False)
    check_memlock(10 ** 12, "x", limit_bytes=None, cap_ipc_lock=False)
    check_memlock(10 ** 12, "x", limit_bytes=4096, cap_ipc_lock=True)


def test_cap_ipc_lock_is_read_from_capeff(tmp_path):
    f = tmp_path / "status"
    f.write_text("Name:\tpython\nCapEff:\t0000000000004000\n")
    assert has_cap_ipc_lock(str(f))
    f.write_text("CapEff:\t000001ffffffbfff\n")                      # every capability but IPC_LOCK
    assert not has_cap_ipc_lock(str(f))
    assert not has_cap_ipc_lock(str(tmp_path / "missing"))


@pytest.mark.parametrize("layers,row,reqs,hot,k,ring,spec", [(2, 160, 9, 40, 32, 0, 0), (3, 16, 5, 7, 4, 11, 6),
                                                              (1, 1152, 65, 128, 32, 0, 260)])
def test_slot_space_estimate_is_what_the_store_allocates(layers, row, reqs, hot, k, ring, spec):
    from sgl_ess.store import StoreConfig
    from sgl_ess.store.slot_space import SlotSpace

    cfg = StoreConfig(num_layers=layers, row_bytes=row, host_capacity_tokens=64, hot_slots_per_request=hot,
                      max_requests=reqs, topk=k, ring_slots=ring, spec_slots=spec)
    space = SlotSpace(layers, reqs, hot, row, cfg.ring_groups, cfg.ring_slots_per_group, "cpu", spec_slots=spec)
    assert slot_space_bytes(layers, row, reqs, hot, k, ring, spec) == space.segment.nbytes


def _limit(monkeypatch, limit, cap=False):
    monkeypatch.setattr(preflight, "memlock_limit_bytes", lambda: limit)
    monkeypatch.setattr(preflight, "has_cap_ipc_lock", lambda status_path="/proc/self/status": cap)


def test_launcher_checks_the_bytes_it_will_lock(monkeypatch):
    _limit(monkeypatch, 64 << 20)
    out, sizing = ld.fill_defaults(["--max-total-tokens", "4096", "--max-running-requests", "8",
                                    "--ess-hot-slots-per-request", "40"], _cfg(lock_host_memory="true",
                                                                               hot_slots_per_request=40),
                                   has_cuda=False)
    host = (4096 + 64) * 2 * 160                                      # tiny model: 2 layers, 160-byte rows
    slots = slot_space_bytes(2, 160, 9, 40, 32)
    page = lambda n: -(-n // 4096) * 4096                            # noqa: E731
    assert sizing["locked_bytes_expected"] == page(host) + page(slots)
    _limit(monkeypatch, 1 << 20)
    with pytest.raises(PreflightError, match=r"RLIMIT_MEMLOCK is 1048576 bytes.*ulimit -l"):
        ld.fill_defaults(["--max-total-tokens", "4096"], _cfg(lock_host_memory="true"), has_cuda=False)
    out, sizing = ld.fill_defaults(["--max-total-tokens", "4096"], _cfg(), has_cuda=False)   # off: no check
    assert "locked_bytes_expected" not in sizing


def test_lock_with_ess_off_is_refused():
    with pytest.raises(PreflightError, match="--ess-lock-host-memory needs ESS on"):
        ld.fill_defaults([], _cfg(lock_host_memory="true", enabled="false"), has_cuda=False)


def test_the_launcher_exits_2_with_one_line(monkeypatch, capsys):
    from sgl_ess.integration.sglang.launcher import server_args

    _limit(monkeypatch, 1 << 20)
    with pytest.raises(SystemExit) as e:
        server_args.main(["--ess-lock-host-memory", "true", "--max-total-tokens", "65536"])
    assert e.value.code == exit_codes.CONFIG == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sgl_ess.launch_server: error: --ess-lock-host-memory:"), err
    assert "RLIMIT_MEMLOCK is 1048576 bytes" in err[0] and "ulimit -l" in err[0], err
