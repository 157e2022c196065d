"""Reading HTTP/1.1 responses off a raw socket, for tests that pipeline requests or hold connections."""

from __future__ import annotations

import re
import socket


def read_responses(s: socket.socket, n: int, wait_s: float) -> list[tuple[int, bytes]]:
    """(status, body) of `n` content-length framed responses read from `s`, in order."""
    s.settimeout(wait_s)
    buf, out = b"", []
    while len(out) < n:
        m = re.search(rb"\r\n\r\n", buf)
        if m:
            head = buf[:m.start()]
            length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
            if len(buf) >= m.end() + length:
                out.append((int(head.split()[1]), buf[m.end():m.end() + length]))
                buf = buf[m.end() + length:]
                continue
        d = s.recv(65536)
        assert d, f"connection closed after {len(out)} of {n} responses"
        buf += d
    return out
