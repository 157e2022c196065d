"""One entry point for the benchmarks: python -m bench SUITE [suite flags]

suites:
  store      resolver cost (list-based torch, sort-based torch, oracle), warmup misses, device-path ops per layer-step (bench/store_bench.py)
  kernels    Triton resolver and sparse-MLA decode vs their torch paths (CUDA timings) (bench/kernels_bench.py)
  prefetch   exposed fetch time per overlap level and engine (CPU; --device cuda)     (bench/prefetch_bench.py)
             --predictors a,b,..: speculative predictors on top-k traces vs exact LRU (bench/predictor_bench.py)
  trace      record a top-k trace from the embedded server, or --synthetic             (bench/trace_suite.py)
  serving    SGLang bench_serving against the real server, ESS off vs on              (bench/serving_suite.py)
  pd         PD (prefill + ESS decode behind the router) vs colocated, bench_serving (bench/pd_suite.py)
  slo        decode throughput vs a TPOT target (--ess-slo-tpot-ms), one run per target (bench/slo_suite.py)
  ops        operator profile of the model for the simulator (CPU; --device cuda)     (bench/ops_bench.py)
  tp_split   TP ranks each reading 1/tp of the misses + an all-gather vs each reading all (bench/tp_split_bench.py)
  sim        simulator validation report                                              (bench/sim_report.py)
  flashtrans FlashTrans GB/s on 656-byte rows vs a bulk pinned copy (CUDA)            (bench/flashtrans_bench.py)
  flashmla   FlashMLA sparse FP8 decode over the slot space vs the reference (CUDA)   (bench/flashmla_check.py)
  host       host time per decode layer-step, ESS CUDA class vs SGLang's DSA backend (GPU fake) (bench/host_bench.py)
Results go to bench/results/*.json with the command, commit, dirty flag and versions.
"""
import importlib
import sys

SUITES = {"store": "bench.store_bench", "sim": "bench.sim_report", "serving": "bench.serving_suite",
          "prefetch": "bench.prefetch_bench", "ops": "bench.ops_bench", "kernels": "bench.kernels_bench",
          "flashtrans": "bench.flashtrans_bench", "flashmla": "bench.flashmla_check",
          "trace": "bench.trace_suite", "slo": "bench.slo_suite",
          "pd": "bench.pd_suite", "tp_split": "bench.tp_split_bench", "host": "bench.host_bench"}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help") or sys.argv[1] not in SUITES:
        print(__doc__)
        return 0 if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help") else 2
    suite = sys.argv.pop(1)
    return importlib.import_module(SUITES[suite]).main()


if __name__ == "__main__":
    raise SystemExit(main())
