"""A text prompt too long for the context, refused before it is tokenized (issue 38, item 4).

Pure Python (no torch, no sglang). SGLang 0.5.23 tokenizes a prompt in full and only then compares
its length with the context: an 8 MB prompt (4.6 M tokens) cost the HTTP process 1.5 GB before the
400. But no token covers more than M characters of the input, for a tokenizer where every input
character ends up in some token; so a text of C characters has at least ceil(C / M) tokens, and
when that already reaches the context the prompt cannot fit, whatever the tokenizer does with it.

M is computed once from the tokenizer's own description (``tokenizer.json`` of a fast tokenizer),
and only where the argument holds: a byte-level BPE model (every byte is a base token, so nothing
becomes "unknown" or is dropped), no normalizer (one could delete or merge characters), no
pre-tokenizer step that removes characters. A regular token's vocabulary string has one character
per byte it stands for, and a byte decodes to at most one input character; an added token covers
its own content. Elsewhere M is None and the prompt is judged after tokenization, as before.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits", "Sequence", "Punctuation"}


def _byte_chars() -> list[str]:
    """GPT-2's byte -> character table, which byte-level BPE vocabularies are written in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def _pre_tokenizers(node: Any) -> list[dict]:
    if not isinstance(node, dict):
        return []
    out = [node]
    for child in node.get("pretokenizers") or []:
        out.extend(_pre_tokenizers(child))
    return out


def max_chars_per_token(tokenizer_json: dict) -> tuple[Optional[int], str]:
    """(M, why): the most input characters one token can cover, or (None, the reason it is unknown)."""
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "BPE":
        return None, f"tokenizer model {model.get('type')!r} is not BPE"
    norm = tokenizer_json.get("normalizer")
    if norm is not None and not (norm.get("type") == "Sequence" and not norm.get("normalizers")):
        return None, f"the tokenizer has a normalizer ({norm.get('type')!r})"
    pres = _pre_tokenizers(tokenizer_json.get("pre_tokenizer"))
    if not any(p.get("type") == "ByteLevel" for p in pres):
        return None, "the tokenizer is not byte-level"
    for p in pres:
        if p.get("type") not in _KEEPING_PRE_TOKENIZERS or p.get("behavior") == "Removed":
            return None, f"pre-tokenizer step {p.get('type')!r} may remove characters"
    vocab = model.get("vocab") or {}
    missing = [c for c in _byte_chars() if c not in vocab]
    if missing:
        return None, f"{len(missing)} of the 256 byte tokens are missing from the vocabulary"
    longest = max((len(k) for k in vocab), default=1)
    added = max((len(a.get("content", "")) for a in tokenizer_json.get("added_tokens") or []), default=0)
    return max(longest, added, 1), "byte-level BPE"


def max_chars_from_tokenizer(tokenizer) -> tuple[Optional[int], str]:
    """The same for a Hugging Face tokenizer object (its fast backend's JSON description)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None, "not a fast (tokenizers) tokenizer"
    try:
        return max_chars_per_token(json.loads(backend.to_str()))
    except (ValueError, TypeError, AttributeError) as e:
        return None, f"the tokenizer's description could not be read ({type(e).__name__})"


def prompt_too_long(chars: int, context_len: Optional[int], max_chars: Optional[int]) -> Optional[str]:
    """Why a text of `chars` characters cannot fit a context of `context_len` tokens, or None."""
    if not context_len or not max_chars:
        return None
    least_tokens = math.ceil(chars / max_chars)
    if least_tokens < context_len:
        return None
    return (f"got {chars} characters, at least {least_tokens} tokens (no token of this model's tokenizer covers "
            f"more than {max_chars} characters); the model's context is {context_len} tokens, so the prompt "
            f"cannot fit")
