"""Plot bench/serve.py results (static batches vs continuous batching) as one figure.

    python bench/plot_serve.py bench/results/serve_8000x16_h200.json bench/results/serve_8000x64_h200.json \
        [--out bench/results/serve_h200.png]

One group of bars per (L x B, method, mode): decode-only and total (prefill included) tokens/s, each as a
speedup over the same file's static ar batches (dashed line at 1).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default="bench/results/serve_h200.png")
    a = ap.parse_args()
    rows = []
    for f in a.files:
        for r in json.load(open(f))["records"]:
            if r["method"] != "ar":
                exact = " exact" if r.get("dense_rows") else ""
                rows.append((f'{r["L"]}x{r["B"]} q{r["queue"]}\n{r["method"]}{exact}\n{r["mode"]}',
                             r["decode_speedup_vs_ar"], r["total_speedup_vs_ar"]))
    fig, ax = plt.subplots(figsize=(max(8, 1.15 * len(rows)), 4.5))
    for off, col, name, color in ((-0.2, 1, "decode", "tab:blue"), (0.2, 2, "decode + prefill", "tab:orange")):
        ax.bar([i + off for i in range(len(rows))], [r[col] for r in rows], 0.4, color=color, label=name)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r[0] for r in rows], fontsize=7)
    ax.set_ylabel("speedup over static ar batches")
    ax.set_title("Continuous batching (servedK: K free slots refilled together; stagedK: K prefilled ahead,\n"
                 "refilled on the device) vs static batches, greedy, 256 new", fontsize=9)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
