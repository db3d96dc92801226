"""tau against training tokens, from `bash bench/drafter_h200.sh curve` (bench/drafter_tau.py's JSON).

    python bench/plot_drafter_curve.py bench/results/drafter_curve_h200.json [out.png]

Record names are `<run>-step_<N>` (bf16 snapshots), `<run>-drafter` (the run's final block) or a plain name
(a reference drafter). Training tokens = step x tokens per step; the run's final step and its tokens per step
come from `--runs run=summary.json,...` (train_drafter.py's summary) or the defaults below (this repo's runs).
Adds `tokens` and `run` to each record and a `tau_by_tokens` summary to the JSON, then plots.
"""
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The 2026-11-29 H200 runs (bench/results/drafter_distill_h200.json): tokens per step and final step.
RUNS = {"d2048": dict(tokens_per_step=16 * 2048, final_step=1562, label="distilled, 16 x 2048 tokens/step"),
        "d8192": dict(tokens_per_step=4 * 8192, final_step=482, label="distilled, 4 x 8192 tokens/step")}
REFS = {"ce1400": dict(tokens=1400 * 16 * 2048, label="text cross-entropy, 16 x 2048 (previous default)")}


def main(path, out=None):
    doc = json.load(open(path))
    curves = {}
    for r in doc["records"]:
        name = r["drafter"]
        m = re.fullmatch(r"(\w+)-(step_(\d+)|drafter)", name)
        if m and m.group(1) in RUNS:
            run = RUNS[m.group(1)]
            step = int(m.group(3)) if m.group(3) else run["final_step"]
            r["run"], r["tokens"] = m.group(1), step * run["tokens_per_step"]
        elif name in REFS:
            r["run"], r["tokens"] = name, REFS[name]["tokens"]
        else:
            continue
        curves.setdefault(r["run"], {})[r["tokens"]] = r["tau"]
    doc["summary"]["tau_by_tokens"] = {k: {str(t): v[t] for t in sorted(v)} for k, v in curves.items()}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)

    rec = doc["records"][0]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run, pts in curves.items():
        xs = sorted(pts)
        label = RUNS.get(run, REFS.get(run, {})).get("label", run)
        ax.plot([x / 1e6 for x in xs], [pts[x] for x in xs], "o-" if len(xs) > 1 else "s", label=label, ms=4)
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("greedy tree tau")
    ax.set_title(f"LongSpec drafter: tau vs training tokens (L={rec['L']}, B={rec['B']}, "
                 f"tree {','.join(map(str, rec['widths']))}, {rec['new_tokens']} new)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = out or path.replace(".json", ".png")
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main(*sys.argv[1:])
