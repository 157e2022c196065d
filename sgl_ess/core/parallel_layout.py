"""How many ESS host pools one node holds for an SGLang parallel layout, and how big each is (issue 17).

One rule, used by the launcher (integration/sglang/launcher_defaults.py: the startup report and the
host-memory check) and by the capacity planner (``python -m sgl_ess.sim plan``). Pure Python, no
torch: it only counts. No memory is owned here.

  ranks        SGLang's scheduler processes: tp x pp, times dp unless DP attention partitions the TP
               ranks into dp attention groups of tp / dp ranks; spread evenly over nnodes.
  pools        MLA's latent row (and the indexer key) is the same on every rank of an attention-TP
               group, so the group's ranks on one node can share ONE host pool
               (integration/sglang/shared_host_pool.py, on CPU). Per rank (what CUDA does today, and
               what sharing off means) every rank keeps its own copy.
  bytes        SGLang adds one padding page to its token pool, so a pool of ``tokens`` holds
               (tokens + page) rows per layer of ``row_bytes`` each.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelLayout:
    """SGLang's --tp, --dp, --pp, --nnodes and --enable-dp-attention."""
    tp: int = 1
    dp: int = 1
    pp: int = 1
    nnodes: int = 1
    dp_attention: bool = False

    def problems(self) -> list[str]:
        """What makes this layout impossible, each naming the flag that fixes it (empty: fine)."""
        out = [f"--{k.replace('_', '-')} {v}: expected an integer >= 1" for k, v in
               (("tp", self.tp), ("dp", self.dp), ("pp", self.pp), ("nnodes", self.nnodes)) if v < 1]
        if out:
            return out
        if self.dp_attention and self.tp % self.dp:
            out.append(f"--enable-dp-attention with --dp {self.dp} and --tp {self.tp}: the DP attention groups "
                       f"partition the TP ranks, so --tp must be a multiple of --dp")
        if self.world_ranks % self.nnodes:
            out.append(f"--nnodes {self.nnodes} with {self.world_ranks} ranks: every node runs the same number "
                       f"of ranks, so the ranks must be a multiple of --nnodes")
        return out

    @property
    def world_ranks(self) -> int:
        return self.tp * self.pp * (1 if self.dp_attention else self.dp)

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.world_ranks // max(1, self.nnodes))

    @property
    def attention_tp(self) -> int:
        """Ranks of one attention-TP group (they hold the same latent rows)."""
        return self.tp // self.dp if self.dp_attention else self.tp

    def pools_per_node(self, shared: bool) -> int:
        """Host pools one node allocates: one per attention-TP group on the node when `shared`,
        otherwise one per rank."""
        ranks = self.ranks_per_node
        if not shared:
            return ranks
        tp_per_node = max(1, self.tp // max(1, self.nnodes))
        members = max(1, min(self.attention_tp, tp_per_node))
        return max(1, ranks // members)


def host_pool_bytes(tokens: int, page_size: int, layers: int, row_bytes: int) -> int:
    """Bytes of one host pool of `tokens` tokens: (tokens + one padding page) x layers x row_bytes."""
    return (tokens + page_size) * layers * row_bytes
