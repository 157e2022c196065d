"""Issue 17's option --ess-tp-split-fetch: two real processes (a gloo group over a file rendezvous), each a
TP rank running the same decode trace through its own store whose engine (inline; the CUDA stream engine
as a GPU fake; the ZMQ prefetch worker, a third process per store) is wrapped in SplitFetch. Each
rank fetches the plan entries of its parity from host memory and the group all-gathers them; attention at
every step of every layer equals the all-resident dense reference (the overlap-level test's own check),
and the two ranks' host reads add up to the rows one rank reads without the split. Issue 32: on host engines
only the misses cross the collective (counted in bytes; their plans hold only misses already); on a device
engine the exchange is capped - by the store's miss budget (its ring group's rows, set when the store installs
the engine: no host sync), or by cap_rows - so it carries fewer rows than the plan's b * k entries and stays
exact, the misses past the cap read by every rank."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sgl_ess.prefetch.split_fetch import SplitFetch, torch_all_gather
from tests.unit.store.test_overlap_levels import LAY

CASES = [("none", "inline", None), ("da", "inline", None), ("dba", "inline", None), ("da", "stream_gpu_fake", None),
         ("da", "worker", None), ("da", "stream_gpu_fake", 3)]


RING = 48                   # ring rows per group (StoreConfig.ring_slots): a device engine's exchange budget


def _name(mode, engine, cap):
    return f"{mode}:{engine}" + (f":cap{cap}" if cap else "")


def _rank_main(rank: int, size: int, init: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    torch.set_num_threads(1)
    from tests.unit.store.test_overlap_levels import _run

    results = {}
    for mode, engine, cap in CASES:
        split, entries = [], [0]

        def wrap(e):
            sf = SplitFetch(e, rank, size, torch_all_gather(), cap_rows=cap)
            submit = sf.submit

            def counting(plan):                 # the plan entries the exchange carried before issue 32
                if plan.kind == "h2s" and plan.tier == "immediate":
                    entries[0] += plan.dst_idx.numel()
                return submit(plan)
            sf.submit = counting
            split.append(sf)
            return sf
        snap, _, _ = _run(mode, ring_slots=RING, engine=engine, wrap_engine=wrap)    # asserts every step's output
        whole, _, _ = _run(mode, ring_slots=RING, engine=engine)
        stats = split[0].stats()["split_fetch"]
        results[_name(mode, engine, cap)] = {"entries": entries[0], "cap": cap,
            "rows_exchanged": stats["rows_exchanged"], "bytes_exchanged": stats["bytes_exchanged"],
            "split_rows": snap["prefetch"]["tiers"]["immediate"]["rows"],
            "whole_rows": whole["prefetch"]["tiers"]["immediate"]["rows"],
            "misses": sum(snap["layer_misses"]), "whole_misses": sum(whole["layer_misses"]),
            "refetched": sum(snap["refetch_rows"]),
            "exchanges": stats["exchanges"], "rows_own": stats["rows_own"], "rows_received": stats["rows_received"]}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks():
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_rank_main, args=(2, f"file://{d}/rendezvous", d), nprocs=2, join=True)
        return [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(2)]


@pytest.mark.parametrize("case", [_name(*c) for c in CASES])
def test_each_rank_reads_its_share_of_the_misses_and_attends_exactly(ranks, case):
    a, b = ranks[0][case], ranks[1][case]
    assert a["misses"] == a["whole_misses"] == b["misses"] > 0          # the same plans with and without
    assert a["exchanges"] == b["exchanges"] > 0
    assert a["refetched"] == b["refetched"] == 0      # received rows carry the plan's ring tag: none re-read
    whole = a["whole_rows"]
    assert 0 < a["split_rows"] < whole and 0 < b["split_rows"] < whole
    assert a["bytes_exchanged"] == b["bytes_exchanged"] == a["rows_exchanged"] * LAY.row_bytes
    if a["cap"]:                                      # a capped exchange: misses past it read by both ranks
        assert a["rows_exchanged"] == 2 * a["cap"] * a["exchanges"] < a["entries"]
        assert a["split_rows"] + b["split_rows"] > whole
        return
    if a["rows_own"] is None:        # a device engine: the store's miss budget (its ring group, RING rows)
        assert a["rows_exchanged"] == 2 * -(-RING // 2) * a["exchanges"] < a["entries"]     # not b * k
        assert a["split_rows"] + b["split_rows"] >= whole      # misses past it read by both ranks: none lost
        return
    assert a["split_rows"] + b["split_rows"] == whole                   # the host rows, read once over the group
    assert a["rows_own"] == a["split_rows"] and a["rows_received"] == b["split_rows"]   # host engines count it
    # issue 32: only the misses cross the collective (each rank's buffer rounded up to a whole row)
    assert whole <= a["rows_exchanged"] <= whole + 2 * a["exchanges"]


def test_split_fetch_refuses_a_group_of_one():
    with pytest.raises(ValueError, match="size >= 2"):
        SplitFetch(object.__new__(SplitFetch), 0, 1, lambda t: t)
