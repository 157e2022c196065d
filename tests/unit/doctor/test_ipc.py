"""The ipc:// socket directory check: a usable directory, a path over the AF_UNIX limit, a missing one."""
import os

from sgl_ess.doctor.ipc import check_ipc, check_ipc_dir, sglang_socket_path
from sgl_ess.prefetch.ipc_dir import SUN_PATH_MAX_BYTES, ipc_base_dir, longest_socket_path


def test_usable_directory_is_ok(tmp_path):
    f = check_ipc_dir(str(tmp_path), {"sglang": sglang_socket_path(str(tmp_path))})
    assert f.status == "ok" and "AF_UNIX bind ok" in f.detail
    assert os.listdir(tmp_path) == []          # the probe socket is removed


def test_path_too_long_fails(tmp_path):
    deep = tmp_path / ("d" * (SUN_PATH_MAX_BYTES - len(str(tmp_path))))
    deep.mkdir()
    f = check_ipc_dir(str(deep), {"sglang": sglang_socket_path(str(deep))})
    assert f.status == "fail" and f"AF_UNIX allows {SUN_PATH_MAX_BYTES}" in f.detail and "TMPDIR" in f.fix


def test_missing_directory_fails(tmp_path):
    f = check_ipc_dir(str(tmp_path / "absent"), {"sglang": sglang_socket_path(str(tmp_path / "absent"))})
    assert f.status == "fail" and "does not exist" in f.detail


def test_prefetch_base_falls_back_to_tmp_for_a_long_tmpdir(tmp_path, monkeypatch):
    import tempfile

    long_dir = tmp_path / ("t" * 70)
    long_dir.mkdir()
    monkeypatch.setenv("TMPDIR", str(long_dir))
    monkeypatch.setattr(tempfile, "tempdir", None)       # gettempdir() re-reads TMPDIR
    try:
        assert ipc_base_dir() == "/tmp"
        assert len(os.fsencode(longest_socket_path(ipc_base_dir()))) <= SUN_PATH_MAX_BYTES
        sglang_dir, ours = check_ipc(dict(os.environ))         # SGLang's dir and sgl-ess's /tmp, each checked
        assert ours.status == "ok" and ours.detail.startswith("/tmp:")
        too_long = len(os.fsencode(sglang_socket_path(str(long_dir)))) > SUN_PATH_MAX_BYTES
        assert sglang_dir.status == ("fail" if too_long else "ok")   # SGLang has no fallback
    finally:
        monkeypatch.setattr(tempfile, "tempdir", None)
