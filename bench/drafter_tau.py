"""tau of several LongSpec drafters on the same held-out prompts (the tau side of the drafter ablations).

    PYTHONPATH=. python bench/drafter_tau.py --drafters full=DIR1,no_noisy_xattn=DIR2 --out tau.json
        [--length 1024] [--batch 4] [--new 64] [--modes chain,tree] [--corpus DIR]

Greedy LongSpec generation through `jspec.generate` (the library path users call), every drafter on the same
prompts built as bench/spec.py builds them (rows alternate held-out stdlib code and held-out prose). Records
tau (mean tokens per target verification) and the accepted-length histogram per drafter and mode. It runs on
the CPU as well (float32 there), so drafters trained on the GPU can be compared without device time; tau
compares drafters fairly at any one context length, not the H200's throughput.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import base_record, write_json  # noqa: E402
from bench.spec import _CachedTokenizer, make_prompts, prompt_sources  # noqa: E402
import jspec  # noqa: E402
from jspec.drafter import load_drafter  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafters", required=True, help="name=dir,name=dir,...")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--modes", default="chain,tree")
    ap.add_argument("--widths", default="4,16,16,16,16")
    ap.add_argument("--corpus", default=".carry/heldout", help="held-out prose (*.txt)")
    a = ap.parse_args()
    drafters = dict(x.split("=", 1) for x in a.drafters.split(",") if x)
    m = jspec.load(a.model, dtype="float32" if jax.default_backend() == "cpu" else None, progress=False)
    code, prose = prompt_sources(a.corpus)
    prompts, sources = make_prompts(_CachedTokenizer(m.tokenizer), a.length, a.batch, code, prose)
    widths = tuple(int(x) for x in a.widths.split(","))
    records = []
    for name, path in drafters.items():
        d = load_drafter(path)
        for mode in a.modes.split(","):
            t = time.perf_counter()
            out = jspec.generate(m, [p.tolist() for p in prompts], method="longspec", drafter=d, mode=mode,
                                 tree_widths=widths, gamma=len(widths), max_new_tokens=a.new, ignore_eos=True)
            rec = base_record(drafter=name, path=path, mode=mode, L=a.length, B=a.batch, new_tokens=a.new,
                              widths=list(widths) if mode == "tree" else None, tau=round(out.stats.tau, 3),
                              accept_hist=out.stats.accept_hist, sources=sorted(set(sources)),
                              wall_s=round(time.perf_counter() - t, 1))
            records.append(rec)
            print(json.dumps({k: rec[k] for k in ("drafter", "mode", "tau", "accept_hist", "wall_s")}), flush=True)
    summary = {f"tau_{r['mode']}_{r['drafter']}": r["tau"] for r in records}
    write_json(a.out, records, summary)


if __name__ == "__main__":
    main()
