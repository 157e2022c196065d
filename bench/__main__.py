"""One entry point for the benchmarks: python -m bench SUITE [suite flags]

suites:
  store    resolver cost (vectorised vs oracle) and LRU warmup misses   (bench/store_bench.py)
  sim      simulator calibration and prediction table                   (bench/sim_report.py)
  serving  SGLang bench_serving against the server, ESS off vs on       (bench/serving_suite.py)
  prefetch exposed fetch time per overlap level and engine              (bench/prefetch_bench.py)
Results go to bench/results/SUITE.json with the command, commit and versions.
"""
import importlib
import sys

SUITES = {"store": "bench.store_bench", "sim": "bench.sim_report", "serving": "bench.serving_suite",
          "prefetch": "bench.prefetch_bench"}
SUITES["ops"] = "bench.ops_bench"   # operator profile for the simulator (bench/ops_bench.py)
SUITES["kernels"] = "bench.kernels_bench"   # resolver + sparse decode kernels (bench/kernels_bench.py)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help") or sys.argv[1] not in SUITES:
        print(__doc__)
        return 0 if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help") else 2
    suite = sys.argv.pop(1)
    return importlib.import_module(SUITES[suite]).main()


if __name__ == "__main__":
    raise SystemExit(main())
