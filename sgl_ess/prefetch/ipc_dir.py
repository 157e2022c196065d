"""Where the prefetch worker's ipc:// sockets live, as one rule the client and the doctor share.

Each worker incarnation gets a private directory `<base>/sgless-prefetch-XXXXXXXX/` (mkdtemp, mode
0700) holding two sockets, `plans` and `events`. An ipc:// endpoint is an AF_UNIX path, and
sockaddr_un holds at most 107 bytes plus the NUL, so a long temp directory (a deep $TMPDIR) is
replaced by /tmp. No zmq here: `python -m sgl_ess.doctor` imports this without the data path.
"""
from __future__ import annotations

import os
import tempfile

IPC_DIR_PREFIX = "sgless-prefetch-"
SOCKET_NAMES = ("plans", "events")
SUN_PATH_MAX_BYTES = 107        # sizeof(sockaddr_un.sun_path) - 1 on Linux
MAX_BASE_CHARS = 60             # longer temp dirs fall back to /tmp
MKDTEMP_RANDOM_CHARS = 8        # tempfile's random names are 8 characters


def ipc_base_dir() -> str:
    """The directory the private ipc directories are made in (honours $TMPDIR when short)."""
    base = tempfile.gettempdir()
    return base if len(base) <= MAX_BASE_CHARS else "/tmp"


def longest_socket_path(base: str) -> str:
    """The longest socket path a worker directory under `base` will hold."""
    name = IPC_DIR_PREFIX + "x" * MKDTEMP_RANDOM_CHARS
    return os.path.join(base, name, max(SOCKET_NAMES, key=len))
