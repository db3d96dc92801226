"""tau against training tokens, from `bash bench/drafter_h200.sh curve` (bench/drafter_tau.py's JSON).

    python bench/plot_drafter_curve.py bench/results/drafter_curve_h200.json [more.json ...] [--out out.png]

Record names are `<run>-step_<N>` (bf16 snapshots), `<run>-drafter` (the run's final block) or a plain name
(a reference drafter). Training tokens = step x tokens per step; each run's final step and tokens per step
are in RUNS below (this repo's runs). Adds `tokens` and `run` to each record and a `tau_by_tokens` summary to
each JSON, then plots every file's curves on one figure (default: the first file's name with .png).
"""
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The 2026-11-29 H200 runs (bench/results/drafter_distill_h200.json): tokens per step and final step.
RUNS = {"d2048": dict(tokens_per_step=16 * 2048, final_step=1562, label="distilled, 16 x 2048 tokens/step"),
        "d8192": dict(tokens_per_step=4 * 8192, final_step=482, label="distilled, 4 x 8192 tokens/step"),
        # bench/results/drafter_long_h200.json: the default from 2026-11-29 to 2026-12-02
        "long": dict(tokens_per_step=16 * 2048, final_step=3400,
                     label="distilled, + self-generated text, 16 x 2048 tokens/step (previous default)"),
        # bench/results/drafter_long2_h200.json: the default since (Pallas target prefill: 2.1x the tokens/s)
        "long2": dict(tokens_per_step=16 * 2048, final_step=5600,
                      label="the same recipe, 183M tokens in 9.1 min of training (default)")}
REFS = {"ce1400": dict(tokens=1400 * 16 * 2048, label="text cross-entropy, 16 x 2048 (first default)"),
        "d2048-default": dict(tokens=1562 * 16 * 2048, label="the d2048 drafter re-measured beside `long`"),
        "long-default": dict(tokens=3400 * 16 * 2048, label="the `long` drafter re-measured beside `long2`")}


def main(*args):
    paths = [x for x in args if x.endswith(".json")]
    out = args[args.index("--out") + 1] if "--out" in args else None
    curves = {}
    for path in paths:
        _read(path, curves)
    _plot(curves, json.load(open(paths[0]))["records"][0], out or paths[0].replace(".json", ".png"))


def _read(path, curves):
    """Tokens per record, the file's tau_by_tokens summary (written back), its curves added to `curves`."""
    doc = json.load(open(path))
    mine = {}
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
        mine.setdefault(r["run"], {})[r["tokens"]] = r["tau"]
    doc["summary"]["tau_by_tokens"] = {k: {str(t): v[t] for t in sorted(v)} for k, v in mine.items()}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    for k, v in mine.items():
        curves.setdefault(k, {}).update(v)


def _plot(curves, rec, out):
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
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main(*sys.argv[1:])
