"""Hugging Face transformers (static cache) on exactly the prompts of a bench/spec.py run, in a separate
process after it: adds hf_tokens_per_s and speedup_vs_hf to every record of that run's JSON.

    PYTHONPATH=. JAX_PLATFORMS=cpu python bench/spec_hf.py --spec $OUT/spec_h200.json [--new 64]

The prompts are rebuilt with bench/spec.py's own make_prompts (same tokenizer, sources and corpus), one
[B, L] set per (L, B) of the run, and timed by bench/hf_decode.py (greedy, decode time minus prefill).
JAX_PLATFORMS=cpu keeps this process off the GPU (it only tokenizes); torch gets the GPU to itself.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.spec import _CachedTokenizer, make_prompts, prompt_sources  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="bench/spec.py's JSON (updated in place)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpus", default="/root/jspec-cache/corpus")
    ap.add_argument("--new", type=int, default=64, help="new tokens per HF run (its tokens/s hardly depends on it)")
    ap.add_argument("--budget-s", type=float, default=1200.0, help="time limit for the HF process")
    ap.add_argument("--shapes", default="", help="only these LxB shapes of the run, e.g. 8000x64,8000x16 (default all)")
    ap.add_argument("--hf-json", default="", help="merge this earlier hf_decode.py result (same prompts) instead of "
                    "running HF; works on bench/longspec.py's JSON too")
    a = ap.parse_args()
    doc = json.load(open(a.spec))
    if a.hf_json:
        merge(doc, json.load(open(a.hf_json)), a.new, a.hf_json)
    else:
        merge(doc, run_hf(a, doc), a.new, "")
    with open(a.spec, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"HF static cache: {doc['summary']['hf_static']}")


def run_hf(a, doc):
    """Time HF on the (L, B) prompt sets of the run; the list hf_decode.py wrote (shapes finished in time)."""
    import jspec

    shapes = sorted({(r["L"], r["B"]) for r in doc["records"] if "tokens_per_s" in r and "L" in r})
    if a.shapes:
        want = {tuple(int(x) for x in s.lower().split("x")) for s in a.shapes.split(",")}
        shapes = [s for s in shapes if s in want]
    m = jspec.load(a.model, dtype="float32")
    tok = _CachedTokenizer(m.tokenizer)
    code, prose = prompt_sources(a.corpus)
    path = "/tmp/jspec_spec_prompts.npz"
    np.savez(path, **{f"{L}_{B}": make_prompts(tok, L, B, code, prose)[0] for L, B in shapes})
    out = "/tmp/jspec_spec_hf.json"
    if os.path.exists(out):
        os.remove(out)
    try:   # hf_decode writes its JSON after every shape: on a timeout, keep the shapes that finished
        subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_decode.py"),
                        "--prompts", path, "--model-dir", m.path, "--new", str(a.new), "--out", out],
                       check=True, timeout=a.budget_s)
    except subprocess.TimeoutExpired:
        print(f"hf_decode.py stopped after --budget-s {a.budget_s:.0f} s; keeping the shapes it finished", flush=True)
    return json.load(open(out)) if os.path.exists(out) else []


def merge(doc, hf_rows, new, source):
    """hf_tokens_per_s / speedup_vs_hf on every record of a timed (L, B), HF figures and headline ratios in the
    summary (vegas / ar at L=8000 B=64, longspec's modes at L=8000 B=16, greedy)."""
    hf = {(r["L"], r["B"]): r for r in hf_rows if "tokens_per_s" in r}
    for r in doc["records"]:
        h = hf.get((r.get("L"), r.get("B")))
        if h and "tokens_per_s" in r:
            r["hf_tokens_per_s"] = h["tokens_per_s"]
            r["speedup_vs_hf"] = round(r["tokens_per_s"] / h["tokens_per_s"], 3)
    s = doc["summary"]
    s["hf_static"] = {f"L{L}_B{B}": h["tokens_per_s"] for (L, B), h in sorted(hf.items())}
    s["hf_new_tokens"] = new
    if source:
        s["hf_source"] = source
    for r in doc["records"]:
        if r.get("group") != "grid" or "speedup_vs_hf" not in r or r.get("T", 0.0) not in (0, 0.0):
            continue
        if r.get("method") in ("vegas", "ar", "streaming", "quest") and (r["L"], r["B"]) == (8000, 64):
            s[f"{r['method']}_speedup_vs_hf_L8000_B64"] = r["speedup_vs_hf"]
        if r.get("method") == "longspec" and (r["L"], r["B"]) == (8000, 16):   # (+lookup chains under their label)
            name = r["label"].replace("-", "_") if (r.get("knobs") or {}).get("lookup") else f"longspec_{r.get('mode')}"
            s[f"{name}_speedup_vs_hf_L8000_B16"] = r["speedup_vs_hf"]


if __name__ == "__main__":
    main()
