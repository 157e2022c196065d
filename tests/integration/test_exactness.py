"""Greedy tokens (and their log-probs) with ESS on equal those with ESS off.

ESS on: hot buffer of 40 slots per request and layer, contexts ~8x that, so most latents are
read through the host pool and the LRU resolver. ESS off: every latent in SGLang's device pool.
"""

import concurrent.futures as cf

import pytest

from .conftest import HOT_SLOTS

pytestmark = pytest.mark.integration

N_REQUESTS = 6
NEW_TOKENS = 24


def prompts():
    return [("import os\nimport sys\ndef f%d(argv):\n    return argv[%d] + %d\n" % (i, i, i * 7)) * 18
            for i in range(N_REQUESTS)]


def _run_batch(server):
    server.flush_cache()
    with cf.ThreadPoolExecutor(N_REQUESTS) as ex:
        outs = list(ex.map(lambda p: server.generate(p, NEW_TOKENS), prompts()))
    return [[(t[1], t[0]) for t in o["meta_info"]["output_token_logprobs"]] for o in outs], outs


def test_greedy_tokens_equal_with_ess_on_and_off(server_on, server_off):
    before = server_on.ess_usage()["rows_h2d"]
    on, raw_on = _run_batch(server_on)
    fetched = server_on.ess_usage()["rows_h2d"] - before
    assert fetched > 0, "ESS on served the batch without a single host->device fetch: the store was not used"
    off, _ = _run_batch(server_off)
    prompt_tokens = raw_on[0]["meta_info"]["prompt_tokens"]
    assert prompt_tokens >= 5 * HOT_SLOTS, f"context {prompt_tokens} should be several times the hot buffer"
    for i, (a, b) in enumerate(zip(on, off)):
        assert len(a) == NEW_TOKENS
        assert [t for t, _ in a] == [t for t, _ in b], f"request {i}: tokens differ ESS on vs off"
        assert [lp for _, lp in a] == [lp for _, lp in b], f"request {i}: log-probs differ ESS on vs off"
    # the tokens are not a degenerate repetition: attention output reaches the logits
    assert len({t for t, _ in on[0]}) > 4
