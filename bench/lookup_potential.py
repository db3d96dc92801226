"""How much could a prompt-lookup branch add to LongSpec's drafts on the benchmark rows? (a measurement, offline)

    PYTHONPATH=. python bench/lookup_potential.py --out $OUT/lookup_potential_h200.json [--length 7936 --batch 16]

Runs plain greedy decoding (`ar`) and LongSpec (the drafter's tuned tree) on bench/spec.py's rows (code and prose
alternating, stop tokens ignored), then replays ar's output offline with an n-gram lookup drafter: at each round
the longest suffix (max_n .. 1 tokens) of prompt + output so far that occurred before proposes the `gamma` tokens
that followed its latest occurrence, and the round accepts the matching prefix (+1 token from the target). Per row:
LongSpec's measured tau beside the lookup's simulated tau; no speed is measured here (nothing of this is timed).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import base_record, write_json  # noqa: E402
from bench.spec import _CachedTokenizer, make_prompts, prompt_sources  # noqa: E402


def lookup_draft(seq: np.ndarray, gamma: int, max_n: int, min_n: int = 1) -> np.ndarray:
    """The `gamma` tokens after the latest earlier occurrence of seq's longest matching suffix (max_n..min_n);
    empty when no suffix of min_n tokens occurred before."""
    for n in range(max_n, min_n - 1, -1):
        if len(seq) <= n:
            continue
        suffix = seq[-n:]
        # windows starting at 0 .. len-n-1 (not the suffix itself)
        win = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
        hits = np.nonzero((win == suffix).all(axis=1))[0]
        if len(hits):
            start = hits[-1] + n
            return seq[start:start + gamma]
    return seq[:0]


def simulate(prompt: np.ndarray, out: np.ndarray, gamma: int, max_n: int) -> dict:
    """Replay greedy output `out` (out[0] came from the prefill) with lookup drafts: rounds and tau."""
    i, rounds, hist = 1, 0, np.zeros(gamma + 1, int)
    while i < len(out):
        d = lookup_draft(np.concatenate([prompt, out[:i]]), gamma, max_n)
        a = 0
        while a < len(d) and i + a < len(out) and d[a] == out[i + a]:
            a += 1
        hist[a] += 1
        i += a + 1
        rounds += 1
    return dict(rounds=rounds, tau=(len(out) - 1) / max(rounds, 1), hist=hist.tolist())


def main():
    import jax
    import jspec
    from jspec import api
    from jspec.drafter import load_drafter

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--length", type=int, default=7936, help="prompt tokens (+ --new must fit the 8192 positions)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--gammas", default="4,6")
    p.add_argument("--max-n", type=int, default=3)
    p.add_argument("--corpus", default=os.path.join(os.environ.get("JSPEC_CACHE", "."), "corpus"))
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default=None)
    a = p.parse_args()

    m = jspec.load(a.model, dtype=a.dtype)
    tok = _CachedTokenizer(m.tokenizer)
    code, prose = prompt_sources(a.corpus)
    prompts, sources = make_prompts(tok, a.length, a.batch, code, prose)
    ids = [r.tolist() for r in prompts]
    ar = api.generate(m, ids, max_new_tokens=a.new, ignore_eos=True)
    ls = api.generate(m, ids, method="longspec", max_new_tokens=a.new, ignore_eos=True)
    records = []
    for b in range(a.batch):
        out = np.asarray(ar.tokens[b])
        rec = base_record(row=b, source=sources[b], L=a.length, new_tokens=len(out),
                          longspec_tau=ls.stats.tau_per_sequence[b],
                          longspec_equals_ar=ls.tokens[b] == ar.tokens[b],
                          distinct_out_frac=len(set(out.tolist())) / len(out))
        for g in (int(x) for x in a.gammas.split(",")):
            rec[f"lookup_g{g}"] = simulate(prompts[b], out, g, a.max_n)
        records.append(rec)
        print(f"row {b:2d} {sources[b]:5s} longspec tau {rec['longspec_tau']:.2f}  "
              + "  ".join(f"lookup g{g} tau {rec[f'lookup_g{g}']['tau']:.2f}" for g in a.gammas.split(","))
              + f"  distinct {rec['distinct_out_frac']:.2f}", flush=True)
    summary = dict(command=" ".join(sys.argv), longspec_knobs=ls.stats.knobs, device=str(jax.devices()[0]))
    for g in a.gammas.split(","):
        t = np.array([r[f"lookup_g{g}"]["tau"] for r in records])
        summary[f"lookup_g{g}_tau_mean"], summary[f"lookup_g{g}_tau_min"] = float(t.mean()), float(t.min())
    t = np.array([r["longspec_tau"] for r in records])
    summary["longspec_tau_mean"], summary["longspec_tau_min"] = float(t.mean()), float(t.min())
    write_json(a.out, records, summary)
    print(summary)


if __name__ == "__main__":
    main()
