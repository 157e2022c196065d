"""shm_files: a /dev/shm file a descendant process holds open or mapped is recorded and removed;
pid-stamped SGLang names of recorded pids are matched, others not; a file nobody of ours holds stays."""

import os
import subprocess
import sys
import time
import uuid

import pytest

from sgl_ess.integration.sglang.launcher import shm_files

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this machine")

HOLDER = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
if sys.argv[2] == "map-only":
    os.close(fd)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["fd-and-map", "map-only"])
def test_held_file_recorded_and_removed(how):
    path = f"/dev/shm/sgl_ess_test_{uuid.uuid4().hex}.shm"
    other = f"/dev/shm/sgl_ess_test_other_{uuid.uuid4().hex}.shm"
    open(other, "wb").close()
    child = subprocess.Popen([sys.executable, "-c", HOLDER, path, how], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert path in shm_files.held_by(child.pid)
        shm_files.record()
        assert path in shm_files.recorded()
    finally:
        child.kill()
        child.wait()
    removed = shm_files.remove_all()              # the holder is gone: removed from what was recorded
    try:
        assert path in removed and not os.path.exists(path)
        assert os.path.exists(other)              # nobody of ours held it
    finally:
        os.unlink(other)


def test_pid_stamped_names():
    names = ["sgl_shm_mm_1234_ab12cd34", "sgl_shm_mm_999_ab12cd34", "multi_tokenizer_args_1234",
             "multi_tokenizer_args_77", "sglang_loads_x_1234.shm", "sem.mp-1234"]
    got = shm_files.pid_stamped(names, {1234})
    assert got == {"/dev/shm/sgl_shm_mm_1234_ab12cd34", "/dev/shm/multi_tokenizer_args_1234"}


def test_held_by_a_gone_process_is_empty():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    time.sleep(0.1)
    assert shm_files.held_by(p.pid) == set()
