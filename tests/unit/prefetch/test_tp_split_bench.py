"""`python -m bench tp_split` at tiny shapes (two real processes, gloo): it runs, both stores see the same
misses, and the split's host reads over the group add up to what one rank reads without it. Timings are
reported by the bench, never asserted."""
import json
import pathlib
import tempfile


def test_the_tp_split_bench_runs_and_counts_rows(monkeypatch):
    from bench import tp_split_bench
    from bench.meta import RESULTS_ENV

    with tempfile.TemporaryDirectory() as d:
        monkeypatch.setenv(RESULTS_ENV, d)
        rc = tp_split_bench.main(["--batch", "4", "--k", "32", "--context", "512", "--layers", "2", "--steps", "2"])
        assert rc == 0
        res = json.loads((pathlib.Path(d) / "tp_split.json").read_text())
    rows = res["host_rows_read_per_rank"]
    assert res["same_misses"] and len(set(rows["whole"])) == 1
    assert sum(rows["split"]) == rows["whole"][0] > 0
    assert res["meta"]["command"] and len(res["split_over_whole_time"]) == 2
