"""With ESS on, a second request sharing a long prefix reuses it (SGLang reports cached
tokens; SGLang's own HiSparse needs --disable-radix-cache) and its output is unchanged.

"Unchanged" is checked against ESS off running the same two requests (SGLang's own layout
with its radix cache): tokens and log-probs must be bit-identical. Against a cold (uncached)
run only the first token is compared bit-for-bit: SGLang's CPU path itself (torch_native
MLA on DeepSeek-V3, no sgl-ess involved) gives slightly different numbers when a prompt's
tail is computed as a short extend after a cached prefix instead of inside one long prefill.
"""

import pytest

pytestmark = pytest.mark.integration

PREFIX = "from collections import OrderedDict\n\ndef lru(n):\n    cache = OrderedDict()\n" * 20
SECOND = PREFIX + "print(lru(3))\n"


def _prefix_then_second(server):
    server.flush_cache()
    cold = server.generate(SECOND, 16)
    server.flush_cache()
    server.generate(PREFIX + "x = 1\n", 4)
    warm = server.generate(SECOND, 16)
    return cold, warm


def test_shared_prefix_is_reused_and_output_unchanged(server_on, server_off):
    cold_on, warm_on = _prefix_then_second(server_on)
    _, warm_off = _prefix_then_second(server_off)
    assert cold_on["meta_info"]["cached_tokens"] == 0
    cached = warm_on["meta_info"]["cached_tokens"]
    prompt = cold_on["meta_info"]["prompt_tokens"]
    assert cached >= prompt - 64, f"expected the {prompt}-token prompt cached up to its last page, got {cached}"
    assert warm_on["meta_info"]["output_token_logprobs"] == warm_off["meta_info"]["output_token_logprobs"]
    assert warm_on["meta_info"]["output_token_logprobs"][0] == cold_on["meta_info"]["output_token_logprobs"][0]
