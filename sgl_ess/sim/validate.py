"""The validation protocol: every published point the simulator was NOT fitted on, with its error.

Fitted on: the first Table 2 row only (fit.py). Held out and predicted here:
- Table 2 row 2 (32K, MTP 2, batch 160, r = 0.21): throughput, and the headline gain over row 1;
- Figure 1 (32K, MTP 2, no offload, memory unconstrained): batches 128, 256, 320;
- the +123% gain at 128K (ESS at r = 0.21 vs no offload, each at the largest batch that fits);
- section 3's exposed transfer per layer per micro-batch (128K, batch 160 = two micro-batches of 80,
  MTP 2, 512 misses per request per layer, 37 GB/s): 675 / 423 / 155 us for none / DA / DBA;
- memory: the paper runs batch 160 at r = 0.21, so at least 160 must fit.
Errors are (simulated / published - 1) for throughput, times and batches, and simulated - published
percentage points for gains. Nothing here feeds back into any constant.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .config import ModelSpec, OffloadConfig, SimConfig
from .fit import fit_row, kernel_overhead_for, published, row_config
from .hardware import get_hardware
from .ops import attention_ops, resolve_op
from .overlap import LayerPhaseTimes, overlap
from .profile import OpProfile
from .step import COMPUTE_PHASES, StepResult, simulate
from .transfer import GB


@dataclass
class Check:
    point: str
    metric: str        # throughput | gain | overlap | memory
    published: float
    simulated: float
    unit: str
    command: str

    @property
    def error(self) -> float:
        """Relative error in %, or the difference in points for gains."""
        if self.metric == "gain":
            return self.simulated - self.published
        return 100.0 * (self.simulated / self.published - 1.0)

    @property
    def error_text(self) -> str:
        return f"{self.error:+.1f} pt" if self.metric == "gain" else f"{self.error:+.1f}%"


def _largest(cfg: SimConfig, prof: OpProfile) -> StepResult:
    probe = simulate(replace(cfg, work=replace(cfg.work, batch=1)), profile=prof, check=False)
    return simulate(replace(cfg, work=replace(cfg.work, batch=max(1, probe.memory.max_batch))), profile=prof)


def section3(prof: OpProfile, strategies=("none", "da", "dba")) -> dict[str, float]:
    """Simulated exposed transfer per layer per micro-batch for the paper's section-3 case."""
    ref = published()["section3_overlap_overhead_us"]
    cfg = row_config({"context": ref["context"], "mtp": ref["mtp"], "batch": ref["batch"], "ratio": 0.21})
    m, hw = ModelSpec.load(cfg.deploy.model), get_hardware(cfg.deploy.hardware)
    timer, ko = prof.timer(hw, cfg.deploy.ep), kernel_overhead_for(prof)
    mb, q, miss = ref["batch"] // 2, ref["mtp"], ref["misses_per_layer"]
    ops = attention_ops(m, mb, q, ref["context"]) + [resolve_op(m, mb * q)]
    ph = dict.fromkeys(COMPUTE_PHASES, 0.0)
    for op in ops:
        ph[op.phase] += timer.time_us(op) + op.kernels * ko
    fetch = mb * miss * m.latent_bytes_per_token_layer / (published()["setting"]["pcie_effective_GBps"] * GB) * 1e6
    t = LayerPhaseTimes(ph["indexer"], ph["pre_attn"], ph["attention"], ph["post_attn"], fetch, 0.0,
                        miss / (m.topk_tokens * q), ph["attn_in"])
    return {s: overlap(s, t, ko).exposed_us for s in strategies}


def checks(prof: OpProfile | None = None) -> list[Check]:
    prof = prof or OpProfile.load()
    pub = published()
    row1, row2 = pub["table2_calibration_rows"][:2]
    flag = "" if prof.spec == "h200_published" else f" --op-profile {prof.spec}"
    out = []
    r1 = simulate(row_config(row1), profile=prof, check=False)
    r2 = simulate(row_config(row2), profile=prof, check=False)
    run = f"python -m sgl_ess.sim run --batch 52,160 --ratio 1.0,0.21 --no-fit-check{flag}"
    out.append(Check("Table 2 row 2: 32K MTP 2, batch 160, r=0.21", "throughput", row2["tokens_per_s"],
                     r2.tokens_per_s_per_node, "tok/s/node", run))
    out.append(Check("Table 2 gain, row 2 over row 1", "gain", 100 * (row2["tokens_per_s"] / row1["tokens_per_s"] - 1),
                     100 * (r2.tokens_per_s_per_node / r1.tokens_per_s_per_node - 1), "%", run))
    for pt in pub["figure1_throughput_vs_batch_32k_mtp2_unconstrained_memory"]:
        if pt["batch"] == row1["batch"]:
            continue           # the fitted row itself
        res = simulate(row_config({"batch": pt["batch"]}), profile=prof, check=False)
        out.append(Check(f"Figure 1: 32K MTP 2, batch {pt['batch']}, no offload", "throughput", pt["tokens_per_s"],
                         res.tokens_per_s_per_node, "tok/s/node",
                         f"python -m sgl_ess.sim run --batch {pt['batch']} --no-fit-check{flag}"))
    base = row_config({"context": 131072, "batch": 1})
    no = _largest(base, prof)
    ess = _largest(replace(base, ess=OffloadConfig(ratio=0.21)), prof)
    out.append(Check(f"128K gain: r=0.21 (batch {ess.cfg.work.batch}) vs no offload (batch {no.cfg.work.batch})",
                     "gain", float(pub["other_published"]["gain_128k_pct"]),
                     100 * (ess.tokens_per_s_per_node / no.tokens_per_s_per_node - 1), "%",
                     f"python -m sgl_ess.sim plan --context 131072 --ratios 0.21{flag}"))
    ref = pub["section3_overlap_overhead_us"]
    for s, us in section3(prof).items():
        out.append(Check(f"Section 3: 128K, 80/micro-batch, 512 misses, {s}", "overlap", ref[s], us, "us",
                         "python -m sgl_ess.sim validate"))
    fit160 = simulate(row_config(row2), profile=prof, check=False).memory.max_batch
    out.append(Check("Memory: largest batch at 32K, r=0.21 (paper runs 160)", "memory", row2["batch"], fit160,
                     "requests", "python -m sgl_ess.sim run --batch 160 --ratio 0.21"))
    return out


def fit_summary(prof: OpProfile | None = None) -> dict:
    """What the fit did: the fitted values and how far the unfitted model is from the fitted row."""
    prof = prof or OpProfile.load()
    row = fit_row()
    cfg = row_config(row)
    fitted = simulate(cfg, profile=prof, check=False)
    bare = simulate(cfg, profile=prof, check=False, kernel_overhead_us=0.0)
    return {"row": row, "kernel_overhead_us": kernel_overhead_for(prof),
            "kernels_per_step": fitted.kernels_per_step,
            "overhead_share_of_step": fitted.breakdown_us["kernel_overhead"] / fitted.step_us,
            "fitted_tokens_per_s": fitted.tokens_per_s_per_node,
            "unfitted_tokens_per_s": bare.tokens_per_s_per_node,
            "unfitted_error_pct": 100 * (bare.tokens_per_s_per_node / row["tokens_per_s"] - 1)}


def worst(rows: list[Check]) -> dict[str, Check]:
    out = {}
    for metric in ("throughput", "gain", "overlap", "memory"):
        sel = [r for r in rows if r.metric == metric]
        if sel:
            out[metric] = max(sel, key=lambda r: abs(r.error))
    return out

