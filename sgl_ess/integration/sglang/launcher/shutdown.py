"""Bounded shutdown, and streams that end with an error event instead of a cut body.

SGLang 0.5.23 on SIGTERM sets ``gracefully_exit`` and waits, in 5-second polls, until no request
is left -- while still admitting new ones, so under steady traffic it never exits. Here:
  * SIGTERM (crash_handler.EssSignalHandler) starts the drain at once: the route guard answers 503
    to new inference requests and to /health, so load balancers move away;
  * running requests may finish for ``--ess-drain-timeout-s``; then every request still open is
    ended with an abort whose status is 503 -- a streamed one gets SGLang's own error event
    (``finish_reason`` abort with a message, or an OpenAI error chunk), a non-streamed one a 503 --
    and SGLang's own exit path runs (schedulers released, exit 0);
  * when a server process dies (crash_handler), the same ``end_all`` runs before the launcher
    exits, so clients read an error event, not a truncated body.
Memory: none of its own; it touches only the tokenizer manager's ``rid_to_state`` on its loop.
"""

from __future__ import annotations

import asyncio
import logging
import time

logger = logging.getLogger("sgl_ess.shutdown")
_draining = False


def begin_drain() -> None:
    global _draining
    if not _draining:
        _draining = True
        logger.warning("sgl-ess: draining: new requests get 503 from now on")


def draining() -> bool:
    return _draining


def end_all(tokenizer_manager, message: str, status_code: int = 503) -> int:
    """Finish every open request with an abort carrying `status_code`; returns how many. Runs on
    the tokenizer manager's event loop (or from a signal handler on that thread)."""
    n = 0
    for rid, state in list(tokenizer_manager.rid_to_state.items()):
        if state.finished:
            continue
        out = {"text": "", "output_ids": [], "meta_info": {
            "id": rid, "finish_reason": {"type": "abort", "message": message, "status_code": status_code},
            "prompt_tokens": 0, "completion_tokens": 0}}
        state.out_list.append(out)
        state.finished = True
        state.event.set()
        # the waiter holds `state`; dropping it here keeps the scheduler's own abort answer (sent
        # below, status None) from landing after ours and replacing the error the client reads
        tokenizer_manager.rid_to_state.pop(rid, None)
        n += 1
    if n:
        try:
            tokenizer_manager.abort_request(abort_all=True)
        except Exception:  # noqa: BLE001 - the scheduler may already be gone
            logger.info("abort_all not delivered (the scheduler is gone)")
    return n


async def drain(tokenizer_manager, timeout_s: float) -> None:
    """Wait for SIGTERM, let running requests finish for `timeout_s`, then end the rest."""
    while not tokenizer_manager.gracefully_exit:
        await asyncio.sleep(0.2)
    begin_drain()
    deadline = time.monotonic() + timeout_s
    while tokenizer_manager.rid_to_state and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    left = end_all(tokenizer_manager, f"the server is shutting down (drain timeout {timeout_s:g} s reached); "
                                      "retry on another replica")
    if left:
        logger.warning("sgl-ess: drain timeout %.1f s reached; ended %d open requests with an error", timeout_s, left)
    await asyncio.sleep(1.0)                             # let the answers and error events leave
