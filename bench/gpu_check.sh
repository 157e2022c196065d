#!/usr/bin/env bash
# The prepared GPU check: one script, at most ~10 minutes on one H200, one JSON ($OUT/gpu_check.json)
# plus logs. Run it from the repo root on the GPU machine (the device tool's `run`), e.g.
#   bash bench/gpu_check.sh                      (carry .whl: bash bench/fetch_gpu_wheels.sh here first
#                                                 fetches SGLang 0.5.23 cp312 and what it lacks there,
#                                                 ~54 MiB; --with-flashmla adds FlashMLA if it fits)
# Part 1 needs only torch + Triton (+ pytest, numpy) with the repo on PYTHONPATH - what that machine has:
#   CUDA tests of the store and kernels, FlashTrans GB/s next to a bulk pinned copy, resolver us/layer
#   (b 64, k 2048, N 6400), Triton sparse decode vs the torch reference, FlashMLA's sparse FP8 decode
#   over our slot space (if its wheel loads on this torch), the store's decode-step loop at the paper's
#   shapes with the exposed fetch per overlap level, the operator profile for the simulator.
# Part 2 needs SGLang (the carried .whl) and sgl_kernel (the real one if installed, else this repo's
#   torch stand-ins): the embedded model served on the GPU, ESS off vs on, greedy tokens and log-prob
#   differences, and a short bench_serving at a capped device budget (bench/gpu_serving_check.py).
#   Without the carried wheels it is skipped with one line. Never run on a GPU so far.
# --dry-run (any machine, ~1 minute; CI runs it: tests/integration/test_gpu_check_dry_run.py): every
#   step with --device cpu at tiny shapes, results under $OUT/results (bench/results/ untouched), the
#   CUDA-only benches record that they skipped, part 2 resolves both servers' flags without starting
#   them. It checks that the script and every command it runs still work; it measures nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
# a part that fails this time must not be read from an earlier run's file
rm -f "$OUT"/{versions,kernels,flashtrans,flashmla,prefetch_cuda,ops_h200,serving_gpu,gpu_check,tests_rc}.json
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
step() { echo "[gpu_check] $(date -u +%T) $*"; }
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: bash bench/gpu_check.sh [--dry-run]   (unknown argument: $1)" >&2; exit 2 ;;
esac
if [ "$DRY" = 1 ]; then
  step "dry run: --device cpu, tiny shapes, results in $OUT/results; nothing here is a measurement"
  export SGL_ESS_BENCH_RESULTS="$OUT/results"
  DEV=cpu
  TESTS="tests/gpu"
  KERNELS="--batch 4 --k 64 --slots 128 --context 1024 --steps 4 --heads 16 --decode-reps 2"
  FLASHTRANS="--rows 1024 --host-rows 8192 --repeats 2"
  FLASHMLA="--batch 2 --topk 64 --slots 1024 --repeats 2"
  PREFETCH="--layers 2 --batch 2 --k 64 --context 1024 --slots 128 --heads 4 --index-heads 2 --steps 2"
  OPS="--reps 2"
  SERVING="--dry-run"
else
  DEV=cuda
  TESTS="tests/gpu tests/unit/store tests/unit/attention"
  KERNELS=""
  FLASHTRANS=""
  FLASHMLA=""
  PREFETCH="--layers 61 --batch 64 --k 2048 --context 4096 --slots 2560 --heads 64 --index-heads 64 --steps 3"
  OPS=""
  SERVING=""
fi

if ls .whl/*.whl >/dev/null 2>&1; then
  step "installing carried wheels: $(ls .whl | tr '\n' ' ')"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
python3 - <<'EOF' | tee "$OUT/versions.json"
import json, platform, torch, triton
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
                  "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}))
EOF

step "part 1: CUDA tests (store, stream engine, kernels) + CPU tests of the store and attention on this torch"
# shellcheck disable=SC2086
timeout 300 python3 -m pytest -q -rs -p no:cacheprovider $TESTS \
  --junitxml="$OUT/tests.xml" 2>&1 | tail -40 | tee "$OUT/tests.log"
echo "{\"rc\": ${PIPESTATUS[0]}}" > "$OUT/tests_rc.json"
step "part 1: kernels (resolver us/layer, sparse decode)"
# shellcheck disable=SC2086
timeout 120 python3 -m bench kernels --device $DEV $KERNELS --out "$OUT/kernels.json" 2>&1 | tail -20
step "part 1: FlashTrans GB/s vs bulk pinned copy"
# shellcheck disable=SC2086
timeout 90 python3 -m bench flashtrans --device $DEV $FLASHTRANS --out "$OUT/flashtrans.json" 2>&1 | tail -8
step "part 1: FlashMLA sparse FP8 decode over the slot space"
# shellcheck disable=SC2086
timeout 90 python3 -m bench flashmla $FLASHMLA --out "$OUT/flashmla.json" 2>&1 | tail -12
step "part 1: decode-step loop, 61 layers, 656-B rows, exposed fetch per overlap level"
# shellcheck disable=SC2086
timeout 200 python3 -m bench prefetch --device $DEV $PREFETCH --out "$OUT/prefetch_cuda.json" 2>&1 | tail -10
step "part 1: operator profile for the simulator"
# shellcheck disable=SC2086
timeout 90 python3 -m bench ops --device $DEV $OPS --out "$OUT/ops_h200.json" 2>&1 | tail -5

if [ "$DRY" = 1 ]; then
  step "part 2 (dry run): both servers' flags resolved as on CUDA, nothing started"
  timeout 240 python3 bench/gpu_serving_check.py $SERVING --out "$OUT/serving_gpu.json" 2>&1 | tail -5
else
  # SGLang's CUDA kernels (sgl-kernel, hundreds of MB) cannot travel; its torch stand-ins can
  python3 -c "import sgl_kernel" >/dev/null 2>&1 || { export PYTHONPATH=$PYTHONPATH:$PWD/launch/cpu_shims; \
    step "part 2: sgl_kernel not installed: this repo's torch stand-ins (launch/cpu_shims/sgl_kernel)"; }
fi
if [ "$DRY" = 1 ]; then
  :
elif python3 -c "import sglang, sgl_kernel" >/dev/null 2>&1; then
  step "part 2: SGLang on the GPU, ESS off vs on (eager) vs on (decode CUDA graphs)"
  timeout 360 python3 bench/gpu_serving_check.py --out "$OUT/serving_gpu.json" 2>&1 | tail -20
else
  step "part 2 skipped: SGLang's CUDA stack (sglang + sgl_kernel) is not installed on this machine"
  echo '{"skipped": "sglang / sgl_kernel not installed"}' > "$OUT/serving_gpu.json"
fi

python3 - "$OUT" "$DRY" <<'EOF'
import json, pathlib, sys
out, dry = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
summary = {}
for name in ("versions", "kernels", "flashtrans", "flashmla", "prefetch_cuda", "ops_h200", "serving_gpu"):
    p = out / f"{name}.json"
    try:
        summary[name] = json.loads(p.read_text())
    except Exception as e:  # a missing or broken part is reported, not hidden
        summary[name] = {"missing": f"{type(e).__name__}: {e}"}
tests = out / "tests.log"
summary["tests_tail"] = tests.read_text()[-3000:] if tests.exists() else None
rc_file = out / "tests_rc.json"
summary["tests_rc"] = json.loads(rc_file.read_text())["rc"] if rc_file.exists() else None
(out / "gpu_check.json").write_text(json.dumps(summary, indent=1))
print(f"[gpu_check] wrote {out / 'gpu_check.json'}")
missing = [k for k, v in summary.items() if isinstance(v, dict) and "missing" in v]
tests_failed = summary["tests_rc"] not in (0, 5)        # pytest: 0 passed or skipped, 5 nothing collected
if dry and (missing or tests_failed):     # on a GPU both are reported in the JSON; a dry run fails
    print(f"[gpu_check] dry run: no result from {', '.join(missing) or '-'}; pytest rc {summary['tests_rc']}",
          file=sys.stderr)
    sys.exit(1)
EOF
