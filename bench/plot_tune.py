"""Plot `jspec tune --method longspec` results: tokens/s of each candidate draft shape (tau on top), one panel per
result file (batch size), plain decoding's tokens/s as a line and the chosen shape marked.

    python bench/plot_tune.py bench/results/tune_longspec_B1_h200.json bench/results/tune_longspec_B16_h200.json \
        --out bench/results/tune_longspec_h200.png
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
    docs = [json.load(open(f)) for f in a.files]
    fig, axes = plt.subplots(1, len(docs), figsize=(5.2 * len(docs), 3.8), squeeze=False)
    for ax, d in zip(axes[0], docs):
        ms = d["measurements"]
        names = [",".join(map(str, m["tree_widths"])) if m["mode"] == "tree" else f"chain {len(m['tree_widths'])}"
                 for m in ms]
        best = max(range(len(ms)), key=lambda i: ms[i]["tokens_per_s"])
        bars = ax.bar(range(len(ms)), [m["tokens_per_s"] for m in ms],
                      color=["C0" if i == best else "C7" for i in range(len(ms))])
        for b, m in zip(bars, ms):
            ax.annotate(f"τ{m['tau']:.2f}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                        fontsize=7, textcoords="offset points", xytext=(0, 2))
        if d.get("ar_tokens_per_s"):
            ax.axhline(d["ar_tokens_per_s"], color="k", ls="--", lw=1, label=f"ar {d['ar_tokens_per_s']:,.0f}")
            ax.legend(fontsize=8, loc="lower right")
        ax.set_xticks(range(len(ms)), names, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"B = {d['batch']}, L = {d['prompt_tokens']}: chose {names[best]}", fontsize=10)
        ax.set_ylabel("tokens/s")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"jspec tune --method longspec, {docs[0]['device'].split(':')[-1]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
