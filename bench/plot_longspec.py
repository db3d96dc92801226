"""Plot bench/longspec.py's JSON: tokens/s and tau per method at each measured (L, B, T), and tau / tokens/s
against tree size (one line per swept (L, B), greedy) when the run has a widths sweep.

    python bench/plot_longspec.py bench/results/longspec_h200_L8000_B16.json [out.png]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, out=None):
    doc = json.load(open(path))
    recs = [r for r in doc["records"] if "tokens_per_s" in r and r.get("group", "grid") == "grid"]
    sweep = [r for r in doc["records"] if r.get("group") == "widths_sweep" and "tau" in r]
    shapes = sorted({(r["L"], r["B"], r.get("T", 0.0)) for r in recs})
    n = len(shapes) + (2 if sweep else 0)
    ncol = min(n, 4)   # a grid of panels: one row per 4 (L, B, T) shapes
    nrow = -(-n // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.5 * ncol, 4 * nrow), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.axis("off")
    for ax, (L, B, T) in zip(flat, shapes):
        rows = [r for r in recs if (r["L"], r["B"], r.get("T", 0.0)) == (L, B, T)]
        labels = [r["label"].replace("+", "\n+") + (f"\n{','.join(map(str, r['widths']))}" if r.get("widths") and
                                r["label"].startswith("longspec") else "") for r in rows]
        bars = ax.bar(range(len(rows)), [r["tokens_per_s"] for r in rows], color="C0")
        for b, r in zip(bars, rows):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"tau {r['tau']:.2f}\n{r['speedup_vs_ar']:.2f}x ar",
                    ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set_ylabel("tokens/s")
        ax.set_title(f"L={L}, B={B}, T={T:g}")
        ax.margins(y=0.2)
        ax.grid(alpha=0.3, axis="y")
    if sweep:
        trees = sweep + [r for r in recs if r.get("mode") == "tree" and r.get("T", 0.0) == 0.0]
        for i, (key, name) in enumerate((("tau", "tau"), ("speedup_vs_ar", "speedup over ar"))):
            ax = flat[n - 2 + i]
            for L, B in sorted({(r["L"], r["B"]) for r in sweep}):
                pts = sorted({sum(r["widths"]): r[key] for r in trees if (r["L"], r["B"]) == (L, B)}.items())
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=4, label=f"L={L}, B={B}")
            if key == "speedup_vs_ar":
                ax.axhline(1.0, color="gray", lw=0.8)
            ax.set_xlabel("draft tokens per round (tree size)")
            ax.set_ylabel(name)
            ax.set_title(f"greedy tree: {name} vs tree size")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = out or path.replace(".json", ".png")
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
