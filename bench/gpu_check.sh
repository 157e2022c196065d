#!/usr/bin/env bash
# The prepared GPU check: one script, at most ~10 minutes on one H200, one JSON ($OUT/gpu_check.json)
# plus logs. Run it from the repo root on the GPU machine (the device tool's `run`), e.g.
#   bash bench/gpu_check.sh                      (carry .whl with the sgl-flash-mla wheel if you have it:
#                                                 bash bench/fetch_gpu_wheels.sh here first)
# Part 1 needs only torch + Triton (+ pytest, numpy) with the repo on PYTHONPATH - what that machine has:
#   CUDA tests of the store and kernels, FlashTrans GB/s next to a bulk pinned copy, resolver us/layer
#   (b 64, k 2048, N 6400), Triton sparse decode vs the torch reference, FlashMLA's sparse FP8 decode
#   over our slot space (if its wheel loads on this torch), the store's decode-step loop at the paper's
#   shapes with the exposed fetch per overlap level, the operator profile for the simulator.
# Part 2 needs SGLang's CUDA stack (not on the lent machine: it is skipped there with one line): the
#   embedded model served on the GPU, ESS off vs on, greedy tokens and log-prob differences, and a
#   short bench_serving at a capped device budget (bench/gpu_serving_check.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
step() { echo "[gpu_check] $(date -u +%T) $*"; }

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
timeout 300 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu tests/unit/store tests/unit/attention \
  --junitxml="$OUT/tests.xml" 2>&1 | tail -40 | tee "$OUT/tests.log"
step "part 1: kernels (resolver us/layer, sparse decode)"
timeout 120 python3 -m bench kernels --device cuda --out "$OUT/kernels.json" 2>&1 | tail -20
step "part 1: FlashTrans GB/s vs bulk pinned copy"
timeout 90 python3 -m bench flashtrans --device cuda --out "$OUT/flashtrans.json" 2>&1 | tail -8
step "part 1: FlashMLA sparse FP8 decode over the slot space"
timeout 90 python3 -m bench flashmla --out "$OUT/flashmla.json" 2>&1 | tail -12
step "part 1: decode-step loop, 61 layers, 656-B rows, exposed fetch per overlap level"
timeout 200 python3 -m bench prefetch --device cuda --layers 61 --batch 64 --k 2048 --context 4096 --slots 2560 \
  --heads 64 --index-heads 64 --steps 3 --out "$OUT/prefetch_cuda.json" 2>&1 | tail -10
step "part 1: operator profile for the simulator"
timeout 90 python3 -m bench ops --device cuda --out "$OUT/ops_h200.json" 2>&1 | tail -5

if python3 -c "import sglang, sgl_kernel" >/dev/null 2>&1; then
  step "part 2: SGLang on the GPU, ESS off vs on"
  timeout 240 python3 bench/gpu_serving_check.py --out "$OUT/serving_gpu.json" 2>&1 | tail -20
else
  step "part 2 skipped: SGLang's CUDA stack (sglang + sgl_kernel) is not installed on this machine"
  echo '{"skipped": "sglang / sgl_kernel not installed"}' > "$OUT/serving_gpu.json"
fi

python3 - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
summary = {}
for name in ("versions", "kernels", "flashtrans", "flashmla", "prefetch_cuda", "ops_h200", "serving_gpu"):
    p = out / f"{name}.json"
    try:
        summary[name] = json.loads(p.read_text())
    except Exception as e:  # a missing or broken part is reported, not hidden
        summary[name] = {"missing": f"{type(e).__name__}: {e}"}
tests = out / "tests.log"
summary["tests_tail"] = tests.read_text()[-3000:] if tests.exists() else None
(out / "gpu_check.json").write_text(json.dumps(summary, indent=1))
print(f"[gpu_check] wrote {out / 'gpu_check.json'}")
EOF
