"""Per-row tau of speculative runs (bench records' `tau_rows`): a static batch runs as many rounds as its
slowest row, so the spread across rows, not only the mean, sets its tokens/s.

    python bench/plot_rows.py bench/results/longspec_rows_h200_B16.json [--shape 8000x16] [--out PNG] [--groups all]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows_records(doc, shape=None, groups=("grid", "widths_sweep")):
    """Records that carry per-row tau, optionally of one LxB shape and only of these record groups (None:
    all); labelled method (+ tree widths, + the sweep point outside the grid)."""
    out = []
    for r in doc["records"]:
        if not r.get("tau_rows") or (shape and (r["L"], r["B"]) != shape):
            continue
        if groups is not None and r.get("group") not in (None,) + tuple(groups):
            continue
        label = r.get("label") or r["method"]
        if r.get("widths") and r.get("mode") == "tree":
            label += " (" + ",".join(map(str, r["widths"])) + ")"
        if r.get("group") not in (None, "grid", "widths_sweep"):
            label += f" [{r['group']} g{r.get('gamma')} b{r.get('budget')}]"
        out.append((label, r))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    ap.add_argument("--shape", default="", help="LxB, e.g. 8000x16 (default: every shape, one panel each)")
    ap.add_argument("--out", default="")
    ap.add_argument("--groups", default="grid,widths_sweep",
                    help="record groups to plot (bench/spec.py: grid, budget_sweep, gamma_sweep, ablation), or all")
    a = ap.parse_args()
    doc = json.load(open(a.json))
    shape = tuple(int(x) for x in a.shape.lower().split("x")) if a.shape else None
    recs = rows_records(doc, shape, None if a.groups == "all" else tuple(a.groups.split(",")))
    if not recs:
        raise SystemExit(f"error: no record with tau_rows in {a.json}" + (f" at {a.shape}" if a.shape else ""))
    shapes = sorted({(r["L"], r["B"]) for _, r in recs})
    fig, axes = plt.subplots(len(shapes), 1, figsize=(9, 4.0 * len(shapes)), squeeze=False)
    for ax, (L, B) in zip(axes[:, 0], shapes):
        group = [(lab, r) for lab, r in recs if (r["L"], r["B"]) == (L, B)]
        width = 0.8 / len(group)
        for i, (lab, r) in enumerate(group):
            xs = [j + (i - (len(group) - 1) / 2) * width for j in range(len(r["tau_rows"]))]
            ax.bar(xs, r["tau_rows"], width, label=f"{lab}: mean {r['tau']:.2f}, straggler {r['straggler']:.2f}")
        ax.set_title(f"L = {L}, B = {B}: tau of each row (rows alternate code / prose)")
        ax.set_xlabel("row")
        ax.set_ylabel("tau")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.tight_layout()
    out = a.out or a.json[:-len(".json")] + "_rows.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
