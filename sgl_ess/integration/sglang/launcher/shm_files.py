"""The /dev/shm files this server's processes created, removed on every exit the launcher survives.

SGLang 0.5.23 leaves files in /dev/shm behind: its schedulers' load snapshot
(``sglang_loads_<name>_<hash>.shm``, managers/load_snapshot.py, held open and mapped by each
scheduler) is never unlinked, and its pid-stamped segments (``sgl_shm_<kind>_<pid>_<rand>``,
``multi_tokenizer_args_<pid>``, utils/stale_shm_cleanup.py) are only swept in SGLang's own CI.
Only SGLang's own names are considered (those three patterns; any other file is never ours to
remove), and the launcher attributes them by looking:
  * ``sglang_loads_*.shm`` is this server's when one of its processes holds it open or mapped
    (``/proc/PID/fd``, ``/proc/PID/maps``);
  * a pid-stamped name is this server's when its pid is one of its processes, recorded as
    (pid, create time) while alive: a pid since reused by an unrelated process does not match;
  * whatever the evidence, a path a live process outside the server's tree holds open or mapped
    is left alone (held by us is not created by us: another program's segment we mapped stays).

``record()`` looks at the launcher and every descendant; the crash handler calls it when the
server is ready and again before it stops the processes. ``remove_all()`` (exit paths: clean
exit and SIGTERM through process_env.cleanup, a dead child or a failed start through
crash_handler.fatal_exit) records once more and unlinks what it found and is still there, owned
by this user. A SIGKILL of the launcher itself leaves them (nothing runs).
Memory: two small sets (paths, (pid, create time)), module-level, in the launcher process only.
"""

from __future__ import annotations

import logging
import os
import re

import psutil

logger = logging.getLogger("sgl_ess.launch_server")
SHM_DIR = "/dev/shm"
_PID_STAMPED = (re.compile(r"^sgl_shm_.+_(\d+)_[0-9a-f]+$"), re.compile(r"^multi_tokenizer_args_(\d+)$"))
_HELD_NAMES = re.compile(r"^sglang_loads_.+\.shm$")        # managers/load_snapshot.py shm_path_for
_paths: set[str] = set()
_procs: set[tuple[int, float]] = set()                     # (pid, create time) of the server's processes


def sglang_name(path: str) -> bool:
    """Whether `path`'s name is one SGLang 0.5.23 gives its /dev/shm files (module docstring)."""
    name = os.path.basename(path)
    return bool(_HELD_NAMES.match(name)) or any(p.match(name) for p in _PID_STAMPED)


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


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def pid_stamped(names, procs: set[tuple[int, float]]) -> set[str]:
    """Of `names` (files in /dev/shm), the paths whose name carries the pid of one of `procs`
    ((pid, create time)), unless that pid now belongs to another process (reused)."""
    ours = {pid: ct for pid, ct in procs}
    out = set()
    for name in names:
        for pattern in _PID_STAMPED:
            m = pattern.match(name)
            if not m or int(m.group(1)) not in ours:
                continue
            now = _create_time(int(m.group(1)))
            if now is None or now == ours[int(m.group(1))]:     # gone, or still ours
                out.add(os.path.join(SHM_DIR, name))
    return out


def _tree() -> list[psutil.Process]:
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def record() -> None:
    """Remember SGLang's /dev/shm files the launcher and its live descendants hold, and the processes."""
    try:
        procs = _tree()
    except psutil.Error:
        return
    for p in procs:
        try:
            _procs.add((p.pid, p.create_time()))
        except psutil.Error:
            continue
        _paths.update(path for path in held_by(p.pid) if _HELD_NAMES.match(os.path.basename(path)))


def held_outside(paths: set[str]) -> set[str]:
    """Of `paths`, those a live process outside the launcher's tree holds open or mapped."""
    if not paths:
        return set()
    try:
        ours = {p.pid for p in _tree()}
    except psutil.Error:
        ours = {os.getpid()}
    out = set()
    for pid in psutil.pids():
        if pid not in ours:
            out |= held_by(pid) & paths
    return out


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
    candidates = {p for p in _paths | pid_stamped(names, _procs) if sglang_name(p)}
    for path in sorted(candidates - held_outside(candidates)):
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
