"""Plot bench/kernels.py's JSON into one figure.

    python bench/plot_kernels.py bench/results/kernels_h200.json [bench/results/kernels_h200.png]

Panels: (1-2) flash_scores time against S per model, T=1 and T=5, with and without scores, next to cuDNN
and the XLA reference (solid B=16, dashed B=1); (3) overhead of the scores; (4) sparse_attention GB/s on
the gathered bytes against the budget, with the 4.3 TB/s copy ceiling; (5) sparse speedup over full flash;
(6) tree_attention speedup over dense masked attention (f32 reference; squares: XLA bf16). Failed or
skipped measurements are left out.
"""
import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HBM_GBPS = 4300.0
STYLE = {1: "--", 16: "-"}


def _ok(records):
    return [r for r in records if "time_ms" in r]


def _series(records, key, x, y):
    out = defaultdict(list)
    for r in records:
        out[key(r)].append((r[x], r[y]))
    return {k: sorted(v) for k, v in out.items()}


def _plot_flash(ax, recs, model):
    names = {"flash_scores": "flash", "flash_scores+scores": "flash+scores", "cudnn": "cuDNN",
             "xla_reference": "XLA ref"}
    colors = {}
    sel = [r for r in recs if r["model"] == model and r["kernel"] in names]
    for (kernel, T, B), pts in sorted(_series(sel, lambda r: (r["kernel"], r["T"], r["B"]), "S", "time_ms").items()):
        label = f"{names[kernel]} T={T}"
        first = label not in colors  # one legend entry per kernel and T, whatever the batch
        color = colors.setdefault(label, f"C{len(colors)}")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], STYLE.get(B, ":"), marker="o", ms=3, color=color,
                label=label if first else None)
    ax.set(xscale="log", yscale="log", xlabel="S (cache positions)", ylabel="ms per call",
           title=f"{model}: flash_scores (solid B=16, dashed B=1)")
    ax.legend(fontsize=6)


def main(path, out=None):
    data = json.load(open(path))
    recs = _ok(data["records"])
    out = out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "kernels_h200.png")
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    models = sorted({r["model"] for r in recs})
    for ax, model in zip(axes[0][:2], models):
        _plot_flash(ax, recs, model)

    ax = axes[0][2]
    sel = [r for r in recs if r["kernel"] == "flash_scores+scores" and "overhead_vs_no_scores" in r]
    for (model, T, B), pts in sorted(_series(sel, lambda r: (r["model"], r["T"], r["B"]), "S",
                                             "overhead_vs_no_scores").items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], STYLE.get(B, ":"), marker="o", ms=3,
                label=f"{model} T={T} B={B}")
    ax.axhline(1.10, color="k", lw=0.8, ls=":", label="target 1.10")
    ax.set(xscale="log", xlabel="S", ylabel="time with / without scores", title="cost of score_rows=(0, T-1)")
    ax.legend(fontsize=6)

    sparse = [r for r in recs if r["kernel"] == "sparse_attention"]
    ax = axes[1][0]
    by_shape = _series(sparse, lambda r: (r["model"], r["S"], r["B"]), "budget", "gbps")
    for (model, S, B), pts in sorted(by_shape.items()):
        ax.plot([100 * p[0] for p in pts], [p[1] for p in pts], STYLE.get(B, ":"), marker="o", ms=3,
                label=f"{model} S={S // 1024}K B={B}")
    ax.axhline(HBM_GBPS, color="k", lw=0.8, label="4.3 TB/s copy")
    ax.axhline(0.6 * HBM_GBPS, color="k", lw=0.8, ls=":", label="60% target")
    ax.set(xlabel="budget (% of S)", ylabel="GB/s on gathered bytes", title="sparse_attention (T=5 + tail)")
    ax.legend(fontsize=5, ncol=2)

    ax = axes[1][1]
    sp = [r for r in sparse if "speedup_vs_flash" in r]
    for (model, S, B), pts in sorted(_series(sp, lambda r: (r["model"], r["S"], r["B"]), "budget",
                                             "speedup_vs_flash").items()):
        ax.plot([100 * p[0] for p in pts], [p[1] for p in pts], STYLE.get(B, ":"), marker="o", ms=3,
                label=f"{model} S={S // 1024}K B={B}")
    ax.set(xlabel="budget (% of S)", ylabel="x faster than full flash (T=5)", yscale="log",
           title="sparse_attention speedup")
    ax.legend(fontsize=5, ncol=2)

    ax = axes[1][2]
    tree = [r for r in recs if r["kernel"] == "tree_attention" and "speedup_vs_dense" in r]
    for (model, B), pts in sorted(_series(tree, lambda r: (r["model"], r["B"]), "n", "speedup_vs_dense").items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], STYLE.get(B, ":"), marker="o", ms=3, label=f"{model} B={B}")
    vs_bf16 = [r for r in recs if r["kernel"] == "tree_attention" and "speedup_vs_dense_xla_bf16" in r]
    for (model, B), pts in sorted(_series(vs_bf16, lambda r: (r["model"], r["B"]), "n",
                                          "speedup_vs_dense_xla_bf16").items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], STYLE.get(B, ":"), marker="s", ms=3, alpha=0.6,
                label=f"{model} B={B} vs XLA bf16")
    ax.axhline(3.0, color="k", lw=0.8, ls=":", label="target 3x")
    ax.set(xlabel="tree tokens n", ylabel="dense masked / tree time", title="tree_attention at S=32K")
    ax.legend(fontsize=6)

    dev = next((r["device"] for r in data["records"]), "?")
    fig.suptitle(f"jspec attention kernels, bf16, {dev}, jax {next((r['jax'] for r in data['records']), '?')}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=130)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
