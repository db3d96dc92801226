"""Whole decode loops under the current XLA_FLAGS: wall time per round and, from a profiler trace, what a
round launches (kernels and device time per round, by kind and by name).

    XLA_FLAGS=... PYTHONPATH=. python bench/round_table.py --out $OUT/rounds_<tag>.json --tag <tag> \
        --shape 8000x16 --methods ar,longspec [--no-trace]

Real prompts (code and prose rows alternating, as bench/spec.py), greedy, stop tokens ignored. `ar` is
`decoding.decode` (one target step per round, the speedups' denominator); the other methods run
`engine.run_donating` from a fresh `engine.init` each call (best of --reps). Run it once per compiler setting
(bench/pdl_h200.sh) to compare settings on the same loops: only wall time decides, the trace explains.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import base_record, write_json  # noqa: E402
from bench.serve import spec_for  # noqa: E402
from bench.spec import GREEDY, _CachedTokenizer, _shape, make_prompts, prompt_sources  # noqa: E402
import jspec  # noqa: E402
from jspec import api, decoding as gen, kv_cache  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.speculative import engine  # noqa: E402

KINDS = (("flash_scores", "flash_scores"), ("tree_attention", "tree_attention"),
         ("sparse_attention", "sparse_attention"), ("topk_select", "topk_select"), ("score_weights", "score_weights"),
         ("gemm", "gemm"), ("nvjet", "gemm"), ("xmma", "gemm"), ("cutlass", "gemm"), ("memcpy", "memcpy"), ("memset", "memcpy"),
         ("reduce", "reduce fusion"), ("scatter", "scatter fusion"), ("dynamic_update_slice", "dus fusion"),
         ("fusion", "other fusion"))


def kind(name):
    low = name.lower()
    return next((k for pat, k in KINDS if pat in low), "other")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", default="")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--shape", default="8000x16")
    ap.add_argument("--methods", default="ar,longspec")
    ap.add_argument("--widths", default="2,2,2,2,2", help="longspec tree widths")
    ap.add_argument("--drafter", default=None, help="longspec drafter directory (default: the bundled one)")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--corpus", default="/root/jspec-cache/corpus")
    ap.add_argument("--impl", default="pallas", choices=["pallas", "xla"], help="xla: CPU smoke test")
    a = ap.parse_args()
    L, B = _shape(a.shape)
    impl = AttnImpl(backend=a.impl)
    m = jspec.load(a.model, progress=False)
    cfg, params = m.cfg, m.params
    code, prose = prompt_sources(a.corpus)
    tokens = jnp.asarray(make_prompts(_CachedTokenizer(m.tokenizer), L, B, code, prose)[0])
    lens = jnp.full((B,), L, jnp.int32)
    cap = int(-(-(L + a.new + 16) // 128) * 128)
    key = jax.random.key(0)
    records = []
    for name in a.methods.split(","):
        t0 = time.perf_counter()
        if name == "ar":
            logits, c0 = gen.prefill(params, cfg, tokens, lens, api.new_cache(m, batch=B, capacity=cap), impl=impl)
            box = [c0]

            def call(_):
                out, _, cache = gen.decode(params, cfg, GREEDY, box[0], logits, key, max_new_tokens=a.new,
                                           stop_tokens=(), impl=impl)
                box[0] = kv_cache.rollback(cache, lens)     # decode donates the cache: keep the next call's
                return out, np.full((B,), a.new - 1)

            def fresh():
                return None
        else:
            spec, drafter = spec_for(name, a), None
            if name == "longspec":
                d = api.load_drafter_for(m, a.drafter)
                spec, drafter = dataclasses.replace(spec, window=d.window), d.params

            def fresh():
                return engine.init(params, cfg, spec, tokens, lens, cap, impl=impl, drafter=drafter)

            def call(state):
                out, _, st, _ = engine.run_donating(params, cfg, spec, GREEDY, state, key, a.new, stop_tokens=(),
                                                    impl=impl, drafter=drafter)
                return out, np.asarray(st.rounds)
        runs = []
        for _ in range(a.reps + 1):          # the first call compiles
            st = fresh()
            jax.block_until_ready(st)
            t = time.perf_counter()
            out, rounds = call(st)
            jax.block_until_ready(out)
            runs.append(time.perf_counter() - t)
        best = min(runs[1:])
        n_rounds = int(np.max(rounds))
        rec = base_record(tag=a.tag, method=name, L=L, B=B, new_tokens=a.new, rounds=n_rounds,
                          loop_s=round(best, 4), round_ms=round(1e3 * best / n_rounds, 4),
                          tokens_per_s=round(B * (a.new - 1) / best, 1), setup_s=round(time.perf_counter() - t0, 1))
        if not a.no_trace:
            from bench.staged_hlo import _trace_table
            st = fresh()
            jax.block_until_ready(st)
            tab = _trace_table(lambda: jax.block_until_ready(call(st)))
            per = {k: [v[0] / n_rounds, v[1] / n_rounds] for k, v in tab.items()}
            kinds = {}
            for k, (us, n) in per.items():
                e = kinds.setdefault(kind(k), [0.0, 0.0])
                e[0] += us
                e[1] += n
            rec.update(device_us_per_round=round(sum(v[0] for v in per.values()), 1),
                       kernels_per_round=round(sum(v[1] for v in per.values()), 1),
                       by_kind={k: [round(v[0], 1), round(v[1], 1)]
                                for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0])},
                       top_kernels=[[k[:80], round(v[0], 1), round(v[1], 2)]
                                    for k, v in sorted(per.items(), key=lambda kv: -kv[1][0])[:a.top]])
        records.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k != "top_kernels"}), flush=True)
    write_json(a.out, records, {"tag": a.tag, "xla_flags": os.environ.get("XLA_FLAGS", ""),
                                "command": "bench/round_table.py " + " ".join(sys.argv[1:])})


if __name__ == "__main__":
    main()
