"""The blocking routes' rendezvous, bounded in the scheduler by the route guard's own timeout.

The route guard answers a blocking route (/init_weights_update_group, remote-instance weight
transfer) with a 504 after ``--guard-blocking-timeout-s``, but that only frees the client: the
scheduler is still inside SGLang's ``init_custom_process_group`` (utils/common.py), which every
caller in SGLang 0.5.23 calls without ``timeout=`` (torch's default: 30 minutes). Worse, with a
peer that accepts the TCP connection and stays silent, torch 2.13's TCPStore client waits in its
``ping()`` handshake with no timeout at all (``timeout=`` does not reach that read): the scheduler,
and every request behind it, waits until the peer closes.

Here (HookRegistry AROUND on the three module bindings SGLang calls; the function is imported by
name into each module):
  * a call without ``timeout`` runs with ``timedelta(seconds=--guard-blocking-timeout-s)`` (the
    store's connect and operations during the rendezvous honour it); the group it returns is then
    given back torch's default timeout (``_set_pg_timeout``, and its store's), so the bound covers
    the rendezvous only, never the group's later collectives (update_weights_from_distributed's
    broadcasts keep torch's 30 minutes). A caller's own ``timeout`` is kept as it is;
  * a timer of the same length: if the call has not returned by then, the TCP connections of this
    process to the rendezvous address (``init_method`` tcp://host:port) are shut down, so the
    blocked read ends with torch's own error ("Failed to recv ... Connection was likely closed"),
    which SGLang returns as the route's failure message; the scheduler then serves again. A flag
    under a lock, set when the call returns, keeps a late timer from cutting a group just set up;
  * a call passing ``timeout`` positionally (none in SGLang 0.5.23) is left alone, with a warning.
Registered only in processes of a server the launcher started (``SGLESS_OPS`` set).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
from datetime import timedelta
from urllib.parse import urlsplit

import psutil

logger = logging.getLogger("sgl_ess.guard")
_MODULES = ("sglang.srt.model_executor.model_runner_components.weight_updater",
            "sglang.srt.model_executor.model_runner_components.weight_exporter",
            "sglang.srt.connector.remote_instance")
TARGETS = tuple(m + ".init_custom_process_group" for m in _MODULES)


def _timeout_s() -> float:
    from sgl_ess.serving.ops_config import ops_from_env

    return ops_from_env().guard_blocking_timeout_s


def bounded_kwargs(kwargs: dict, timeout_s: float) -> dict:
    """`kwargs` of an init_custom_process_group call with ``timeout`` set when the caller gave none."""
    if kwargs.get("timeout") is not None:
        return kwargs
    return {**kwargs, "timeout": timedelta(seconds=timeout_s)}


def rendezvous_peer(init_method) -> tuple[str, int] | None:
    """(host, port) of a ``tcp://host:port`` init method; None for any other."""
    if not isinstance(init_method, str) or not init_method.startswith("tcp://"):
        return None
    try:
        parts = urlsplit(init_method)
        return (parts.hostname, parts.port) if parts.hostname and parts.port else None
    except ValueError:
        return None


def _addresses(host: str) -> set[str]:
    try:
        return {_plain(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return set()


def _plain(ip: str) -> str:
    """'::ffff:127.0.0.1' -> '127.0.0.1' (an IPv4 peer seen through a dual-stack socket)."""
    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return ip
    mapped = getattr(addr, "ipv4_mapped", None)
    return str(mapped or addr)


def cut_connections(host: str, port: int) -> int:
    """Shut down this process's TCP connections to host:port (the blocked read then fails); how many."""
    wanted, n = _addresses(host), 0
    for c in psutil.Process().net_connections(kind="tcp"):
        if not c.raddr or c.raddr.port != port or c.fd < 0 or _plain(c.raddr.ip) not in wanted:
            continue
        try:
            dup = socket.socket(fileno=os.dup(c.fd))
        except OSError:
            continue
        try:
            dup.shutdown(socket.SHUT_RDWR)           # acts on the socket, so the original fd's read ends too
            n += 1
        except OSError:
            pass
        finally:
            dup.close()
    return n


def _restore_group_timeout(pg, timeout) -> None:
    """Give group `pg` (and its store) `timeout`: the rendezvous bound must not outlive the rendezvous."""
    try:
        import torch.distributed.distributed_c10d as c10d

        c10d._set_pg_timeout(timeout, pg)
        entry = c10d._world.pg_map.get(pg)
        if entry is not None:
            entry[1].set_timeout(timeout)
    except Exception:  # noqa: BLE001 - a group that works with a shorter timeout beats a failed route
        logger.warning("process group: could not restore its timeout to %s after the bounded rendezvous; "
                       "its collectives keep --guard-blocking-timeout-s", timeout, exc_info=True)


def _around_init_group(original_fn, *args, **kwargs):
    if len(args) >= 3:                       # (backend, init_method, timeout, ...) positionally: the caller's
        logger.warning("init_custom_process_group called with %d positional arguments: its rendezvous is not "
                       "bounded by --guard-blocking-timeout-s (the hook reads init_method/timeout as keywords)",
                       len(args))
        return original_fn(*args, **kwargs)
    callers_timeout = kwargs.get("timeout")
    kwargs = bounded_kwargs(kwargs, _timeout_s())
    timeout_s = kwargs["timeout"].total_seconds()
    peer = rendezvous_peer(kwargs.get("init_method"))
    timer, lock, state = None, threading.Lock(), {"returned": False}
    if peer is not None:
        def give_up():
            with lock:
                if state["returned"]:
                    return
                n = cut_connections(*peer)
            logger.error("process group %r: no rendezvous with %s:%d within %g s (--guard-blocking-timeout-s); "
                         "closed %d connection(s) to it", kwargs.get("group_name"), peer[0], peer[1], timeout_s, n)
        timer = threading.Timer(timeout_s, give_up)
        timer.daemon = True
        timer.start()
    try:
        pg = original_fn(*args, **kwargs)
    finally:
        with lock:
            state["returned"] = True
        if timer is not None:
            timer.cancel()
    if callers_timeout is None and pg is not None:
        from torch.distributed.distributed_c10d import default_pg_timeout

        _restore_group_timeout(pg, default_pg_timeout)
    return pg


def register() -> None:
    """AROUND hooks on TARGETS, in a server the launcher started (SGLESS_OPS set); else nothing."""
    import os

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sgl_ess.serving.ops_config import ENV_OPS_JSON

    if not os.environ.get(ENV_OPS_JSON):
        return
    for target in TARGETS:
        HookRegistry.register(target, _around_init_group, HookType.AROUND)
