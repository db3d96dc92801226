"""Plot bench/round_table.py's per-round kernel tables: device time per round by kernel kind, one stacked bar per
(method, shape), the kernel count on top; the measured wall time per round as a marker.

    python bench/plot_rounds.py bench/results/rounds_base_8000x64_h200.json bench/results/rounds_base_8000x16_h200.json \
        --out bench/results/rounds_h200.png
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    recs = [r for f in a.files for r in json.load(open(f))["records"] if "by_kind" in r]
    for r in recs:   # files from before round_table.py knew cuBLAS' nvjet kernels filed them under "other"
        if "gemm" not in r["by_kind"] and any(name.startswith("nvjet") for name, *_ in r.get("top_kernels", [])):
            r["by_kind"]["gemm"] = r["by_kind"].pop("other")
    kinds = sorted({k for r in recs for k in r["by_kind"]},
                   key=lambda k: -sum(r["by_kind"].get(k, [0])[0] for r in recs))
    fig, ax = plt.subplots(figsize=(1.6 * len(recs) + 3, 4.2))
    for i, r in enumerate(recs):
        bottom = 0.0
        for j, k in enumerate(kinds):
            ms = r["by_kind"].get(k, [0.0])[0] / 1e3
            ax.bar(i, ms, bottom=bottom, color=plt.cm.tab20(j % 20), label=k if i == 0 else None, width=0.6)
            bottom += ms
        ax.annotate(f"{r['kernels_per_round']:.0f} kernels", (i, bottom), ha="center", fontsize=8,
                    textcoords="offset points", xytext=(0, 3))
        ax.plot(i, r["round_ms"], "k_", markersize=22, label="wall per round" if i == 0 else None)
    ax.set_xticks(range(len(recs)), [f"{r['method']}\nL={r['L']}, B={r['B']}" for r in recs])
    ax.set_ylabel("device time per round (ms)")
    ax.set_title(f"Where a round goes (one step for ar), {recs[0]['device'].split(':')[-1]}, commit {recs[0]['commit']}")
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
