"""Plot bench/spec.py's JSON: speedup over ar against prompt length (one panel per batch size, one line per
method), and at the sweep shape tau against the draft budget (vegas vs streaming, and vegas-pageN where it
ran) and vegas' gamma sweep.

    python bench/plot_spec.py bench/results/spec_h200.json [out_prefix]
      -> <out_prefix>_speedup.png, <out_prefix>_tau_budget.png
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"ar": "k", "streaming": "C1", "quest": "C2", "vegas": "C0", "vegas+all": "C4", "vegas+logits": "C5",
          "vegas-sort": "C3"}


def main(path, prefix=None):
    doc = json.load(open(path))
    recs = [r for r in doc["records"] if "tokens_per_s" in r]
    summ = doc.get("summary", {})
    prefix = prefix or path[:-len(".json")] if path.endswith(".json") else (prefix or path)
    gamma, budget = summ.get("gamma"), summ.get("budget")

    # 1. speedup vs L, one panel per B, grid configs only
    grid = [r for r in recs if r.get("group") == "grid"]
    Bs = sorted({r["B"] for r in grid})
    fig, axes = plt.subplots(1, len(Bs), figsize=(4.2 * len(Bs), 3.6), squeeze=False)
    for ax, B in zip(axes[0], Bs):
        series = defaultdict(list)
        for r in grid:
            if r["B"] == B:
                series[r["label"]].append((r["L"], r["speedup_vs_ar"], r["tau"]))
        for name, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if name != "ar" else "--", label=name,
                    color=COLORS.get(name))
            if name != "ar":
                for L, s, tau in pts:
                    ax.annotate(f"τ{tau:.1f}", (L, s), fontsize=7, textcoords="offset points", xytext=(3, 3))
        ax.set_title(f"B = {B}")
        ax.set_xlabel("prompt length L (tokens)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("speedup over ar (tokens/s ratio)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"Self-speculative decoding, SmolLM2-135M, greedy, gamma {gamma}, budget {budget}")
    fig.tight_layout()
    fig.savefig(f"{prefix}_speedup.png", dpi=120)
    print(f"wrote {prefix}_speedup.png")

    # 2. tau vs budget (vegas, streaming) and the vegas gamma sweep, at the sweep shape
    L, B = (int(x) for x in summ.get("shape_tau", "L8000_B16")[1:].split("_B"))
    at = [r for r in recs if r["L"] == L and r["B"] == B and r["method"] != "ar"
          and r.get("knobs", {}).get("collect", "c2q") == "c2q" and r.get("knobs", {}).get("score_mode") == "weights"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    pages = sorted({r["method"] for r in at if r["method"].startswith("vegas-page")})   # vegas in whole pages
    for i, m in enumerate(["vegas", "streaming", "quest"] + pages):
        pts = sorted((r["budget"], r["tau"]) for r in at if r["method"] == m and r["gamma"] == gamma)
        if pts:
            a1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=m, color=COLORS.get(m, f"C{6 + i}"))
    a1.set_xscale("log", base=2)
    a1.set_xlabel("draft budget (KV slots)")
    a1.set_ylabel(f"tau (tokens per verification), gamma {gamma}")
    a1.set_title(f"L = {L}, B = {B}")
    a1.grid(alpha=0.3)
    a1.legend(fontsize=8)
    pts = sorted((r["gamma"], r["tau"], r["tokens_per_s"]) for r in at if r["method"] == "vegas"
                 and r["budget"] == budget)
    if pts:
        a2.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label="tau")
        a2.set_xlabel("gamma (vegas)")
        a2.set_ylabel("tau")
        tw = a2.twinx()
        tw.plot([p[0] for p in pts], [p[2] for p in pts], "s--", color="C1", label="tokens/s")
        tw.set_ylabel("tokens/s")
        a2.set_title(f"vegas gamma sweep, budget {budget}")
        a2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{prefix}_tau_budget.png", dpi=120)
    print(f"wrote {prefix}_tau_budget.png")


if __name__ == "__main__":
    main(*sys.argv[1:])
