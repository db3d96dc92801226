"""Plot bench/decode.py's JSON: tokens/s against prompt length, one panel per batch size, jspec backends
against Hugging Face's static cache, with the bandwidth roofline.

    python bench/plot_decode.py bench/results/ar_decode_h200.json [out.png]
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, out=None):
    recs = [r for r in json.load(open(path))["records"] if "tokens_per_s" in r]
    Bs = sorted({r["B"] for r in recs})
    fig, axes = plt.subplots(1, len(Bs), figsize=(4.2 * len(Bs), 3.6), squeeze=False)
    for ax, B in zip(axes[0], Bs):
        series = defaultdict(list)
        roof = {}
        for r in recs:
            if r["B"] != B:
                continue
            name = "HF static cache" if r["method"] == "hf_static" else f"jspec {r.get('impl', '')}"
            series[name].append((r["L"], r["tokens_per_s"]))
            if "roofline_tokens_per_s" in r:
                roof[r["L"]] = r["roofline_tokens_per_s"]
        for name, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
        if roof:
            Ls = sorted(roof)
            ax.plot(Ls, [roof[L] for L in Ls], "k--", lw=1, label="roofline (4.3 TB/s)")
        ax.set_title(f"B = {B}")
        ax.set_xlabel("prompt length L (tokens)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("decode tokens/s")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("Plain greedy decoding, SmolLM2-135M, H200")
    fig.tight_layout()
    out = out or path.replace(".json", ".png")
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
