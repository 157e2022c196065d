"""Issue 7, defect 3: admission that knows the host pool.

server_ops has a 4096-token host pool (64-token pages). SGLang 0.5.23 accepted a request that can
never fit it, never scheduled it, logged nothing, and blocked every later request until its client
left; a request just past the limit came back 200 with zero tokens. Now both are refused at once
with the numbers, every admitted request gets all its tokens, and the queue is visible.
"""

import concurrent.futures as cf
import json
import time

import pytest

from ._http import call, ids_prompt, probe
from .conftest import OPS_POOL_TOKENS

pytestmark = pytest.mark.integration
HANG_S = 120   # a refusal comes in well under this; today's main never answers


def _generate(server, prompt_tokens, max_new, timeout=HANG_S, first_id=None):
    ids = ids_prompt(prompt_tokens)
    if first_id is not None:        # a prompt sharing no prefix (no radix-cache page) with the others
        ids[0] = first_id
    return call(server.base, "/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": max_new, "ignore_eos": True, "temperature": 0}}, timeout=timeout)


@pytest.mark.parametrize("prompt_tokens,max_new", [(3000, 2000),   # main: accepted, never scheduled
                                                   (4030, 10)])     # main: 200 with zero tokens
def test_request_that_can_never_fit_is_refused_at_once_with_the_numbers(server_ops, prompt_tokens, max_new):
    status, text = _generate(server_ops, prompt_tokens, max_new)
    assert status == 400, f"expected a refusal, got {status}: {text[:300]}"
    msg = json.loads(text)["error"]["message"]
    for number in (prompt_tokens, max_new, OPS_POOL_TOKENS):
        assert str(number) in msg, f"{number} missing from: {msg}"
    assert "--ess-memory-pool-size-gb" in msg
    probe(server_ops.base)          # nothing is stuck behind it


def test_request_that_fits_gets_every_token(server_ops):
    # 3900 + 100 + one 64-token page = 4064 < 4096
    status, text = _generate(server_ops, 3900, 100, timeout=600)
    assert status == 200, text[:300]
    assert json.loads(text)["meta_info"]["completion_tokens"] == 100


def test_queue_length_and_wait_are_visible(server_ops):
    """Three requests of 1500 + 300 tokens with distinct prompts (identical ones share their prompt
    through the radix cache, and all three fit): two fit the pool together, the third must wait."""
    seen = []
    with cf.ThreadPoolExecutor(3) as ex:
        jobs = [ex.submit(_generate, server_ops, 1500, 300, 900, 1900 + j) for j in range(3)]
        while not all(j.done() for j in jobs):
            q = server_ops.ess_usage()["queue"]
            seen.append(q)
            time.sleep(0.3)
        results = [j.result() for j in jobs]
    assert all(s == 200 and json.loads(t)["meta_info"]["completion_tokens"] == 300 for s, t in results)
    waiting = [q for q in seen if q["waiting_requests"] >= 1]
    assert waiting, f"no status poll saw a waiting request: {seen[-5:]}"
    assert max(q["oldest_wait_s"] for q in waiting) > 0
    assert any(q["running_requests"] >= 1 for q in seen)
