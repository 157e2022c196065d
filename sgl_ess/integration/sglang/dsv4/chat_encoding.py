"""DeepSeek-V4 on CPU without the ``deepseek-recipe`` package: /generate serves, chat is refused per request.

SGLang renders V4 chat with DeepSeek's reference encoder (``deepseek-recipe``) and builds that adapter when
the HTTP server starts (serving_chat.py:451 -> chat_encoding_adapters._build_deepseek_recipe), so without
the package the whole server fails to start. Without CUDA (what dsv4.register covers) and without the
package, the V4 adapter becomes one whose ``encode_messages`` raises SGLang's own install hint: a chat
request fails with it, nothing is rendered by another template, and token-level routes (/generate) work.
"""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger(__name__)
V4_SPECS = ("dsv4", "dsv41")


class RecipeMissingAdapter:
    collects_openai_media = False
    strict_tool_call_arguments = False

    @property
    def output(self):
        return None

    def encode_messages(self, **_kwargs):
        from sglang.srt.parser.deepseek_recipe_renderer import DEEPSEEK_RECIPE_INSTALL_HINT

        raise ValueError(DEEPSEEK_RECIPE_INSTALL_HINT + " (chat requests only; /generate with text or input_ids "
                         "serves without it)")


def around_build_chat_encoding_adapter(original_fn, ctx):
    if ctx.chat_encoding_spec in V4_SPECS and importlib.util.find_spec("deepseek_recipe") is None:
        logger.warning("DeepSeek-V4: the deepseek-recipe package is not installed; chat requests will be refused, "
                       "/generate serves")
        return RecipeMissingAdapter()
    return original_fn(ctx)
