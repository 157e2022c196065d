"""The /dev/shm files this server's processes created, removed on every exit the launcher survives.

SGLang 0.5.23 leaves files in /dev/shm behind: its schedulers' load snapshot
(``sglang_loads_<name>_<hash>.shm``, managers/load_snapshot.py, held open and mapped by each
scheduler) is never unlinked, and its pid-stamped segments (``sgl_shm_<kind>_<pid>_<rand>``,
``multi_tokenizer_args_<pid>``, utils/stale_shm_cleanup.py) are only swept in SGLang's own CI.
Their names carry no mark of the server that made them, so the launcher attributes them by
looking: a file is this server's when one of its processes holds it open or mapped
(``/proc/PID/fd``, ``/proc/PID/maps``), or when its name carries the pid of one of its processes.

``record()`` looks at the launcher and every descendant; the crash handler calls it when the
server is ready and again before it stops the processes. ``remove_all()`` (exit paths: clean
exit and SIGTERM through process_env.cleanup, a dead child or a failed start through
crash_handler.fatal_exit) records once more and unlinks what it found and is still there, owned
by this user. A SIGKILL of the launcher itself leaves them (nothing runs).
Memory: two small sets (paths, pids), module-level, in the launcher process only.
"""

from __future__ import annotations

import logging
import os
import re

import psutil

logger = logging.getLogger("sgl_ess.launch_server")
SHM_DIR = "/dev/shm"
_PID_STAMPED = (re.compile(r"^sgl_shm_.+_(\d+)_[0-9a-f]+$"), re.compile(r"^multi_tokenizer_args_(\d+)$"))
_paths: set[str] = set()
_pids: set[int] = set()


def held_by(pid: int) -> set[str]:
    """Paths under /dev/shm that process `pid` holds open or mapped (empty if it is gone)."""
    out = set()
    prefix = SHM_DIR + "/"
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefix) and not target.endswith(" (deleted)"):
                out.add(target)
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/maps") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].rstrip("\n")
                    if path.startswith(prefix) and not path.endswith(" (deleted)"):
                        out.add(path)
    except OSError:
        pass
    return out


def pid_stamped(names, pids: set[int]) -> set[str]:
    """Of `names` (files in /dev/shm), the paths whose name carries one of `pids` (SGLang's pid-stamped
    segments)."""
    out = set()
    for name in names:
        for pattern in _PID_STAMPED:
            m = pattern.match(name)
            if m and int(m.group(1)) in pids:
                out.add(os.path.join(SHM_DIR, name))
    return out


def record() -> None:
    """Remember the /dev/shm files the launcher and its live descendants hold, and their pids."""
    try:
        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        _pids.add(p.pid)
        _paths.update(held_by(p.pid))


def recorded() -> set[str]:
    return set(_paths)


def remove_all() -> list[str]:
    """Unlink this server's /dev/shm files (module docstring); returns the paths removed."""
    record()
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        names = []
    removed = []
    uid = os.getuid()
    for path in sorted(_paths | pid_stamped(names, _pids)):
        try:
            if os.lstat(path).st_uid != uid:
                continue
            os.unlink(path)
            removed.append(path)
        except OSError:
            continue
    if removed:
        logger.info("sgl_ess.launch_server: removed %d shared-memory file(s) of this server: %s", len(removed),
                    ", ".join(os.path.basename(p) for p in removed))
    return removed
