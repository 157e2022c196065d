"""DeepSeek-V4 served on this CPU with ESS off (issue 37 item 1): ``python -m sgl_ess.launch_server`` with the
tiny V4 (sgl_ess/models/tiny_dsv4, the launcher's deterministic scaled dummy weights) answers greedy
requests, and its first output token's top log-probs equal the log-softmax of one in-process prefill of the
same 300-token prompt through the same model code (dsv4/one_batch_driver.first_token_logits, a separate
process without the server), so the window has slid and the indexer chooses among more C4 entries than its
top-k. Same weights, same one-request batch: the token ids are equal and the log-probs agree
within float32 rounding of a 2048-way log-softmax (1e-4). Then a longer generation runs (the window
slides past 128 tokens and C4 / C128 entries are compressed while decoding), and without the deepseek-recipe
package a chat request is refused with SGLang's install hint."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import urllib.error

import pytest

from .conftest import _start
from ._server import group_alive

pytestmark = pytest.mark.integration
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "sgl_ess", "models", "tiny_dsv4")
# 300 tokens: the first output token attends through a slid window (128 of 300), the indexer's top 32 of
# 75 C4 entries and 2 C128 entries
PROMPT = [(7 * i * i + 13 * i + 5) % 2000 + 2 for i in range(300)]
SIZE = ["--max-total-tokens", "4096", "--swa-full-tokens-ratio", "0.5"]


def _reference_logprobs():
    torch = pytest.importorskip("torch")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.pt")
        run = subprocess.run([sys.executable, "-m", "sgl_ess.integration.sglang.dsv4.one_batch_driver",
                              "--first-token-logits", ",".join(map(str, PROMPT)), out, *SIZE],
                             cwd=REPO, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "SGLESS_DUMMY_INIT": "scaled"})
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
        return torch.log_softmax(torch.load(out).float(), -1)


def test_tiny_v4_served_on_cpu_equals_in_process_prefill():
    ref = _reference_logprobs()
    srv = _start("dsv4_cpu", ["--model-path", MODEL, "--load-format", "dummy", "--ess-enabled", "false",
                              "--max-running-requests", "2", *SIZE], env={"SGLESS_DUMMY_INIT": "scaled"})
    try:
        out = srv.post("/generate", {"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": 5,
                                     "sampling_params": {"temperature": 0, "max_new_tokens": 4}})
        top = out["meta_info"]["output_top_logprobs"][0]
        want = ref.topk(5)
        assert [t[1] for t in top] == want.indices.tolist(), (top, want)
        for (lp, tok, _), w in zip(top, want.values.tolist()):
            assert abs(lp - w) < 1e-4, (tok, lp, w)
        assert out["meta_info"]["output_token_logprobs"][0][1] == int(ref.argmax())
        long = srv.post("/generate", {"input_ids": PROMPT, "sampling_params": {"temperature": 0,
                                                                                "max_new_tokens": 160, "ignore_eos": True}})
        assert long["meta_info"]["completion_tokens"] == 160
        if importlib.util.find_spec("deepseek_recipe") is None:
            # V4 chat needs DeepSeek's encoder: refused with SGLang's install hint (dsv4/chat_encoding.py)
            with pytest.raises(urllib.error.HTTPError) as err:
                srv.post("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 2})
            assert "deepseek-recipe" in err.value.read().decode(errors="replace")
    finally:
        srv.stop()
    assert not group_alive(srv.pgid)
