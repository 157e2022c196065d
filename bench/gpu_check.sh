#!/usr/bin/env bash
# The prepared GPU check: one script for the lent GPU machine (one H200; Python 3.12, torch, Triton,
# cuda-python; no SGLang, sgl-kernel, FlashMLA, FlashInfer or DeepGEMM; no network). Run from anywhere:
#   bash bench/gpu_check.sh              on the GPU (the device tool's `run`, timeout_s 600)
#   bash bench/gpu_check.sh --dry-run    any machine: every step with --device cpu at tiny shapes (CI)
#   bash bench/gpu_check.sh --steps      print the step table and the budget arithmetic, run nothing
# Steps, in this order, each under its own `timeout` (the table below), each recorded as soon as it
# ends, whatever the one before it did:
#   preflight     cudaHostRegister of a memfd mapping, read-only registration, 64-bit stream memops:
#                 works / missing, what falls back and the fallback used (bench/gpu_preflight.py)
#   gpu_tests     python -m pytest tests/gpu -rA, JUnit XML in $OUT/gpu_tests.xml
#   flashtrans    FlashTrans GB/s next to a bulk pinned copy (python -m bench flashtrans)
#   step_kernels  resolver and plan-epilogue microseconds at the paper's shapes (bench/gpu_step_kernels.py)
#   decode_loop   a 61-layer decode loop on the store and Triton kernels: exposed fetch per overlap
#                 level, steps/s ESS vs all rows resident at equal device bytes (bench/gpu_decode_loop.py)
# Every Python step runs under bench/gpu_absent.py, which refuses the packages that machine lacks, so
# the dry run in CI fails on an import the GPU machine could not do.
# What comes back ($OUT, default ./gpu_check_out; the device tool returns at most 8 files):
#   steps.jsonl   one JSON line per step: name, status (pass/fail/skip/timeout), seconds, timeout_s, rc,
#                 its result (the step's JSON, or the JUnit counts), the log's tail when it failed
#   summary.json  every step's status and the budget arithmetic, written last
#   gpu_tests.xml pytest's JUnit XML;   logs/<step>.log  each step's whole output
# Exit status: 0 when no step failed or timed out (a skip is not a failure), 1 otherwise, 2 for a wrong
# argument, 3 when the step table breaks the budget.
set -u

BUDGET_S=480      # 8 minutes: the device's 10-minute command less 2 minutes of margin (start-up, imports);
                  # a step stuck past its limit gets 5 s more before SIGKILL: 505 s if every step hangs
# name  timeout_s  (one step per line; their sum must stay <= BUDGET_S, checked before anything runs)
STEP_TABLE="
preflight     40
gpu_tests     150
flashtrans    45
step_kernels  70
decode_loop   175
"

usage() { echo "usage: bash bench/gpu_check.sh [--dry-run | --steps]" >&2; }
DRY=0
LIST=0
if [ $# -gt 1 ]; then usage; echo "one argument at most, got $#: $*" >&2; exit 2; fi
case "${1:-}" in
  --dry-run) DRY=1 ;;
  --steps) LIST=1 ;;
  "") ;;
  *) usage; echo "unknown argument: $1" >&2; exit 2 ;;
esac

# --- the budget arithmetic, before anything runs ---------------------------------------------------
STEP_NAMES=()
STEP_LIMITS=()
SUM_S=0
while read -r name limit rest; do
  [ -z "${name:-}" ] && continue
  if [ -n "${rest:-}" ] || ! [[ "${limit:-}" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_check: step table line '$name ${limit:-} ${rest:-}': expected 'name timeout_s'" >&2; exit 3
  fi
  STEP_NAMES+=("$name"); STEP_LIMITS+=("$limit"); SUM_S=$((SUM_S + limit))
done <<< "$STEP_TABLE"
if [ "$SUM_S" -gt "$BUDGET_S" ]; then
  echo "gpu_check: the step timeouts sum to ${SUM_S} s, over the budget of ${BUDGET_S} s (the device's 10-minute" \
       "command less 2 minutes of margin): shorten a step's timeout in STEP_TABLE or drop a step" >&2
  exit 3
fi
if [ "$LIST" = 1 ]; then
  for i in "${!STEP_NAMES[@]}"; do echo "${STEP_NAMES[$i]} ${STEP_LIMITS[$i]}"; done
  echo "total $SUM_S budget $BUDGET_S"
  exit 0
fi

cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT/steps.jsonl" "$OUT/summary.json" "$OUT/gpu_tests.xml" "$OUT"/logs/*.log   # no stale evidence
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")      # step results before they go into steps.jsonl
trap 'rm -rf "$WORK"' EXIT
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SGL_ESS_BENCH_RESULTS=$WORK/results   # bench/results/ untouched

if [ "$DRY" = 1 ]; then
  echo "[gpu_check] dry run: --device cpu, tiny shapes; checks that every step runs and records; measures nothing"
  DEV=cpu
  FLASHTRANS=(--rows 1024 --host-rows 8192 --repeats 2)
  KERNELS=(--batch 4 --k 64 --slots 128 --context 1024 --steps 4)
  LOOP=(--layers 2 --k 64 --context 512 --slots 128 --heads 4 --index-heads 2 --max-batch 4 --steps 1
        --trace-requests 2)
else
  DEV=cuda
  FLASHTRANS=()
  KERNELS=(--configs)                 # the paper's shapes are the defaults
  LOOP=()                             # 61 layers, k 2048, N 6400, context 32K, batch up to the budgets
fi

limit_of() {
  local i
  for i in "${!STEP_NAMES[@]}"; do
    if [ "${STEP_NAMES[$i]}" = "$1" ]; then echo "${STEP_LIMITS[$i]}"; return 0; fi
  done
  return 1
}

# run_step NAME [--junit FILE] -- COMMAND...: run under the step's timeout, then append its line
run_step() {
  local name=$1 junit="" limit t0 t1 rc secs
  shift
  if [ "$1" = "--junit" ]; then junit=$2; shift 2; fi
  shift                                               # the --
  if ! limit=$(limit_of "$name"); then
    echo "[gpu_check] step $name is not in STEP_TABLE: not run" >&2
    return
  fi
  echo "[gpu_check] $(date -u +%T) step $name (limit ${limit} s): $*"
  t0=$(date +%s.%N)
  # SIGINT first: pytest still writes its JUnit XML and -rA summary, a bench its finally blocks; a
  # step stuck in the driver (a stream wait has no timeout) gets SIGKILL 5 s later
  timeout -s INT -k 5 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  "$PY" bench/gpu_steps.py record --out "$OUT" --name "$name" --rc "$rc" --seconds "$secs" --timeout-s "$limit" \
      --result "$WORK/$name.json" ${junit:+--junit "$junit"} \
    || printf '{"name": "%s", "status": "%s", "seconds": %s, "timeout_s": %s, "rc": %s, "result": null, "note": "%s"}\n' \
         "$name" "$([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo timeout || echo fail)" "$secs" "$limit" "$rc" \
         "bench/gpu_steps.py record failed; see logs/$name.log" >>"$OUT/steps.jsonl"
}

run_step preflight -- "$PY" -m bench.gpu_absent bench.gpu_preflight --out "$WORK/preflight.json"
run_step gpu_tests --junit "$OUT/gpu_tests.xml" -- "$PY" -m bench.gpu_absent pytest tests/gpu -rA -v \
  -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml"
run_step flashtrans -- "$PY" -m bench.gpu_absent bench flashtrans --device "$DEV" ${FLASHTRANS[@]+"${FLASHTRANS[@]}"} \
  --out "$WORK/flashtrans.json"
run_step step_kernels -- "$PY" -m bench.gpu_absent bench.gpu_step_kernels --device "$DEV" \
  ${KERNELS[@]+"${KERNELS[@]}"} --out "$WORK/step_kernels.json"
run_step decode_loop -- "$PY" -m bench.gpu_absent bench.gpu_decode_loop --device "$DEV" ${LOOP[@]+"${LOOP[@]}"} \
  --out "$WORK/decode_loop.json"

TABLE_ARG=""
for i in "${!STEP_NAMES[@]}"; do TABLE_ARG+="${STEP_NAMES[$i]}:${STEP_LIMITS[$i]} "; done
"$PY" bench/gpu_steps.py summary --out "$OUT" --steps "$TABLE_ARG" --budget-s "$BUDGET_S" \
  $([ "$DRY" = 1 ] && echo --dry-run)
