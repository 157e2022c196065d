"""Where each forward mode's query tokens sit (EAGLE / NextN MTP included), and the roles an ess
backend instance plays in a speculative server. Read by the backends, the store forward, the
padding finder and the indexer; nothing here builds a backend (eagle.py does), so the
backends import this without an arrow back up to the factory.

SGLang 0.5.23's EAGLE v2 worker runs, per decode iteration (SGLANG_SEAMS.md §D):
  draft decode   DECODE on the draft runner, ``num_steps - 1`` forwards through the multi-step
                 container's per-step child backends (``attn_backends[i]``, each entered with
                 ``forward_context``); ``seq_lens`` = the committed length L for every step, the
                 step writes its speculative row at position L + i, and attention reads
                 positions < L (as SGLang's DSA backend does);
  verify         TARGET_VERIFY on the target runner: ``n = num_draft_tokens`` query tokens per
                 request at positions L .. L+n-1, ``seq_lens`` = L (committed), rows of the whole
                 window written before attention, one causal top-k row per query token;
  draft extend   DRAFT_EXTEND_V2 on the draft runner: the same window, ``seq_lens`` = L + n.
After verify the committed length becomes L + accept_len; rows at the rejected positions stay in
the pools until the next window overwrites them (before anything reads them).
"""

from __future__ import annotations

from dataclasses import dataclass

# Roles an ess backend instance plays in a speculative server (set by the factory below).
ROLE_TARGET = "target"            # the target runner's backend (extend, decode, verify)
ROLE_DRAFT_EXTEND = "draft_extend"  # draft runner: prefill extend and DRAFT_EXTEND_V2
ROLE_DRAFT_DECODE = "draft_decode"  # draft runner: one step of the multi-step draft


def accepts_early_plans(backend) -> bool:
    """Whether the indexer may hand a decode batch's top-k to the store early (reserve each
    request's newest row, submit the misses' fetch) for this backend instance. Not in an EAGLE
    draft step: its newest row is speculative, and the step (``decode_committed``) reads committed
    rows only - a reserved slot would stay empty while the LRU counts it resident. Both indexer
    hooks ask this (CPU: indexer_torch.py; CUDA: cuda_backend.py), for both backends."""
    return getattr(backend, "spec_role", ROLE_TARGET) != ROLE_DRAFT_DECODE


@dataclass(frozen=True)
class QueryLayout:
    """Where a forward's query tokens sit, per request (host lists, one entry per request).

    kv_lens:    tokens a query may see at most (causal bound of its last query token + 1)
    n_q:        query tokens of the request in this forward
    committed:  leading positions whose rows are final (accepted / prefilled): rows at
                positions >= committed are this forward's own (speculative or just written)
    """

    kv_lens: list[int]
    n_q: list[int]
    committed: list[int]

    def first_query_pos(self) -> list[int]:
        return [kv - n for kv, n in zip(self.kv_lens, self.n_q)]


def num_draft_tokens(forward_batch) -> int:
    spec = getattr(forward_batch, "spec_info", None)
    n = getattr(spec, "draft_token_num", None)
    if n is None:
        from sglang.srt.runtime_context import get_spec

        n = get_spec().speculative_num_draft_tokens
    return int(n)


def _extend_lens(forward_batch) -> list[int]:
    ext = forward_batch.extend_seq_lens_cpu
    if ext is None:
        ext = forward_batch.extend_seq_lens.tolist()
    return [int(x) for x in ext]


def query_layout(forward_batch) -> QueryLayout:
    """QueryLayout of a forward batch in any mode the ess backend serves (host sync: seq_lens)."""
    seq_lens = forward_batch.seq_lens_cpu
    if seq_lens is None:
        seq_lens = forward_batch.seq_lens.cpu()
    s = [int(x) for x in seq_lens.tolist()]
    mode = forward_batch.forward_mode
    if mode.is_decode_or_idle():
        return QueryLayout(s, [1] * len(s), s)
    if mode.is_target_verify():
        n = num_draft_tokens(forward_batch)
        return QueryLayout([x + n for x in s], [n] * len(s), s)
    ext = _extend_lens(forward_batch)
    if mode.is_draft_extend_v2():
        return QueryLayout(s, ext, [x - n for x, n in zip(s, ext)])
    return QueryLayout(s, ext, [x - n for x, n in zip(s, ext)])
