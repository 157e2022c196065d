"""Protected host memory (issue 19): every mapping of latent rows is excluded from core dumps (VmFlag
`dd`), its memfd is sealed against resizing, and with lock=True it is mlocked (`lo`), in the
owner's process and in every process that attaches it."""
import ctypes
import fcntl
import os
import resource
import subprocess
import sys

import pytest
import torch

from sgl_ess.prefetch.memory import StoreMemory
from sgl_ess.serving.preflight import has_cap_ipc_lock, memlock_limit_bytes
from sgl_ess.store import HostLatentPool
from sgl_ess.memory.protection import SIZE_SEALS, ProtectedMemoryError
from sgl_ess.memory.shared_segment import SharedSegment
from sgl_ess.store.slot_space import SlotSpace
from tests.unit.store.helpers import make_store
from tests.unit.store.smaps import mapping_at

PAGE = 4096
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _need_memlock(nbytes: int) -> None:
    """Skip only when this process can lock neither by capability nor within its RLIMIT_MEMLOCK."""
    limit = memlock_limit_bytes()
    if not has_cap_ipc_lock() and limit is not None and limit < nbytes:
        pytest.skip(f"RLIMIT_MEMLOCK is {limit} bytes and no CAP_IPC_LOCK: cannot mlock even a {nbytes}-byte "
                    "test segment here (raise `ulimit -l`)")


def test_segment_is_excluded_from_core_dumps_and_not_locked_by_default():
    seg = SharedSegment(3 * PAGE + 5, label="sgl_ess_test")
    m = mapping_at(seg.data_ptr())
    assert m.name.startswith("/memfd:sgl_ess_test"), m.name
    assert "dd" in m.flags and "lo" not in m.flags, m.flags
    assert not seg.locked


def test_segment_is_sealed_against_growing_and_shrinking():
    seg = SharedSegment(2 * PAGE, label="sgl_ess_test")
    assert fcntl.fcntl(seg.fd, fcntl.F_GET_SEALS) & SIZE_SEALS == SIZE_SEALS
    for size in (PAGE, 4 * PAGE, 0):
        with pytest.raises(PermissionError):
            os.ftruncate(seg.fd, size)
    with pytest.raises(PermissionError):                  # F_SEAL_SEAL: the seals themselves are final
        fcntl.fcntl(seg.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
    assert os.fstat(seg.fd).st_size == 2 * PAGE


def test_attached_mapping_is_protected_too_and_unsealed_fds_are_refused():
    seg = SharedSegment(PAGE, label="sgl_ess_test")
    other = SharedSegment.attach(seg.fd, seg.nbytes, "sgl_ess_test")          # what the worker does
    assert other.data_ptr() != seg.data_ptr() and "dd" in mapping_at(other.data_ptr()).flags
    with pytest.raises(ProtectedMemoryError, match=r"is 4096 bytes; the layout says 8192"):
        SharedSegment.attach(seg.fd, 2 * PAGE, "sgl_ess_test")
    plain = os.memfd_create("not_sealed", os.MFD_CLOEXEC)
    try:
        os.ftruncate(plain, PAGE)
        with pytest.raises(ProtectedMemoryError, match=r"expected 0x7 \(GROW\|SHRINK\|SEAL\)"):
            SharedSegment.attach(plain, PAGE, "not_sealed")
    finally:
        os.close(plain)


def test_lock_marks_the_mapping_locked_in_owner_and_attacher():
    _need_memlock(4 * PAGE)
    seg = SharedSegment(PAGE, label="sgl_ess_test", lock=True)
    other = SharedSegment.attach(seg.fd, seg.nbytes, "sgl_ess_test", lock=True)
    for s in (seg, other):
        m = mapping_at(s.data_ptr())
        # smaps' Locked is proportional (two mappings of one page: 2 kB each); all of it is resident
        assert {"dd", "lo"} <= m.flags and m.kb["Locked"] > 0 and m.kb["Rss"] == m.kb["Size"], (m.flags, m.kb)
        assert s.locked


def test_host_pool_and_slot_space_are_protected_and_the_layout_carries_the_lock():
    _need_memlock(16 * PAGE)
    store, _ = make_store(layers=2, row_bytes=16, host_tokens=64, n=20, max_requests=2, k=4, lock_host=True)
    try:
        for seg in (store.host.segment, store.slots.segment):
            m = mapping_at(seg.data_ptr())
            assert {"dd", "lo"} <= m.flags, (seg, m.flags)
        layout = store.memory.layout()
        assert layout["host"]["lock"] and layout["slots"]["lock"]
        mem = StoreMemory.attach(layout)                  # the worker's side, same process for the test
        for seg in (mem.host_segment, mem.slot_segment):
            assert {"dd", "lo"} <= mapping_at(seg.data_ptr()).flags
    finally:
        store.shutdown()
    pool = HostLatentPool(1, 8, 4)
    slots = SlotSpace(1, 1, 8, 4, ring_groups=2, ring_slots=4, device="cpu")
    for seg in (pool.segment, slots.segment):
        m = mapping_at(seg.data_ptr())
        assert "dd" in m.flags and "lo" not in m.flags


def test_a_store_refuses_an_unlocked_host_pool_when_asked_to_lock():
    from sgl_ess.store import LatentStore, StoreConfig

    cfg = StoreConfig(num_layers=1, row_bytes=4, host_capacity_tokens=8, hot_slots_per_request=5, max_requests=1,
                      topk=4, lock_host=True)
    with pytest.raises(ValueError, match="not mlocked"):
        LatentStore(cfg, host_pool=HostLatentPool(1, 8, 4))


_LOCK_CHILD = """
import sys
from sgl_ess.memory.shared_segment import SharedSegment
from sgl_ess.memory.protection import ProtectedMemoryError
try:
    SharedSegment(1 << 20, label="sgl_ess_test", lock=True)
except ProtectedMemoryError as e:
    print(e)
    sys.exit(7)
sys.exit(0)
"""


def _without_memlock():
    """In the child before exec: RLIMIT_MEMLOCK one page, and no CAP_IPC_LOCK after exec (dropped
    from the bounding set, so a root child does not get it back)."""
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (PAGE, PAGE))
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(24, 14, 0, 0, 0) != 0:           # PR_CAPBSET_DROP, CAP_IPC_LOCK
            os._exit(9)


def test_a_lock_over_the_limit_fails_with_the_limit_and_the_fix():
    proc = subprocess.run([sys.executable, "-c", _LOCK_CHILD], cwd=REPO, capture_output=True, text=True,
                          timeout=120, preexec_fn=_without_memlock)
    if proc.returncode == 9:
        pytest.skip("cannot drop CAP_IPC_LOCK here (no CAP_SETPCAP): the limit would not apply to the child")
    assert proc.returncode == 7, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    msg = proc.stdout
    assert "mlock of segment 'sgl_ess_test' (1048576 bytes) failed" in msg, msg
    assert "RLIMIT_MEMLOCK is 4096 bytes per process" in msg and "ulimit -l" in msg, msg
    assert "LimitMEMLOCK" in msg and "--ulimit memlock" in msg and "drop --ess-lock-host-memory" in msg, msg


def test_tensors_alias_the_protected_mapping():
    seg = SharedSegment(PAGE, label="sgl_ess_test")
    t = seg.tensor(torch.uint8, (PAGE,))
    assert t.data_ptr() == seg.data_ptr()
