"""Op benchmark: time the simulator's own operator list with torch and write an op profile.

  python -m bench ops                                   # CPU, the embedded tiny model's shapes
  python -m bench ops --device cuda --out $OUT/ops_h200.json   # GPU, DeepSeek-V3.2 shapes

The ops, their names and shapes come from sgl_ess.sim.ops (what one decode layer does), so every
table in the result is keyed exactly as the simulator looks it up. Each op is timed by a plain torch
implementation of its kind (warm-up, then the median of --reps runs):
  gemm            A[m, k] @ W[n, k]^T: float32 on CPU; on CUDA fp8 torch._scaled_mm for fp8 ops
                  (bf16 when _scaled_mm is missing or the shape is not a multiple of 16), bf16 otherwise
  grouped_gemm    torch.bmm over the groups (MoE local experts, per-head absorption), mean m per group
  elementwise     an RMSNorm-like pass moving the op's HBM bytes, in op.kernels launches
  indexer         the lightning indexer's logits: relu(q . k) weighted over heads, per request
  topk            torch.topk over each query token's logits
  attention       sgl_ess.attention.reference.sparse_mla_decode over k gathered latent rows
  dispatch/combine  not timed (one device): the profile's base (GPU) or nothing (CPU, EP 1) covers them
These are reference kernels, not DeepGEMM / FlashMLA / DeepEP: a GPU profile from here shows what
torch achieves on the device, at the simulator's shapes. Needs torch only (no sglang, no triton).
Writes bench/results/ops_<device>.json via bench.meta.write_result (and copies it to --out).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch

from bench.meta import write_result
from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.attention.reference import sparse_mla_decode
from sgl_ess.sim.config import ModelSpec
from sgl_ess.sim.ops import OpCost, attention_ops, embed_op, ffn_ops, head_ops, mtp_input_ops, resolve_op
from sgl_ess.sim.profile import FORMAT

PRESETS = {   # device -> (model, requests, tokens per request, contexts, EP whose local experts are timed)
    "cpu": ("tiny_dsv32", (1, 2, 4, 8, 16, 32), 1, (512, 2048, 8192), 1),
    "cuda": ("deepseek_v32_exp", (4, 8, 16, 32, 64, 128), 2, (8192, 32768, 131072), 32),
}
MAX_LOGITS_BYTES = 4 << 30    # skip indexer points whose fp32 per-head scores would exceed this
GPU_HARDWARE = (("H200", "h200"), ("H800", "h800"), ("H100", "h100"), ("H20", "h20"), ("A100", "a100"))


class Timer:
    def __init__(self, device: str, warmup: int, reps: int):
        self.device, self.warmup, self.reps = device, warmup, reps

    def __call__(self, fn) -> float:
        """Median microseconds of fn() after warm-up."""
        for _ in range(self.warmup):
            fn()
        out = []
        if self.device == "cuda":
            for _ in range(self.reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b) * 1e3)
        else:
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(out)


class OpRunner:
    """Builds torch inputs for one op and returns a closure that runs it."""

    def __init__(self, m: ModelSpec, device: str, seed: int = 0):
        self.m, self.device = m, device
        self.cpu = device == "cpu"
        self.dt = torch.float32 if self.cpu else torch.bfloat16
        self.g = torch.Generator(device=device).manual_seed(seed)   # inputs are made on the device
        self.notes: dict[str, str] = {}
        self.has_fp8 = (not self.cpu) and hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")

    def rand(self, *shape, dtype=None):
        return torch.randn(*shape, generator=self.g, device=self.device).to(dtype or self.dt)

    def gemm(self, op: OpCost):
        m = max(1, math.ceil(op.m))
        if op.groups > 1:
            a, w = self.rand(op.groups, m, op.k), self.rand(op.groups, op.k, op.n)
            self.notes[op.name] = f"torch.bmm {self.dt}, {op.groups} groups of m={m}"
            return lambda: torch.bmm(a, w)
        if op.dtype == "fp8" and self.has_fp8 and m % 16 == 0 and op.n % 16 == 0 and op.k % 16 == 0:
            a = self.rand(m, op.k, dtype=torch.float32).to(torch.float8_e4m3fn)
            w = self.rand(op.n, op.k, dtype=torch.float32).to(torch.float8_e4m3fn)
            one = torch.ones((), device=self.device)
            try:
                torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                self.notes[op.name] = "torch._scaled_mm fp8 e4m3 -> bf16"
                return lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            except (RuntimeError, TypeError) as e:
                self.notes[op.name] = f"bf16 matmul (_scaled_mm failed: {str(e)[:60]})"
        a, w = self.rand(m, op.k), self.rand(op.n, op.k)
        self.notes.setdefault(op.name, f"torch.matmul {self.dt}")
        return lambda: a @ w.t()

    def elementwise(self, op: OpCost):
        elem = 4 if self.cpu else 2
        per = max(1, int(op.hbm_bytes / max(op.kernels, 1) / (2 * elem)))   # read + write each element
        xs = [self.rand(per) for _ in range(max(op.kernels, 1))]
        self.notes[op.name] = f"{op.kernels} x RMSNorm-like pass over {per} {self.dt} values"
        return lambda: [x * torch.rsqrt(x.float().pow(2).mean() + 1e-6).to(x.dtype) for x in xs]

    def indexer(self, requests: int, q: int, ctx: int):
        m = self.m
        qi = self.rand(requests, q * m.index_heads, m.index_head_dim)
        keys = self.rand(requests, ctx, m.index_head_dim)
        w = self.rand(requests, q * m.index_heads, 1)

        def run():
            s = torch.relu(torch.bmm(qi, keys.transpose(1, 2))) * w
            return s.view(requests, q, m.index_heads, ctx).sum(dim=2)
        return run

    def topk(self, tokens: int, ctx: int):
        logits = self.rand(tokens, ctx, dtype=torch.float32)
        k = min(self.m.topk_tokens, ctx)
        return lambda: torch.topk(logits, k, dim=1)

    def attention(self, tokens: int, ctx: int):
        m = self.m
        kind = "fp8_flashmla" if m.kv_lora_rank % 128 == 0 and not self.cpu else "bf16"
        layout = LatentLayout(kind, m.kv_lora_rank, m.qk_rope_dim)
        pool = min(max(ctx, m.topk_tokens) * 4, 1 << 16)
        rows = layout.encode(self.rand(pool, layout.dim, dtype=torch.float32))
        k = min(m.topk_tokens, ctx)
        slots = torch.randint(0, pool, (tokens, k), generator=self.g, device=self.device)
        q = self.rand(tokens, m.heads, layout.dim, dtype=torch.float32)
        self.notes["attention.sparse"] = f"sgl_ess.attention.reference.sparse_mla_decode, {kind} rows, k={k}"
        return lambda: sparse_mla_decode(q, rows, slots, layout, 0.1)


def layer_ops(m: ModelSpec, requests: int, q: int, ctx: int, ep: int) -> list[OpCost]:
    t = requests * q
    ops = attention_ops(m, requests, q, ctx) + ffn_ops(m, t, False, ep) + ffn_ops(m, t, True, ep)
    ops += head_ops(m, t) + [embed_op(m, t), resolve_op(m, t)]
    if m.num_mtp_layers:
        ops += mtp_input_ops(m, t)
    return ops


def measure(m: ModelSpec, device: str, requests_list, q: int, contexts, ep: int, timer: Timer, log) -> tuple:
    runner = OpRunner(m, device)
    points: dict[str, dict[float, float]] = {}
    units: dict[str, str] = {}
    for ctx in contexts:
        for r in requests_list:
            t = r * q
            for op in layer_ops(m, r, q, ctx, ep):
                if op.kind in ("dispatch", "combine") or op.x in points.get(op.name, {}):
                    continue
                if op.kind == "indexer" and r * q * m.index_heads * ctx * 4 > MAX_LOGITS_BYTES:
                    continue
                if op.kind in ("gemm", "grouped_gemm"):
                    fn = runner.gemm(op)
                elif op.kind == "elementwise":
                    fn = runner.elementwise(op)
                elif op.kind == "indexer":
                    fn = runner.indexer(r, q, ctx)
                elif op.kind == "topk":
                    fn = runner.topk(t, ctx)
                elif op.kind == "attention":
                    fn = runner.attention(t, ctx)
                else:
                    raise ValueError(f"op {op.name}: no torch implementation for kind {op.kind!r}")
                us = timer(fn)
                del fn
                points.setdefault(op.name, {})[op.x] = round(us, 3)
                units[op.name] = op.x_unit
            log(f"  context {ctx:>6}, {r:>3} requests x {q}: {len(points)} ops timed")
    tables = {name: {"x_unit": units[name], "points": sorted([x, us] for x, us in pts.items())}
              for name, pts in sorted(points.items())}
    return tables, runner.notes


def hardware_name(device: str, override: str | None) -> str:
    if override:
        return override
    if device == "cpu":
        return "cpu"
    name = torch.cuda.get_device_name(0)
    for key, hw in GPU_HARDWARE:
        if key in name:
            return hw
    return name.lower().replace(" ", "_")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench ops", description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to time the ops (default cpu)")
    ap.add_argument("--model", default=None, help="model shapes (default: tiny_dsv32 on cpu, deepseek_v32_exp on cuda)")
    ap.add_argument("--ep", type=int, default=None, help="EP degree whose local experts are timed (default 1 / 32)")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per op (default 15 on cpu, 30 on cuda)")
    ap.add_argument("--hardware", default=None, help="data/hardware.json name to record (default: from the device)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1; cuda ignores it)")
    ap.add_argument("--out", default=None, help="also copy the result to this path")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: torch sees no CUDA device; expected a GPU machine; use --device cpu",
              file=sys.stderr)
        return 2
    model_name, requests_list, q, contexts, ep = PRESETS[args.device]
    m = ModelSpec.load(args.model or model_name)
    ep = args.ep or ep
    q = q if m.num_mtp_layers else 1
    torch.manual_seed(0)
    if args.device == "cpu":   # one thread: the timings must not depend on what else shares the cores
        torch.set_num_threads(args.threads)
    timer = Timer(args.device, warmup=3 if args.device == "cpu" else 5, reps=args.reps or (15 if args.device == "cpu"
                                                                                          else 30))
    print(f"timing {m.name} ops on {args.device} ({torch.get_num_threads()} threads): requests {requests_list} x "
          f"{q} tokens, contexts {contexts}, EP {ep}")
    t0 = time.perf_counter()
    with torch.inference_mode():
        tables, notes = measure(m, args.device, requests_list, q, contexts, ep, timer, print)
    device_name = "cpu" if args.device == "cpu" else torch.cuda.get_device_name(0)
    payload = {
        "format": FORMAT, "name": f"measured_{args.device}_{m.name}", "hardware": hardware_name(args.device, args.hardware),
        "device": f"{device_name}, torch {torch.__version__}",
        "model": {"name": m.name, "shape": m.shape_signature()},
        "base": "h200_published" if args.device == "cuda" else None,
        "measured_with": {"implementations": notes, "reps": timer.reps, "warmup": timer.warmup,
                          "tokens_per_request": q, "ep_local_experts_of": ep,
                          "seconds": round(time.perf_counter() - t0, 1)},
        "tables": tables,
    }
    path = write_result(f"ops_{args.device}", payload, also_to=args.out)
    print(f"wrote {path} ({len(tables)} op tables, {payload['measured_with']['seconds']} s)"
          + (f" and {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

