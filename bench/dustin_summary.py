"""Where does Dustin stand against its targets (issue 30)? Gathers the figures of the separate GPU runs into one
file, `bench/results/dustin_h200.json`, without measuring anything or combining numbers across runs:

    python bench/dustin_summary.py [--results bench/results] [--out bench/results/dustin_h200.json]

Inputs (each made by one `bash bench/gpu.sh MODE` call, each with its own provenance):
  bench_dustin64_h200.json        end to end through `jspec bench` (L=7936, B=64): tokens/s, tau, fidelity vs the
                                  same drafter verified densely; every ratio inside one run
  dustin_fidelity_h200.json       `jspec fidelity`, teacher-forced agreement and NLL increase per selection / budget
  kernels_verify_h200.json        `bench/kernels.py --only verify`: the verification attention at Llama-3-8B shapes
  dustin_heads_{self,longspec}_h200.json   `jspec profile-heads`: the profiles the end-to-end run loaded, their
                                  ARR and profiling time
The output's records are the inputs' records, each tagged with its `source`; every summary figure names its
source file and every target says its value, its bar and whether it was met.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import read_result, source_of, write_json  # noqa: E402

BENCH, FIDELITY, KERNELS = "bench_dustin64_h200.json", "dustin_fidelity_h200.json", "kernels_verify_h200.json"
HEADS = {"self": "dustin_heads_self_h200.json", "longspec": "dustin_heads_longspec_h200.json"}


def _load(folder: str, name: str) -> dict:
    return read_result(os.path.join(folder, name))


def end_to_end(doc: dict) -> dict:
    """Per drafter: dense vs Dustin tokens/s, speedup over ar, tau and its ratio, fidelity (one run)."""
    recs = doc["records"]
    ar = next(r for r in recs if r["method"] == "ar")
    out = {"L": ar["L"], "B": ar["B"], "ar_tokens_per_s": ar["tokens_per_s"],
           "ar_distinct_token_share": ar["distinct_token_share"]}
    for r in recs:
        if r["lossless"] or r.get("fidelity") is None:
            continue
        dense = next(d for d in recs if d["method"] == r["fidelity"]["reference"])
        out[r["base_method"]] = {
            "dense": dense["method"], "dense_speedup_vs_ar": dense["speedup_vs_ar"], "dense_tau": dense["tau"],
            "dustin_speedup_vs_ar": r["speedup_vs_ar"], "dustin_tau": r["tau"],
            "tau_ratio_vs_dense": round(r["tau"] / dense["tau"], 4),
            "speedup_vs_dense": round(r["tokens_per_s"] / dense["tokens_per_s"], 4),
            "tokens_to_first_divergence_vs_dense": r["fidelity"]["tokens_to_first_divergence_mean"],
            "rows_identical_vs_dense": r["fidelity"]["rows_identical"],
            "rows_identical_to_ar": r["rows_identical_to_ar"], "dense_rows_identical_to_ar": dense["rows_identical_to_ar"],
            "target_heads": len(r["knobs"]["verify"]["target_heads"]),
            "draft_heads": len(r["knobs"]["verify"]["draft_heads"]), "m": r["knobs"]["verify"]["m"]}
    return out


def summarize(folder: str) -> tuple[list, dict]:
    bench, fid, kern = (_load(folder, n) for n in (BENCH, FIDELITY, KERNELS))
    heads = {d: _load(folder, n) for d, n in HEADS.items()}
    e2e = end_to_end(bench)
    drafters = [d for d in ("vegas", "longspec") if d in e2e]
    best = max(drafters, key=lambda d: e2e[d]["dustin_speedup_vs_ar"])
    fs, ks = fid["summary"], kern["summary"]
    L = max(r["L"] for r in fid["records"])
    agree, nll = fs.get(f"dustin_top1_agreement_L{L}_budget512"), fs.get(f"dustin_nll_increase_frac_L{L}_budget512")
    beats = {k.rsplit("_", 1)[-1]: v for k, v in fs.items() if k.startswith(f"dustin_beats_streaming_and_quest_L{L}")}
    # files from `jspec fidelity` since paired intervals were added say whether the lead is beyond the prompts' noise
    standing = {k.rsplit("_", 1)[-1]: v for k, v in fs.items() if k.startswith(f"dustin_standing_L{L}")}
    prof_s = {d: h["curves"]["calibration"]["total_s"] for d, h in heads.items()}
    tau_ratio = min(e2e[d]["tau_ratio_vs_dense"] for d in drafters)

    def target(value, bar, met, source, condition=""):
        return {"value": value, "target": bar, "met": bool(met), "source": source, "condition": condition}

    summary = {
        f"dustin_speedup_vs_ar_L{e2e['L']}_B{e2e['B']}": e2e[best]["dustin_speedup_vs_ar"],
        f"dustin_top1_agreement_L{L}_budget512": agree,
        f"dustin_nll_increase_frac_L{L}_budget512": nll,
        "verify_attention_speedup_8b_32k_b16": ks.get("verify_attention_speedup_8b_32k_b16"),
        "estimation_overhead_frac": ks.get("estimation_overhead_frac"),
        "end_to_end": e2e, "best_drafter": best, "profiling_s": prof_s,
        "profiles": {d: {"arr": h["arr"], "m": h["m"], "target_heads": h["target_heads"],
                         "draft_heads": h["draft_heads"]} for d, h in heads.items()},
        "targets": {
            "top1_agreement": target(agree, ">= 0.99", agree is not None and agree >= 0.99, FIDELITY,
                                     f"teacher-forced, L={L}, budget 512"),
            "nll_increase_frac": target(nll, "<= 0.01", nll is not None and nll <= 0.01, FIDELITY,
                                        f"teacher-forced, L={L}, budget 512"),
            "ahead_of_streaming_and_quest": (
                target(standing, "ahead at every budget", all(v == "ahead" for v in standing.values()), FIDELITY,
                       "paired 95% intervals over the prompts, top-1 agreement and NLL, per budget") if standing else
                target(beats, "every budget", beats and all(beats.values()), FIDELITY,
                       "top-1 agreement and NLL increase, point estimates per budget (no intervals in this file)")),
            "speedup_vs_ar_B64": target(e2e[best]["dustin_speedup_vs_ar"], ">= 2.5", e2e[best]["dustin_speedup_vs_ar"]
                                        >= 2.5, BENCH, f"{best} drafter, L={e2e['L']}, B={e2e['B']}, budget 512, "
                                        "no lookup"),
            "verify_attention_speedup": target(ks.get("verify_attention_speedup_8b_32k_b16"), ">= 20",
                                               (ks.get("verify_attention_speedup_8b_32k_b16") or 0) >= 20, KERNELS,
                                               "Llama-3-8B shapes, S=32K, B=16, budget 512, 4 assumed SRHs"),
            "estimation_overhead_frac": target(ks.get("estimation_overhead_frac"), "<= 0.02",
                                               (ks.get("estimation_overhead_frac") or 1) <= 0.02, KERNELS,
                                               "of a dense 32-layer verification, 4 assumed SRHs"),
            "tau_ratio_vs_dense": target(tau_ratio, ">= 0.95", tau_ratio >= 0.95, BENCH,
                                         "the least over " + ", ".join(drafters)),
            "profiling_s": target(max(prof_s.values()), "<= 600", max(prof_s.values()) <= 600,
                                  ", ".join(HEADS.values()), "compile included"),
        },
        "sources": {n: source_of(d) for n, d in
                    [(BENCH, bench), (FIDELITY, fid), (KERNELS, kern)] + [(HEADS[d], h) for d, h in heads.items()]},
        "note": "figures are copied from their source files; no ratio combines two runs",
    }
    records = [dict(r, source=n) for n, d in ((BENCH, bench), (FIDELITY, fid), (KERNELS, kern)) for r in d["records"]]
    return records, summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--out", default=None, help="default: RESULTS/dustin_h200.json")
    a = ap.parse_args(argv)
    records, summary = summarize(a.results)
    write_json(a.out or os.path.join(a.results, "dustin_h200.json"), records, summary)
    for name, t in summary["targets"].items():
        v = t["value"]
        v = f"{sum(v.values())}/{len(v)}" if isinstance(v, dict) else str(v)
        print(f"  {name:30s} {v:>12.12s}  target {t['target']:>12s}  {'met' if t['met'] else 'MISSED'}"
              f"  ({t['condition']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
