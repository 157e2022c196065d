"""The directories ipc:// sockets are made in: SGLang's and sgl-ess's.

SGLang 0.5.23 names its ZMQ sockets (tokenizer, scheduler, detokenizer, rpc, metrics) with
tempfile.NamedTemporaryFile, i.e. `<tempdir>/tmpXXXXXXXX`, with no fallback for a long $TMPDIR.
sgl-ess's prefetch worker uses `<base>/sgless-prefetch-XXXXXXXX/{plans,events}` with the base
from sgl_ess/prefetch/ipc_dir.py. Each must be an existing, writable directory on a filesystem
that can hold AF_UNIX sockets, and each socket path must fit in 107 bytes.
"""
from __future__ import annotations

import os
import secrets
import socket
import tempfile

from sgl_ess.doctor.finding import Finding, bytes_text
from sgl_ess.prefetch.ipc_dir import MKDTEMP_RANDOM_CHARS, SUN_PATH_MAX_BYTES, ipc_base_dir, longest_socket_path

CHECK = "ipc"
MIN_FREE_BYTES = 64 << 20   # sockets need an inode, not bytes; --enable-metrics also writes files to the temp dir


def sglang_socket_path(tempdir: str) -> str:
    return os.path.join(tempdir, "tmp" + "x" * MKDTEMP_RANDOM_CHARS)


def _bind_probe(directory: str) -> str | None:
    """Bind one AF_UNIX socket in `directory`, named like SGLang's (tmp + 8 characters), and remove
    it; None when that works, else why (not writable, or a filesystem without sockets)."""
    path = os.path.join(directory, "tmp" + secrets.token_hex(MKDTEMP_RANDOM_CHARS // 2))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(path)
    except OSError as e:
        return f"cannot bind an AF_UNIX socket in it ({e.strerror or e})"
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return None


def check_ipc_dir(directory: str, socket_paths: dict[str, str]) -> Finding:
    """`socket_paths`: who -> the longest socket path they will bind under `directory`."""
    fix_dir = "set TMPDIR to a short, writable local directory (e.g. /tmp) for the server"
    for who, path in socket_paths.items():
        n = len(os.fsencode(path))
        if n > SUN_PATH_MAX_BYTES:
            return Finding(CHECK, "fail", f"{who}'s ipc:// socket path under {directory} is {n} bytes "
                                          f"({path}); AF_UNIX allows {SUN_PATH_MAX_BYTES}", fix_dir)
    if not os.path.isdir(directory):
        return Finding(CHECK, "fail", f"{directory} does not exist or is not a directory", fix_dir)
    why = _bind_probe(directory)
    if why:
        return Finding(CHECK, "fail", f"{directory}: {why}", fix_dir)
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    lengths = ", ".join(f"{who} {len(os.fsencode(p))}" for who, p in socket_paths.items())
    if st.f_files and not st.f_favail:
        return Finding(CHECK, "fail", f"{directory}: no free inodes (each socket needs one)",
                       "free inodes on that filesystem, or set TMPDIR elsewhere")
    if free < MIN_FREE_BYTES:
        return Finding(CHECK, "warn", f"{directory}: only {bytes_text(free)} free (want {bytes_text(MIN_FREE_BYTES)}: "
                                      f"--enable-metrics writes there)", "free space there, or set TMPDIR elsewhere")
    return Finding(CHECK, "ok", f"{directory}: writable, AF_UNIX bind ok, {bytes_text(free)} free; longest socket "
                                f"path ({lengths}) of {SUN_PATH_MAX_BYTES} bytes")


def check_ipc(environ) -> list[Finding]:
    tempdir, base = tempfile.gettempdir(), ipc_base_dir()
    out = []
    wanted = environ.get("TMPDIR")
    if wanted and os.path.realpath(wanted) != os.path.realpath(tempdir):
        out.append(Finding(CHECK, "warn", f"TMPDIR={wanted} is not usable (missing or not writable): Python "
                                          f"falls back to {tempdir}", "fix or unset TMPDIR"))
    if base == tempdir:
        out.append(check_ipc_dir(tempdir, {"sglang": sglang_socket_path(tempdir),
                                           "sgl-ess": longest_socket_path(base)}))
    else:
        out.append(check_ipc_dir(tempdir, {"sglang": sglang_socket_path(tempdir)}))
        out.append(check_ipc_dir(base, {"sgl-ess": longest_socket_path(base)}))
    return out
