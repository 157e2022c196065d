"""Figures for `sweep --plot`: throughput vs batch with and without ESS, and misses vs ratio.

matplotlib is imported only inside `plot_sweep`, so the simulator itself never needs it.
"""
from __future__ import annotations

from .config import SimConfigError


def plot_sweep(path: str, batch_rows: list[dict], ratio_rows: list[dict], title: str) -> str:
    """batch_rows: {batch, no_offload, ess, max_fit_no_offload, max_fit_ess}; ratio_rows: {ratio, misses...}."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SimConfigError(f"--plot {path}: matplotlib is not installed ({e}); install the 'sim' extra "
                             f"(pip install matplotlib) or drop --plot") from e
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    b = [r["batch"] for r in batch_rows]
    ax1.plot(b, [r["no_offload"] for r in batch_rows], "o-", label="no offload (memory unconstrained)")
    ax1.plot(b, [r["ess"] for r in batch_rows], "s-", label=f"ESS r={batch_rows[0]['ratio']:g}")
    for key, style, lab in (("max_fit_no_offload", ":", "no-offload memory limit"),
                            ("max_fit_ess", "--", "ESS memory limit")):
        ax1.axvline(batch_rows[0][key], linestyle=style, color="gray", label=lab)
    for p in batch_rows[0].get("paper", []):
        ax1.plot(p["batch"], p["tokens_per_s"], "kx")
    ax1.set_xlabel("batch per GPU")
    ax1.set_ylabel("tokens/s per 8-GPU node")
    ax1.set_title("throughput vs batch (x: paper)")
    ax1.legend(fontsize=8)
    r = [x["ratio"] for x in ratio_rows]
    ax2.plot(r, [x["misses_mean"] for x in ratio_rows], "o-", label="mean over layers")
    ax2.plot(r, [x["misses_max"] for x in ratio_rows], "s--", label="worst layer")
    ax2.set_xlabel("sparse memory ratio r")
    ax2.set_ylabel("misses per request per layer per step")
    ax2.set_title("misses vs ratio")
    ax2.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_plan(path: str, curves, chosen: dict | None, title: str) -> str:
    """tokens/s vs batch, one line per curve (plan_curves.Curve), each curve's limits as vertical lines in
    its colour (style per limit kind), and the planned point (chosen: {batch, tokens_per_s, label})."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SimConfigError(f"--plot {path}: matplotlib is not installed ({e}); install the 'sim' extra "
                             f"(pip install matplotlib) or drop --plot") from e
    styles = {"GPU memory": "--", "host memory": ":", "TPOT": "-."}
    fig, ax = plt.subplots(figsize=(9, 5))
    xmax = max(max(c.batches) for c in curves)
    for c in curves:
        (line,) = ax.plot(c.batches, c.tokens_per_s_per_node, "o-", ms=3, label=c.label)
        for name, b in c.limits.items():
            style = next(v for k, v in styles.items() if name.startswith(k))
            if b <= xmax:
                ax.axvline(b, linestyle=style, color=line.get_color(), alpha=0.8,
                           label=f"{c.label}: {name} -> batch {b}")
            else:     # a limit far beyond the others: named, not drawn
                ax.plot([], [], linestyle=style, color=line.get_color(),
                        label=f"{c.label}: {name} -> batch {b} (off the plot)")
    ax.set_xlim(0, xmax * 1.03)
    if chosen:
        ax.plot([chosen["batch"]], [chosen["tokens_per_s"]], "k*", ms=14, label=chosen["label"])
    ax.set_xlabel("batch per GPU (requests)")
    ax.set_ylabel("tokens/s per node")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
