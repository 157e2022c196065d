"""How many ESS host pools one node holds for an SGLang parallel layout, and how big each is (issue 17).

One rule, used by the launcher (integration/sglang/launcher/launcher_defaults.py: the startup report and the
host-memory check) and by the capacity planner (``python -m sgl_ess.sim plan``). Pure Python, no
torch: it only counts. No memory is owned here.

  ranks        SGLang's scheduler processes: tp x pp, times dp unless DP attention partitions the TP
               ranks into dp attention groups of tp / dp ranks; spread evenly over nnodes.
  pools        MLA's latent row (and the indexer key) is the same on every rank of an attention-TP
               group, so the group's ranks on one node can share ONE host pool
               (integration/sglang/pools/shared_host_pool.py; ``shares_host_pool``: on CPU by default,
               on CUDA with --ess-share-host-pool on). Per rank (sharing off, and CUDA's default)
               every rank keeps its own copy.
  bytes        SGLang adds one padding page to its token pool, so a pool of ``tokens`` holds
               (tokens + page) rows per layer of ``row_bytes`` each.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelLayout:
    """SGLang's --tp, --dp, --pp, --nnodes and --enable-dp-attention (build it with ``from_sglang``:
    SGLang 0.5.23's newer spelling ``--attn-dp-size N`` is ``--dp N --enable-dp-attention``)."""
    tp: int = 1
    dp: int = 1
    pp: int = 1
    nnodes: int = 1
    dp_attention: bool = False

    @classmethod
    def from_sglang(cls, tp: int = 1, dp: int = 1, pp: int = 1, nnodes: int = 1, dp_attention: bool = False,
                    attn_dp_size: int = 1) -> tuple["ParallelLayout", list[str]]:
        """The layout SGLang 0.5.23 resolves from its flags, and what it refuses, each naming a flag.

        ``--attn-dp-size N`` (N > 1) is DP attention over N groups of tp / N ranks, with one replica:
        ``--dp N --enable-dp-attention`` in the deprecated spelling (SGLang turns that into
        ``--attn-dp-size N``). ``--attn-dp-size`` beside ``--dp`` > 1 is refused by SGLang (replicas
        with attention DP are not supported)."""
        problems = []
        if attn_dp_size < 1:
            problems.append(f"--attn-dp-size {attn_dp_size}: expected an integer >= 1")
        elif attn_dp_size > 1:
            if dp > 1:
                problems.append(f"--dp {dp} with --attn-dp-size {attn_dp_size}: SGLang does not combine data-parallel "
                                f"replicas with attention DP; use --attn-dp-size alone (--tp {tp} "
                                f"--attn-dp-size {attn_dp_size})")
            dp, dp_attention = attn_dp_size, True
        lay = cls(tp=tp, dp=dp, pp=pp, nnodes=nnodes, dp_attention=dp_attention)
        return lay, problems or lay.problems()

    def problems(self) -> list[str]:
        """What makes this layout impossible, each naming the flag that fixes it (empty: fine)."""
        out = [f"--{k.replace('_', '-')} {v}: expected an integer >= 1" for k, v in
               (("tp", self.tp), ("dp", self.dp), ("pp", self.pp), ("nnodes", self.nnodes)) if v < 1]
        if out:
            return out
        if self.dp_attention and self.tp % self.dp:
            out.append(f"DP attention over {self.dp} groups (--dp {self.dp} --enable-dp-attention, or --attn-dp-size "
                       f"{self.dp}) with --tp {self.tp}: the DP attention groups partition the TP ranks, so --tp must "
                       f"be a multiple of --dp / --attn-dp-size (e.g. --tp {self.dp})")
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


def shares_host_pool(mode: str, on_cuda: bool) -> bool:
    """Do the ranks of an attention-TP group on one node share one host pool (--ess-share-host-pool)?
    on: yes; off: no; auto: on CPU yes, on CUDA no (its ordering has not run on a GPU yet)."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"--ess-share-host-pool {mode!r}: expected auto, on or off")
    return mode == "on" or (mode == "auto" and not on_cuda)


def host_pool_bytes(tokens: int, page_size: int, layers: int, row_bytes: int) -> int:
    """Bytes of one host pool of `tokens` tokens: (tokens + one padding page) x layers x row_bytes."""
    return (tokens + page_size) * layers * row_bytes
