"""Plot bench/results/dense_ab_h200.json (fused dense layers vs cuBLAS in whole loops) as one figure.

    python bench/plot_dense.py bench/results/dense_ab_h200.json [bench/results/dense_ab_h200.png]

One bar pair (ar, vegas tokens/s) per run, grouped by device call (each call has its own cuBLAS baseline,
dense_rows=0); bars of runs whose vegas output equalled ar's on every token are hatched.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src = sys.argv[1]
    dst = sys.argv[2] if len(sys.argv) > 2 else os.path.splitext(src)[0] + ".png"
    recs = json.load(open(src))["records"]
    labels = [f'call {r["device_call"]}\n{"cuBLAS" if r["dense_rows"] == 0 else r["tag"]}\nrows<={r["dense_rows"]}'
              for r in recs]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(recs)), 4.5))
    x = range(len(recs))
    for off, key, name, color in ((-0.2, "ar_tokens_per_s", "ar", "tab:gray"),
                                  (0.2, "vegas_tokens_per_s", "vegas", "tab:blue")):
        for i, r in zip(x, recs):
            ax.bar(i + off, r[key], 0.4, color=color, label=name if i == 0 else None,
                   hatch="//" if r["vegas_equals_ar"] == 1.0 else None, edgecolor="black", linewidth=0.4)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("tokens/s (L=8000, B=64, greedy)")
    ax.set_title("Fused Pallas dense layers vs cuBLAS in whole loops (hatched: vegas == ar on every token)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
