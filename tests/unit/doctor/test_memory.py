"""Host memory vs the planned pool (fake /proc/meminfo), and RLIMIT_MEMLOCK with injected limits."""
from sgl_ess.doctor.memory import check_host_memory, check_memlock, planned_pool
from sgl_ess.serving.host_memory import meminfo
from tests.unit.doctor.fake_tree import meminfo as fake_meminfo

GB = 10**9


def test_pool_that_fits_is_ok_and_too_big_fails(tmp_path):
    path = fake_meminfo(tmp_path / "meminfo", total_kb=512 * 10**6, available_kb=400 * 10**6)   # ~524 / 410 GB
    info = meminfo(str(path))
    ok = check_host_memory(planned_pool(None, 200, info), info, str(path))
    assert ok.status == "ok" and "200.00 GB" in ok.detail
    bad = check_host_memory(planned_pool(None, 400, info), info, str(path))
    assert bad.status == "fail" and "--ess-memory-pool-size-gb" in bad.fix


def test_default_pool_is_the_launchers_and_pool_bytes_wins(tmp_path):
    info = meminfo(str(fake_meminfo(tmp_path / "meminfo", total_kb=100 * 10**6, available_kb=90 * 10**6)))
    default = planned_pool(None, 0.0, info)
    assert "MemAvailable minus the safety margin" in default.source
    assert default.nbytes == 90 * 10**6 * 1024 - int(0.10 * 100 * 10**6 * 1024)   # available - 10% of total
    assert planned_pool(123, 50, info).nbytes == 123


def test_missing_meminfo_skips(tmp_path):
    info = meminfo(str(tmp_path / "absent"))
    assert check_host_memory(planned_pool(None, 10, info), info, "absent").status == "skip"


def test_memlock_cases():
    assert check_memlock(0, 200 * GB, 8 << 20, 8 << 20, False).status == "info"
    assert check_memlock(200 * GB, 200 * GB, None, None, False).status == "ok"
    warn = check_memlock(200 * GB, 200 * GB, 8 << 20, None, False)
    assert warn.status == "warn" and "ulimit -l unlimited" in warn.fix
    fail = check_memlock(200 * GB, 200 * GB, 64 << 10, 64 << 10, False)
    assert fail.status == "fail" and "memlock=-1:-1" in fail.fix and "ulimit -l 64" in fail.detail
    assert check_memlock(200 * GB, 200 * GB, 64 << 10, 64 << 10, True).status == "ok"
