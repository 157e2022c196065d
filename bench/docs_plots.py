"""Plots for docs/benchmarks.md and the README, drawn from result files already in bench/results/.

    python bench/docs_plots.py [--out docs/img]

Measures nothing: it reads the JSON results (each holds its own command, commit and versions) and writes
  serving.png   output tok/s per server, ESS off vs on (every run as a dot, the median as the bar):
                at equal device memory (serving_20261129T181731Z.json) and without memory pressure
                (serving_20261129T180418Z.json)
  prefetch.png  fetch vs exposed fetch per overlap level and engine (prefetch.json)
Needs matplotlib (the `sim` extra of pyproject.toml).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
EQUAL_MEMORY = "serving_20261129T181731Z.json"
NO_PRESSURE = "serving_20261129T180418Z.json"
PREFETCH = "prefetch.json"
COLORS = {"off": "#7f7f7f", "auto": "#1f77b4", "worker": "#ff7f0e"}


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def serving_rows(result: dict) -> list[tuple[str, str, list[float]]]:
    """(label, color key, runs in tok/s) for ESS off, then every engine x level of the run."""
    rows = [("ESS off", "off", result["modes"]["ess_off"]["output_throughput_runs"])]
    for engine, levels in result["engines_x_levels"].items():
        for level, r in levels.items():
            rows.append((f"{engine}\n{level}", engine, r["output_throughput_runs"]))
    return rows


def _serving_panel(ax, result: dict, title: str) -> None:
    rows = serving_rows(result)
    off = statistics.median(rows[0][2])
    for i, (label, key, runs) in enumerate(rows):
        med = statistics.median(runs)
        ax.bar(i, med, color=COLORS[key], alpha=0.75, width=0.7)
        ax.plot([i] * len(runs), runs, "k.", markersize=4)
        ax.text(i, med * 0.5, f"{med / off:.2f}×", ha="center", va="center", fontsize=8, color="white",
                fontweight="bold")
    ax.set_xticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.set_ylabel("output tokens / s")
    ax.set_title(title, fontsize=10)
    ax.axhline(off, color=COLORS["off"], linewidth=0.8, linestyle="--")


def plot_serving(out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eq, nop = load(EQUAL_MEMORY), load(NO_PRESSURE)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [9, 5]})
    b = eq["device_budget"]
    _serving_panel(axes[0], eq, f"equal device memory ({b['ess_off_kv_device_bytes'] / 1e6:.2f} MB of KV): "
                               f"ESS on runs 2× the batch\n(peak running {eq['modes']['ess_off']['peak_running_requests']}"
                               f" off vs {eq['modes']['ess_on']['peak_running_requests']} on)")
    _serving_panel(axes[1], nop, "no memory pressure: same batch,\nthe per-token cost of ESS")
    fig.suptitle("SGLang bench_serving on the embedded tiny model, 2-core CPU (bar: median of the runs; "
                 "dots: each run; label: × ESS off)", fontsize=9)
    fig.text(0.01, 0.01, f"{eq['meta']['command']} @ {eq['meta']['commit'][:7]}  ·  "
                         f"{nop['meta']['command']} @ {nop['meta']['commit'][:7]}", fontsize=6, color="#555")
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    path = out / "serving.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_prefetch(out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = load(PREFETCH)
    rows = res["results"]
    labels = [f"{r['mode']}\n{r['engine']}" for r in rows]
    fetch = [r["total_ms"]["fetch"] for r in rows]
    exposed = [r["total_ms"]["exposed"] for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar([x - 0.2 for x in xs], fetch, width=0.4, color="#bbbbbb", label="fetch (time the copy takes)")
    ax.bar([x + 0.2 for x in xs], exposed, width=0.4, color="#c0392b", label="exposed fetch (time compute waits)")
    for x, f, e in zip(xs, fetch, exposed):
        ax.text(x + 0.2, e + 8, f"{e:.0f}", ha="center", fontsize=8)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("ms, sum over 8 layers of per-layer medians")
    a = res["args"]
    ax.set_title(f"hiding the fetch: batch {a['batch']}, top-{a['k']}, {a['context'] // 1024}K context, "
                 f"{a['slots']} hot slots (CPU)", fontsize=10)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, f"{res['meta']['command']} @ {res['meta']['commit'][:7]}", fontsize=6, color="#555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = out / "prefetch.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "img"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for path in (plot_serving(out), plot_prefetch(out)):
        print(path)


if __name__ == "__main__":
    main()
