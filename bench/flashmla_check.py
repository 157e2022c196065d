"""FlashMLA's sparse FP8 decode over the ESS slot space and slot table, against our reference.

  python -m bench flashmla --out PATH          (CUDA, with FlashMLA's `flash_mla` module installed)

Builds FP8 656-byte rows (DeepSeek-V3.2 layout, sgl_ess.kernels.latent_layout) in a slot
space that is a multiple of 64 rows, a slot table [b, 2048] with -1 padding (what the store's
resolver produces), and runs FlashMLA's `flash_mla_with_kvcache(..., indices=slot table,
is_fp8_kvcache=True, kv_format="V32")` - the kernel SGLang's `flashmla_kv` decode calls. Compares
with sgl_ess.attention.reference.sparse_mla_decode on the same bytes (max abs / rel error of out
and lse) and times it (CUDA events). If the wheel does not load on this torch (it declares
torch>=2.14.1), the report says so: that is a result too. Not a step of bench/gpu_check.sh: the
lent GPU machine has no FlashMLA and cannot fetch it; run it on a GPU node that serves with SGLang.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback

import torch

from bench.meta import write_result


def _check(args) -> dict:
    from sgl_ess.kernels.latent_layout import LatentLayout
    from sgl_ess.attention.reference import sparse_mla_decode

    try:
        import flash_mla
    except Exception as e:  # noqa: BLE001 - the failure to load is the result
        return {"loaded": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
    lay = LatentLayout("fp8_flashmla", 512, 64)
    g = torch.Generator().manual_seed(0)
    s_rows = 64 * ((args.slots + 63) // 64)
    rows = lay.encode(torch.randn(s_rows, lay.dim, generator=g)).cuda()
    slots = torch.stack([torch.randperm(s_rows, generator=g)[:args.topk] for _ in range(args.batch)]).to(torch.int32)
    slots[:, -args.pad:] = -1
    slots = slots.cuda()
    q = (torch.randn(args.batch, args.heads, lay.dim, generator=g) * 0.5).to(torch.bfloat16).cuda()
    scale = lay.dim ** -0.5
    meta, _ = flash_mla.get_mla_metadata()

    def run():
        return flash_mla.flash_mla_with_kvcache(
            q=q.unsqueeze(1), k_cache=rows.view(torch.float8_e4m3fn).view(-1, 64, 1, lay.row_bytes),
            block_table=None, cache_seqlens=None, head_dim_v=512, tile_scheduler_metadata=meta,
            softmax_scale=scale, indices=slots.unsqueeze(1), is_fp8_kvcache=True, kv_format="V32",
            use_legacy=torch.cuda.get_device_capability()[0] < 10)

    out, lse = run()
    torch.cuda.synchronize()
    ref_out, ref_lse = sparse_mla_decode(q.float().cpu(), rows.cpu(), slots.cpu(), lay, scale)
    got = out.squeeze(1).float().cpu()
    err = (got - ref_out).abs()
    times = []
    for _ in range(args.repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return {"loaded": True, "flash_mla_file": flash_mla.__file__,
            "out_max_abs_err": float(err.max()), "out_max_rel_err": float(err.max() / ref_out.abs().max()),
            "lse_max_abs_err": float((lse.reshape(args.batch, args.heads).float().cpu() - ref_lse).abs().max()),
            "median_us": statistics.median(times), "shape": {"batch": args.batch, "heads": args.heads,
                                                               "topk": args.topk, "slots": s_rows, "pad": args.pad}}


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench flashmla", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--heads", type=int, default=64, help="query heads (FlashMLA takes 64 or 128)")
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--slots", type=int, default=64 * 6400, help="rows of the slot space")
    p.add_argument("--pad", type=int, default=17, help="trailing -1 entries per row")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", metavar="PATH")
    args = p.parse_args()
    if not torch.cuda.is_available():
        msg = "needs a CUDA device (this machine has none); nothing measured"
        print(f"bench flashmla: {msg}", file=sys.stderr)
        if args.out:                      # the GPU check's summary then says skipped, not missing
            with open(args.out, "w") as fh:
                json.dump({"skipped": msg}, fh)
        return 2
    res = _check(args)
    print(json.dumps({k: v for k, v in res.items() if k != "trace"}, indent=1))
    write_result("flashmla_cuda", res, also_to=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
