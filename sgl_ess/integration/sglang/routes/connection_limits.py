"""Connection limits below the ASGI app: a header deadline and a bound on connections per client address.

uvicorn (0.5x, SGLang's default HTTP server) has no header timeout: a socket that connects and sends
part of a request line, or a header a byte at a time, is kept open for as long as the client
likes (``timeout_keep_alive`` only runs between requests), and it has no per-client bound
(``limit_concurrency`` is server-wide and SGLang does not set it). Both live at the connection,
below any ASGI middleware, so they are added here as uvicorn's HTTP protocol class:

  * ``--guard-header-timeout-s``: a connection must deliver a complete request head (request line
    and headers) within this many seconds of connecting, and of the first byte of each later
    request; otherwise it is closed. A request whose head arrived is not timed here (its body and
    the answer are the route guard's and SGLang's business).
  * ``--guard-max-connections-per-client``: open connections from one client address; one more is
    answered ``503`` with ``connection: close`` and closed before anything is read. 0: no bound.

Installed through uvicorn's protocol table (``uvicorn.config.HTTP_PROTOCOLS["auto"]``, the name
SGLang's ``uvicorn.Config`` leaves at its default), in the launcher's process before the server
starts. The protocol is always h11's (``H11Protocol``): with httptools installed uvicorn's "auto"
would pick that one instead; the limits are written against h11's connection state only.
Memory: one dict of open connections per client address, on the event loop's thread.
"""

from __future__ import annotations

import json
import logging
from collections import Counter

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("sgl_ess.guard")
PROTOCOL_PATH = f"{__name__}:LimitedH11Protocol"
_header_timeout_s: float = 0.0          # 0: no header deadline
_max_per_client: int = 0                # 0: no bound
_open: Counter = Counter()              # client address -> open connections (event loop thread only)


def configure(header_timeout_s: float, max_connections_per_client: int) -> None:
    global _header_timeout_s, _max_per_client
    _header_timeout_s = float(header_timeout_s)
    _max_per_client = int(max_connections_per_client)


def open_connections(host: str) -> int:
    return _open.get(host, 0)


def refusal_bytes(host: str, limit: int) -> bytes:
    """The raw 503 answer for a connection over the per-client bound."""
    body = json.dumps({"object": "error", "type": "ServiceUnavailable", "code": 503,
                       "message": f"too many open connections from {host}: at most {limit} per client address "
                                  f"(--guard-max-connections-per-client); close idle ones and retry"}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"retry-after: 1\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the two limits of the module docstring."""

    _counted_host = None
    _head_deadline = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        host = self.client[0] if self.client else None
        if host is not None and _max_per_client > 0:
            if _open[host] >= _max_per_client:
                logger.warning("guard: refused a connection from %s: %d open (--guard-max-connections-per-client "
                               "%d)", host, _open[host], _max_per_client)
                transport.write(refusal_bytes(host, _max_per_client))
                transport.close()
                return
            _open[host] += 1
            self._counted_host = host
        self._arm_head_deadline()

    def connection_lost(self, exc) -> None:
        self._cancel_head_deadline()
        host = self._counted_host
        if host is not None:
            self._counted_host = None
            _open[host] -= 1
            if _open[host] <= 0:
                del _open[host]
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            self._arm_head_deadline()            # bytes of a request head, not complete yet: keep timing
        else:
            self._cancel_head_deadline()         # a head arrived (or a response is in flight)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # a pipelined head that was already buffered is handled by super(); a partial one is timed
        # by uvicorn's keep-alive timer until its first new byte arrives (data_received above)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_head_deadline()

    def _arm_head_deadline(self) -> None:
        if _header_timeout_s > 0 and self._head_deadline is None and not self.transport.is_closing():
            self._head_deadline = self.loop.call_later(_header_timeout_s, self._head_timed_out)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        logger.info("guard: closed a connection from %s: no complete request head within %g s "
                    "(--guard-header-timeout-s)", self.client[0] if self.client else "?", _header_timeout_s)
        self.transport.close()


def install(header_timeout_s: float, max_connections_per_client: int) -> None:
    """Make uvicorn's default ("auto") HTTP protocol this one, in this process."""
    from uvicorn import config as uvicorn_config

    configure(header_timeout_s, max_connections_per_client)
    uvicorn_config.HTTP_PROTOCOLS["auto"] = PROTOCOL_PATH
