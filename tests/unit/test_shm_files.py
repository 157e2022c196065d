"""shm_files: an SGLang-named /dev/shm file a descendant process holds open or mapped is recorded and
removed; pid-stamped SGLang names of recorded pids are matched, others (and reused pids) not; a file
nobody of ours holds stays; a file we map but someone else created and still holds stays."""

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
    path = f"/dev/shm/sglang_loads_sgl_ess_test_{uuid.uuid4().hex}.shm"
    other = f"/dev/shm/sglang_loads_sgl_ess_test_other_{uuid.uuid4().hex}.shm"
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
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()                                                   # a process of ours, gone
    gone = child.pid
    alive = os.getpid()
    mine = (alive, shm_files._create_time(alive))
    reused = (os.getppid(), 1.0)                                   # that pid now belongs to another process
    names = [f"sgl_shm_mm_{gone}_ab12cd34", f"sgl_shm_mm_{alive}_ab12cd34", "sgl_shm_mm_999999999_ab12cd34",
             f"multi_tokenizer_args_{alive}", "multi_tokenizer_args_999999999", f"sglang_loads_x_{alive}.shm",
             f"sem.mp-{alive}", f"sgl_shm_mq_{os.getppid()}_ab12cd34"]
    got = shm_files.pid_stamped(names, {(gone, 123.0), mine, reused})
    assert got == {f"/dev/shm/sgl_shm_mm_{gone}_ab12cd34", f"/dev/shm/sgl_shm_mm_{alive}_ab12cd34",
                   f"/dev/shm/multi_tokenizer_args_{alive}"}


OUTSIDER = "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], " \
           "'fd-and-map'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, " \
           "start_new_session=True).pid, flush=True)"


def test_mapped_by_us_but_created_by_someone_else_is_not_removed():
    """A file one of our processes maps is not ours when another program created it: neither a name
    SGLang does not use, nor an SGLang name a live process outside our tree still holds, is removed."""
    foreign = f"/dev/shm/other_program_{uuid.uuid4().hex}"
    shared = f"/dev/shm/sglang_loads_other_server_{uuid.uuid4().hex}.shm"
    outsiders, ours = [], []
    try:
        for path in (foreign, shared):                  # created and held by a process outside our tree
            launcher = subprocess.run([sys.executable, "-c", OUTSIDER, HOLDER, path], capture_output=True,
                                      text=True, check=True)
            outsiders.append(int(launcher.stdout.split()[0]))
            while not os.path.exists(path):
                time.sleep(0.05)
        for path in (foreign, shared):                  # and mapped by a process of ours
            child = subprocess.Popen([sys.executable, "-c", HOLDER, path, "map-only"], stdout=subprocess.PIPE,
                                     text=True)
            ours.append(child)
            assert child.stdout.readline().strip() == "ready"
        shm_files.record()
        removed = shm_files.remove_all()
        assert not ({foreign, shared} & set(removed)), removed
        assert os.path.exists(foreign) and os.path.exists(shared)
    finally:
        for child in ours:
            child.kill()
            child.wait()
        for pid in outsiders:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        for path in (foreign, shared):
            if os.path.exists(path):
                os.unlink(path)


def test_held_by_a_gone_process_is_empty():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    time.sleep(0.1)
    assert shm_files.held_by(p.pid) == set()
