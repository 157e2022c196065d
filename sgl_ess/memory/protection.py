"""Protected host memory: what every mapping of latent rows gets (sgl_ess.memory.shared_segment).

Latent rows are user data. Every mapping that holds them, in the scheduler and in the prefetch
worker, is
  excluded from core dumps   madvise(MADV_DONTDUMP): the VmFlag `dd` in /proc/PID/smaps;
  sealed against resizing    the memfd carries F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL, so no
                             process holding the fd can shrink it under another's mapping (a
                             SIGBUS) or grow it; the seals themselves can no longer change;
  locked against swap        only with --ess-lock-host-memory (mlock: VmFlag `lo`). The limit is
                             RLIMIT_MEMLOCK per process (unless it has CAP_IPC_LOCK); the launcher
                             checks it before the model loads (sgl_ess.serving.preflight).
Every failure raises ProtectedMemoryError naming the segment, what failed, and the fix: nothing
is left silently unprotected.

Not covered here, by design (see launch/OPERATIONS.md "Protected host memory"): transient copies
in the torch CPU heap (the torch FlashTrans path gathers rows into a temporary before scattering
them; attention and the model's activations are user data too). Those are ordinary malloc
memory; to keep them out of dumps, run with core dumps off (`ulimit -c 0`, systemd LimitCORE=0),
and without swap or with encrypted swap.

Linux only; no torch here.
"""
from __future__ import annotations

import ctypes
import errno as errno_mod
import fcntl
import mmap
import os

SIZE_SEALS = (getattr(fcntl, "F_SEAL_GROW", 0) | getattr(fcntl, "F_SEAL_SHRINK", 0)
              | getattr(fcntl, "F_SEAL_SEAL", 0))


class ProtectedMemoryError(OSError):
    """A latent-row mapping could not be protected; the message says what failed and the fix."""


def memfd_flags() -> int:
    """Flags for os.memfd_create: close-on-exec, and sealable (raises where sealing is missing)."""
    if not hasattr(os, "MFD_ALLOW_SEALING") or not hasattr(fcntl, "F_ADD_SEALS") or not SIZE_SEALS:
        raise ProtectedMemoryError(
            "this Python has no memfd sealing (os.MFD_ALLOW_SEALING, fcntl.F_ADD_SEALS / F_SEAL_*: Linux, "
            "Python >= 3.9): sgl-ess seals its latent-row segments against resizing; run on Linux with Python >= 3.9")
    return os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING


def seal_size(fd: int, label: str) -> None:
    """Seal a memfd (made with memfd_flags(), already ftruncated) against growing and shrinking."""
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SIZE_SEALS)
    except OSError as e:
        raise ProtectedMemoryError(e.errno, f"segment {label!r}: fcntl(F_ADD_SEALS, GROW|SHRINK|SEAL) failed "
                                            f"({e.strerror}); the memfd must be created with MFD_ALLOW_SEALING")


def seals(fd: int) -> int:
    """The seals on `fd` (fcntl F_GET_SEALS)."""
    return fcntl.fcntl(fd, fcntl.F_GET_SEALS)


def check_sealed(fd: int, nbytes: int, label: str) -> None:
    """Before a process maps a segment it inherited: the fd is `nbytes` long and sealed against resizing.
    A bad fd raises the OSError of fstat (EBADF)."""
    size = os.fstat(fd).st_size
    if size != nbytes:
        raise ProtectedMemoryError(errno_mod.EINVAL, f"segment {label!r} (fd {fd}) is {size} bytes; the layout "
                                                     f"says {nbytes}: not the segment the store created")
    have = seals(fd)
    if have & SIZE_SEALS != SIZE_SEALS:
        raise ProtectedMemoryError(errno_mod.EINVAL, f"segment {label!r} (fd {fd}) has seals {have:#x}; expected "
                                                     f"{SIZE_SEALS:#x} (GROW|SHRINK|SEAL): not made by SharedSegment")


def exclude_from_dumps(m: mmap.mmap, label: str) -> None:
    """madvise(MADV_DONTDUMP) over the whole mapping `m`."""
    if not hasattr(mmap, "MADV_DONTDUMP") or not hasattr(m, "madvise"):
        raise ProtectedMemoryError(
            errno_mod.ENOSYS, f"segment {label!r}: this Python has no mmap.madvise / MADV_DONTDUMP (Linux, "
                              "Python >= 3.8); sgl-ess excludes latent rows from core dumps")
    try:
        m.madvise(mmap.MADV_DONTDUMP)
    except OSError as e:
        raise ProtectedMemoryError(e.errno, f"segment {label!r}: madvise(MADV_DONTDUMP) failed ({e.strerror}); "
                                            "latent rows would show up in core dumps")


_libc = None


def lock_mapping(addr: int, nbytes: int, label: str) -> None:
    """mlock [addr, addr + nbytes): resident, never swapped, until unmapped (--ess-lock-host-memory)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        _libc.mlock.restype = ctypes.c_int
    if _libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(nbytes)) == 0:
        return
    err = ctypes.get_errno()
    from sgl_ess.serving.preflight import MEMLOCK_FIX, memlock_limit_bytes

    limit = memlock_limit_bytes()
    shown = "unlimited" if limit is None else f"{limit} bytes"
    raise ProtectedMemoryError(err, f"--ess-lock-host-memory: mlock of segment {label!r} ({nbytes} bytes) failed "
                                    f"({os.strerror(err)}); RLIMIT_MEMLOCK is {shown} per process. {MEMLOCK_FIX}")
