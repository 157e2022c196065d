"""Torch versions of the sgl-kernel CPU ops SGLang 0.5.23's EAGLE path calls on CPU.

On CPU, SGLang's speculative helpers (``sglang/kernels/ops/speculative/{cache_locs,eagle}.py``)
call ``sgl_kernel.*_cpu`` ops that exist only in the (unpublished) CPU build of sgl-kernel; the
pure-python stand-in this project installs (launch/cpu_shims) raises for them. Each function
below has the op's signature and the semantics of SGLang's Triton kernel of the same name, in
plain torch, and replaces the name the SGLang module imported (HookRegistry REPLACE; targets.py,
patches/README.md). Used only where SGLang itself picks the CPU branch (``is_cpu()``).

All index tensors are int32/int64 on the CPU; outputs are written in place, as the ops do.
"""

from __future__ import annotations

import torch


def _rows(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, starts: torch.Tensor, width: int):
    """[b, width] req_to_token entries from each row's start (the window may be ragged: callers mask)."""
    cols = starts.to(torch.int64).reshape(-1, 1) + torch.arange(width, dtype=torch.int64)
    return req_to_token[req_pool_indices.to(torch.int64).reshape(-1, 1), cols.clamp(max=req_to_token.shape[1] - 1)]


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len,
                                           topk, num_cols):
    """out_cache_loc[i*topk*num_cols + j] = req_to_token[req_pool_indices[i], seq_lens[i] + j]."""
    width = int(topk) * int(num_cols)
    if seq_lens.numel() == 0:
        return
    out_cache_loc.view(-1, width).copy_(_rows(req_to_token, req_pool_indices, seq_lens, width))


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """Concatenate req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]] over i."""
    starts, ends, rows = start_offset.tolist(), end_offset.tolist(), req_pool_indices.tolist()
    pos = 0
    for r, s, e in zip(rows, starts, ends):
        n = max(0, int(e) - int(s))
        if n:
            out_cache_loc[pos:pos + n] = req_to_token[int(r), int(s):int(e)].to(out_cache_loc.dtype)
        pos += n


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """bonus_tokens[i] = accept_tokens.flat[accept_stride * i + accept_lens[i] - 1]."""
    b = accept_lens.numel()
    idx = int(accept_stride) * torch.arange(b, dtype=torch.int64) + accept_lens.to(torch.int64) - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """The out_cache_loc entries of the accepted (!= -1) indices, packed in order."""
    idx = accept_index.reshape(-1)
    idx = idx[idx != -1].to(torch.int64)
    accept_out_cache_loc[:idx.numel()] = out_cache_loc[idx].to(accept_out_cache_loc.dtype)


def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                    retrieve_index, retrieve_next_token, retrieve_next_sibling, topk, depth,
                                    draft_token_num, tree_mask_mode):
    """The EAGLE draft tree: retrieve index / next-token / next-sibling links, positions and the
    tree mask, exactly as ``spec_tree.sgl_build_tree_kernel_efficient_triton`` (modes FULL_MASK = 0
    and QLEN_ONLY = 1; per request a short Python loop over the n draft tokens)."""
    mode = int(tree_mask_mode)
    if mode not in (0, 1):
        raise NotImplementedError(f"tree_mask_mode={mode}: the CPU tree builder supports FULL_MASK and QLEN_ONLY")
    n, topk, depth = int(draft_token_num), int(topk), int(depth)
    lens = [int(x) for x in verified_seq_len.tolist()]
    sel = selected_index.tolist()
    par = parent_list.reshape(len(lens), -1).tolist()
    ri, rnt, rns = retrieve_index.tolist(), retrieve_next_token.tolist(), retrieve_next_sibling.tolist()
    pos = positions.tolist()
    mask_on, mask_off = [], []
    prefix = 0
    for b, seq_len in enumerate(lens):
        seq_tree_idx = n * n * b + prefix * n
        prefix += seq_len
        pos[b * n] = seq_len

        def parent_slot(i):                # position in `sel` of token i's parent, 0 = the root
            p_tb = sel[b][i] // topk
            if p_tb == 0:
                return -1
            tok = par[b][p_tb]
            for pp in range(n - 1):
                if sel[b][pp] == tok:
                    return pp
            return None

        for i in range(n - 1, 0, -1):
            ri[b][i] = b * n + i
            p = parent_slot(i - 1)
            if p is not None:
                pp = p + 1
                nxt = rnt[b][pp]
                rnt[b][pp] = i
                if nxt != -1:
                    rns[b][i] = nxt
        ri[b][0] = b * n
        for x in range(n):
            t = (seq_tree_idx + (seq_len + n) * x + seq_len + 1) if mode == 0 else (n * n * b + n * x + 1)
            mask_on.append(t - 1)
            mask_off.extend(t + i for i in range(n - 1))
            if x > 0:
                cur, position = x - 1, 0
                for _ in range(depth):
                    position += 1
                    mask_on.append(t + cur)
                    p = parent_slot(cur)
                    if p is None or p == -1:
                        break
                    cur = p
                pos[b * n + x] = position + seq_len
    tree_mask.view(-1)[torch.tensor(mask_off, dtype=torch.int64)] = False
    tree_mask.view(-1)[torch.tensor(mask_on, dtype=torch.int64)] = True
    positions.copy_(torch.tensor(pos, dtype=positions.dtype))
    retrieve_index.copy_(torch.tensor(ri, dtype=retrieve_index.dtype))
    retrieve_next_token.copy_(torch.tensor(rnt, dtype=retrieve_next_token.dtype))
    retrieve_next_sibling.copy_(torch.tensor(rns, dtype=retrieve_next_sibling.dtype))


def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict):
    """Greedy EAGLE verification: walk the draft tree, accepting each draft token equal to the
    target's prediction, as ``spec_tree.verify_tree_greedy_kernel_triton``."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    cand, ri = candidates.tolist(), retrive_index.tolist()
    rnt, rns = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    tgt = target_predict.reshape(-1).tolist()
    pred = predicts.view(-1)
    acc = accept_index.tolist()
    nums = []
    for b in range(bs):
        last = ri[b][0]
        acc[b][0] = last
        num, cur = 0, 0
        for _ in range(1, steps):
            cur = rnt[b][cur]
            target = tgt[last]
            matched = False
            while cur != -1:
                if cand[b][cur] == target:
                    pred[last] = target
                    num += 1
                    acc[b][num] = ri[b][cur]
                    last = ri[b][cur]
                    matched = True
                    break
                cur = rns[b][cur]
            if not matched:
                break
        nums.append(num)
        pred[last] = tgt[last]
    accept_index.copy_(torch.tensor(acc, dtype=accept_index.dtype))
    accept_token_num.copy_(torch.tensor(nums, dtype=accept_token_num.dtype))


# targets.SPEC_CPU_OPS entry -> its replacement
REPLACEMENTS = {
    "assign_draft_cache_locs_contiguous_cpu": assign_draft_cache_locs_contiguous_cpu,
    "assign_extend_cache_locs_cpu": assign_extend_cache_locs_cpu,
    "fill_bonus_tokens_cpu": fill_bonus_tokens_cpu,
    "fill_accept_out_cache_loc_cpu": fill_accept_out_cache_loc_cpu,
    "sgl_build_tree_kernel_efficient_cpu": build_tree_kernel_efficient_cpu,
    "sgl_verify_tree_greedy_cpu": verify_tree_greedy_cpu,
}


def register() -> None:
    """Only where SGLang's CPU branch is the one that runs: ``is_cpu()``, SGLang's own switch, which its
    modules read when imported and which defines the ``*_cpu`` names only then. The launcher process
    imports SGLang before it sets SGLANG_USE_CPU_ENGINE for its children, so there the names do not
    exist (and nothing runs a model); registering them there logged "Failed to apply hooks" six times."""
    from sglang.srt.utils import is_cpu

    if torch.cuda.is_available() or not is_cpu():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from ..targets import SPEC_CPU_OPS

    for target in SPEC_CPU_OPS:
        HookRegistry.register(target, REPLACEMENTS[target.rsplit(".", 1)[1]], HookType.REPLACE)
