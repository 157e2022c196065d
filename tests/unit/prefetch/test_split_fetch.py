"""Issue 17's option --ess-tp-split-fetch: two real processes (a gloo group over a file rendezvous), each a
TP rank running the same decode trace through its own store whose engine (inline; the CUDA stream engine
as a GPU fake; the ZMQ prefetch worker, a third process per store) is wrapped in SplitFetch. Each
rank fetches the plan entries of its parity from host memory and the group all-gathers them; attention at
every step of every layer equals the all-resident dense reference (the overlap-level test's own check),
and the two ranks' host reads add up to the rows one rank reads without the split."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sgl_ess.prefetch.split_fetch import SplitFetch, torch_all_gather

CASES = [("none", "inline"), ("da", "inline"), ("dba", "inline"), ("da", "stream_gpu_fake"), ("da", "worker")]


def _rank_main(rank: int, size: int, init: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    torch.set_num_threads(1)
    from tests.unit.store.test_overlap_levels import _run

    results = {}
    for mode, engine in CASES:
        split = []

        def wrap(e):
            split.append(SplitFetch(e, rank, size, torch_all_gather()))
            return split[-1]
        snap, _, _ = _run(mode, ring_slots=48, engine=engine, wrap_engine=wrap)    # asserts every step's output
        whole, _, _ = _run(mode, ring_slots=48, engine=engine)
        stats = split[0].stats()["split_fetch"]
        results[f"{mode}:{engine}"] = {
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


@pytest.mark.parametrize("case", [f"{m}:{e}" for m, e in CASES])
def test_each_rank_reads_its_share_of_the_misses_and_attends_exactly(ranks, case):
    a, b = ranks[0][case], ranks[1][case]
    assert a["misses"] == a["whole_misses"] == b["misses"] > 0          # the same plans with and without
    assert a["exchanges"] == b["exchanges"] > 0
    assert a["refetched"] == b["refetched"] == 0      # received rows carry the plan's ring tag: none re-read
    whole = a["whole_rows"]
    assert a["split_rows"] + b["split_rows"] == whole                   # the host rows, read once over the group
    assert 0 < a["split_rows"] < whole and 0 < b["split_rows"] < whole
    if a["rows_own"] is not None:                                       # host engines count the exchange
        assert a["rows_own"] == a["split_rows"] and a["rows_received"] == b["split_rows"]


def test_split_fetch_refuses_a_group_of_one():
    with pytest.raises(ValueError, match="size >= 2"):
        SplitFetch(object.__new__(SplitFetch), 0, 1, lambda t: t)
