"""In-process stand-ins for what the ``ess`` backend reads from SGLang's model runner, to drive
the real backend / adapter / store code with chosen batches (no server, no model).

What is real: ``EssSparseAttnBackend``, ``EssPoolAdapter`` and ``LatentStore`` (built through
``backend_registration.create_ess_backend`` and the per-runner registry in ``lifecycle.py``),
the ESS host pool, SGLang's ``ForwardMode``, ``forward_context`` and ``TboAttnBackend``, and the
indexer's hand-off (``indexer_torch._EarlyHandoff``). What is a stand-in: the runner, its pools
(SimpleNamespace with the attributes the backend reads; SGLang's own pool classes need a
published parallel config) and the forward batches (the fields the backend reads).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sgl_ess.store import HostLatentPool

HEADS, KV_LORA, ROPE, TOPK, PAGE = 2, 32, 16, 8, 64
KV_DIM = KV_LORA + ROPE
DTYPE = torch.bfloat16


def shared_pools(max_requests: int = 8, max_context: int = 1024, pool_tokens: int = 4096):
    """The request -> token map and allocator EAGLE's target and draft runners share."""
    req_pool = SimpleNamespace(req_to_token=torch.zeros((max_requests, max_context), dtype=torch.int32))
    allocator = SimpleNamespace(size=pool_tokens, page_size=PAGE, available_size=lambda: pool_tokens)
    return req_pool, allocator


def fake_runner(req_pool, allocator, layers: int, pool_tokens: int = 4096):
    host = HostLatentPool(layers, pool_tokens + PAGE, KV_DIM * DTYPE.itemsize, pin=False)
    views = [host.rows[layer].view(DTYPE).view(pool_tokens + PAGE, 1, KV_DIM) for layer in range(layers)]
    pool = SimpleNamespace(ess_host_pool=host, kv_cache_dim=KV_DIM, store_dtype=DTYPE, layer_num=layers,
                           kv_buffer=views, get_key_buffer=lambda i: views[i], device="cpu")
    mc = SimpleNamespace(kv_lora_rank=KV_LORA, qk_rope_head_dim=ROPE, hf_config=SimpleNamespace(index_topk=TOPK))
    return SimpleNamespace(device="cpu", req_to_token_pool=req_pool, token_to_kv_pool=pool,
                           token_to_kv_pool_allocator=allocator, model_config=mc)


def layer(i: int):
    return SimpleNamespace(layer_id=i, tp_q_head_num=HEADS, scaling=KV_DIM ** -0.5)


def forward_batch(mode: str, reqs, seq_lens, out_cache_loc, extend_lens=None, draft_tokens=None, tbo_range=None):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    seq = torch.tensor(seq_lens, dtype=torch.int64)
    return SimpleNamespace(
        forward_mode=getattr(ForwardMode, mode), req_pool_indices=torch.tensor(reqs, dtype=torch.int64),
        seq_lens=seq, seq_lens_cpu=seq, out_cache_loc=torch.as_tensor(out_cache_loc, dtype=torch.int64),
        extend_seq_lens_cpu=extend_lens, extend_seq_lens=None if extend_lens is None else torch.tensor(extend_lens),
        spec_info=SimpleNamespace(draft_token_num=draft_tokens), batch_size=len(reqs),
        tbo_parent_token_range=tbo_range, tbo_children=None, moe_num_token_non_padded=None)


def place_requests(req_pool, rows: list[int], lengths: list[int], first_loc: int = PAGE) -> None:
    """Give request row r host locations for `lengths` positions (distinct across requests)."""
    loc = first_loc
    for r, n in zip(rows, lengths):
        req_pool.req_to_token[r, :n] = torch.arange(loc, loc + n, dtype=torch.int32)
        loc += n


def write_rows(runner, layer_id: int, locs: torch.Tensor, gen: torch.Generator) -> None:
    """Random latent rows at `locs` of one layer (what SGLang's set_kv_buffer would store)."""
    view = runner.token_to_kv_pool.kv_buffer[layer_id]
    view[locs.long(), 0] = torch.randn(locs.numel(), KV_DIM, generator=gen).to(DTYPE)


def causal_topk(gen: torch.Generator, query_pos: list[int], k: int = TOPK) -> torch.Tensor:
    """int32 [len(query_pos), k]: k distinct positions <= each query position (-1 padded)."""
    out = torch.full((len(query_pos), k), -1, dtype=torch.int32)
    for i, p in enumerate(query_pos):
        sel = torch.randperm(p + 1, generator=gen)[:k]
        out[i, :sel.numel()] = sel.to(torch.int32)
    return out


def query(gen: torch.Generator, tokens: int) -> torch.Tensor:
    return torch.randn(tokens, HEADS * KV_DIM, generator=gen).to(DTYPE)
