"""Where does the fixed cost of a forward step stand against its targets (issue 31)? Gathers the figures of
separate GPU runs into one file, `bench/results/step_overhead_<card>.json` (+ .png), measuring nothing itself:

    python bench/step_overhead.py --bench bench/results/bench_b{1,16,64}_h200.json \
        --profile bench/results/profile_step_h200.json [--model smollm2-135m] [--out FILE]

Inputs, each with its own provenance:
  --bench    `jspec bench` result files (`bash bench/gpu.sh b1`, `b16`, `b64`, or one file of several shapes):
             ar's tokens/s per shape, the best lossless method's speedup, and the peers (Hugging Face with a static
             cache, the same under torch.compile) on the same prompts. Each shape must come from one file, so every
             ratio in it (x ar, ar against a peer) divides two numbers of one run.
  --profile  `bench/profile_step.py`: kernels and device time per step kind and batch size.
The bandwidth floor of a shape is a model, not a measurement: one decode step reads every weight once and the
cache of each row at its mean context (prompt + half the new tokens), at bench.common.HBM_BYTES_PER_S; ar's share
of it is its measured tokens/s over the floor's. Every summary figure names its source; every target says its
value, its bar, whether it was met and on what condition.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import HBM_BYTES_PER_S, read_result, source_of, write_json  # noqa: E402

# Issue 31's targets, at L=8000 (`jspec bench`'s 7936-token prompts + 256 new tokens).
TARGETS = {"ar_tok_s_B1": 3000.0, "roofline_B1": 0.30, "roofline_B16": 0.65, "roofline_B64": 0.80,
           "kernels_per_plain_step": 120, "draft_step_ms_B64": 0.8, "best_lossless_speedup_B64": 2.0}


def floor_tokens_per_s(weight_bytes: int, kv_bytes_per_token: int, B: int, context: float,
                       hbm: float = HBM_BYTES_PER_S) -> float:
    """Tokens/s of B rows if each decode step only streamed the weights and every row's cache at HBM speed."""
    return B * hbm / (weight_bytes + B * context * kv_bytes_per_token)


def shapes_of(bench_docs: dict) -> dict:
    """{(L, B): (file, ar record, the file's summary of that shape, peers at that shape)}; a shape in two files
    is refused (its ratios would mix runs)."""
    out = {}
    for name, doc in bench_docs.items():
        for r in doc["records"]:
            if r["method"] != "ar":
                continue
            key = (r["L"], r["B"])
            if key in out:
                raise SystemExit(f"error: L={key[0]} B={key[1]} is in both {out[key][0]} and {name}")
            peers = {p["peer"]: p for p in doc.get("peers", []) if (p.get("L"), p.get("B")) == key
                     and p.get("tokens_per_s")}
            out[key] = (name, r, doc["summary"].get(f"L{key[0]}_B{key[1]}", {}), peers)
    return out


def summarize(bench_docs: dict, profile: dict, profile_name: str, weight_bytes: int, kv_bytes_per_token: int):
    """(records, summary): the per-shape table and issue 31's summary keys with their targets."""
    shapes = shapes_of(bench_docs)
    records = []
    for (L, B), (name, ar, summ, peers) in sorted(shapes.items()):
        context = ar["prompt_tokens_mean"] + ar["new_tokens_mean"] / 2
        floor = floor_tokens_per_s(weight_bytes, kv_bytes_per_token, B, context)
        records.append({"L": L, "B": B, "source": name, "ar_tokens_per_s": ar["tokens_per_s"],
                        "new_tokens_mean": ar["new_tokens_mean"], "serial": ar.get("serial"),
                        "context_mean": round(context, 1),
                        "floor_tokens_per_s": round(floor, 1), "ar_roofline_frac": round(ar["tokens_per_s"] / floor, 4),
                        "best_lossless": summ.get("best"), "best_lossless_speedup_vs_ar": summ.get("best_speedup_vs_ar"),
                        "best_without_lookup": summ.get("best_without_lookup"),
                        "best_without_lookup_speedup_vs_ar": summ.get("best_without_lookup_speedup_vs_ar"),
                        "ar_distinct_token_share": summ.get("ar_distinct_token_share"),
                        **{f"ar_speedup_vs_{p}": round(ar["tokens_per_s"] / q["tokens_per_s"], 3)
                           for p, q in peers.items()}})
    L = max(L for L, _ in shapes)            # the long context of the targets
    at = {r["B"]: r for r in records if r["L"] == L}
    ps = profile["summary"]
    kernels = {B: ps.get(f"kernels_per_plain_step_B{B}") for B in (1, 16, 64) if f"kernels_per_plain_step_B{B}" in ps}
    draft_ms = ps.get("draft_step_device_ms_B64")
    compiled = {B: r.get("ar_speedup_vs_hf-compile") for B, r in at.items()}

    def target(value, bar, met, source, condition):
        return {"value": value, "target": bar, "met": bool(met) if value is not None else False, "source": source,
                "condition": condition}

    def fig(B, key):
        return at[B][key] if B in at else None

    frac = {B: fig(B, "ar_roofline_frac") for B in (1, 16, 64)}
    best64 = fig(64, "best_without_lookup_speedup_vs_ar")
    src = lambda B: at[B]["source"] if B in at else None
    summary = {
        "ar_tok_s_L8000_B1": fig(1, "ar_tokens_per_s"),
        "ar_roofline_frac_L8000_B1": frac[1], "ar_roofline_frac_L8000_B16": frac[16],
        "ar_roofline_frac_L8000_B64": frac[64],
        "kernels_per_plain_step": max(kernels.values()) if kernels else None,
        "kernels_per_plain_step_by_B": kernels,
        "draft_step_ms_L8000_B64": draft_ms,
        "best_lossless_speedup_vs_ar_L8000_B64": best64,
        "best_lossless_speedup_vs_ar_L8000_B64_with_lookup": fig(64, "best_lossless_speedup_vs_ar"),
        "ar_speedup_vs_torch_compile_L8000_B16": compiled.get(16),
        "ar_speedup_vs_torch_compile_by_B": compiled,
        "L": L,
        "targets": {
            "ar_tok_s_B1": target(fig(1, "ar_tokens_per_s"), ">= 3000", (fig(1, "ar_tokens_per_s") or 0) >= 3000,
                                  src(1), f"ar, L={L}, B=1, greedy, through jspec.generate, "
                                  f"{fig(1, 'new_tokens_mean')} new tokens per row on average, "
                                  + (f"{fig(1, 'serial')} prompts decoded one at a time (--serial)"
                                     if fig(1, "serial") else "one prompt")),
            **{f"ar_roofline_frac_B{B}": target(frac[B], f">= {TARGETS[f'roofline_B{B}']}",
                                                (frac[B] or 0) >= TARGETS[f"roofline_B{B}"], src(B),
                                                f"L={L}; floor: weights + each row's cache at its mean context per "
                                                f"step at {HBM_BYTES_PER_S / 1e12:.1f} TB/s")
               for B in (1, 16, 64)},
            "kernels_per_plain_step": target(max(kernels.values()) if kernels else None, "<= 120",
                                             kernels and max(kernels.values()) <= 120, profile_name,
                                             "the most over the profiled batch sizes"),
            "draft_step_ms_B64": target(draft_ms, "<= 0.8", (draft_ms or 1e9) <= 0.8, profile_name,
                                        "sparse draft step (vegas), device time, B=64"),
            "ar_ahead_of_torch_compile": target(compiled, "> 1 at every B",
                                                compiled and all((v or 0) > 1 for v in compiled.values()),
                                                ", ".join(sorted({src(B) for B in at})),
                                                "ar against Hugging Face + torch.compile(reduce-overhead), same prompts"),
            "best_lossless_speedup_B64": target(best64, "> 2 (report)", (best64 or 0) > 2, src(64),
                                                "without prompt lookup"),
        },
        "sources": {**{n: source_of(d) for n, d in bench_docs.items()}, profile_name: source_of(profile)},
        "note": "figures are copied from their source files; the floor is a model; no ratio combines two runs",
    }
    return records, summary


def plot(records: list, summary: dict, path: str):
    """ar's tokens/s against the bandwidth floor per batch size, and kernels per plain step against the target."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in records if r["L"] == summary["L"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.5, 3.8))
    x = range(len(rows))
    a.bar([i - 0.2 for i in x], [r["floor_tokens_per_s"] for r in rows], 0.4, color="0.75", label="bandwidth floor")
    bars = a.bar([i + 0.2 for i in x], [r["ar_tokens_per_s"] for r in rows], 0.4, color="C0", label="ar (measured)")
    for bar, r in zip(bars, rows):
        a.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{r['ar_roofline_frac']:.0%}", ha="center",
               va="bottom", fontsize=8)
    a.set_xticks(list(x), [f"B={r['B']}" for r in rows])
    a.set_ylabel("new tokens/s")
    a.set_title(f"ar at L={summary['L']}: share of the floor", fontsize=9)
    a.legend(fontsize=7)
    k = summary["kernels_per_plain_step_by_B"]
    b.bar([f"B={B}" for B in k], list(k.values()), color="C1")
    b.axhline(TARGETS["kernels_per_plain_step"], color="k", ls="--", lw=1, label="target")
    b.set_ylabel("kernel launches per plain step")
    b.set_title("launches per step (profile)", fontsize=9)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", nargs="+", required=True, help="jspec bench result files")
    ap.add_argument("--profile", required=True, help="bench/profile_step.py result file")
    ap.add_argument("--model", default="smollm2-135m", help="the benchmarked model (weights and KV bytes per token)")
    ap.add_argument("--out", default=None, help="default: step_overhead_<card>.json beside the profile")
    a = ap.parse_args(argv)
    import jax

    from jspec import checkpoints, model
    cfg = checkpoints.load_config(checkpoints.resolve(a.model))
    weight_bytes = model.param_bytes(jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0))))
    bench_docs = {os.path.basename(p): read_result(p) for p in a.bench}
    profile = read_result(a.profile)
    records, summary = summarize(bench_docs, profile, os.path.basename(a.profile), weight_bytes,
                                 cfg.kv_bytes_per_token())
    card = "h100" if "H100" in str(profile.get("provenance", {}).get("device")) else "h200"
    out = a.out or os.path.join(os.path.dirname(a.profile), f"step_overhead_{card}.json")
    write_json(out, records, summary)
    png = plot(records, summary, os.path.splitext(out)[0] + ".png")
    if png:
        print(f"wrote {png}")
    for name, t in summary["targets"].items():
        v = t["value"]
        v = ", ".join(f"B={k}: {x}" for k, x in v.items()) if isinstance(v, dict) else str(v)
        print(f"  {name:28s} {v:>32.32s}  target {t['target']:>14s}  {'met' if t['met'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
