"""Static batches vs continuous batching (jspec.speculative.serve) over one queue of long prompts.

    PYTHONPATH=. python bench/serve.py --out $OUT/serve_h200.json [--shape 8000x16 --queue 4 --new 256]
        [--methods ar,vegas,longspec] [--impl pallas] [--refill 1,4] [--staged 1,0] [--dense-rows 320]

A queue of Q*B prompts of L tokens (code and prose alternating, bench/spec.py's sources), greedy, --new tokens
each (stop tokens ignored, so every request is the same length and ar has no straggler). For every method:
  static  ceil(Q*B / B) static batches, each prefilled then decoded to the end (a speculative batch runs at
          its slowest row's pace: `straggler` = mean row tau / slowest row tau, averaged over the batches;
          `occupancy` = the rows' rounds / (B x the rounds the batches ran), as ServeStats.occupancy served);
  served  speculative methods also through `serve` with B slots: finished slots get the next prompts, `refill`
          at a time (prefilled together; one record per --refill and --staged value): mode `stagedK` prefills
          the next K ahead and refills on the device after every round, `servedK` waits for K free slots.
Times: decode (the loops) and prefill (prompts in; for `serve` also the per-slot inserts) separately, both
after a warm-up that compiles every program; tokens/s on decode time and on the total. Speedups are against
ar's static batches (plain decoding has no straggler to remove). Outputs are checked token-for-token
against ar's (bf16 near-ties aside: `agree_with_ar`).
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
from bench.spec import GREEDY, _CachedTokenizer, _shape, make_prompts, prompt_sources  # noqa: E402
import jspec  # noqa: E402
from jspec import api, decoding as gen, kv_cache  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.speculative import SpecConfig, engine, serve  # noqa: E402


def spec_for(name, a):
    """The SpecConfig a benchmark runs for method `name` from its --gamma / --budget / --widths flags."""
    if name == "longspec":
        return SpecConfig("longspec", tree_widths=tuple(int(w) for w in a.widths.split(",")), lookup=a.lookup)
    from bench.spec import method_spec   # vegas-pageN, vegas-sort
    return method_spec(name, gamma=a.gamma, budget=a.budget)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--shape", default="8000x16", help="LxB: prompt tokens x slots")
    ap.add_argument("--queue", type=int, default=4, help="prompts in the queue = queue * B")
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--methods", default="ar,vegas,longspec")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--widths", default="2,2,2,2,2", help="longspec tree widths")
    ap.add_argument("--lookup", type=int, default=0, help="longspec: a prompt-lookup chain of this many tokens")
    ap.add_argument("--impl", default="pallas", choices=["pallas", "xla", "auto"])
    ap.add_argument("--dense-rows", type=int, default=0,
                    help="AttnImpl.dense_rows: steps of up to this many rows on the row-independent dense kernels "
                         "(`jspec generate --exact`); 0 = cuBLAS")
    ap.add_argument("--refill", default="1", help="comma-separated: slots refilled together, one served run each")
    ap.add_argument("--staged", default="0", help="comma-separated 1/0: serve(staged=...), one served run each")
    ap.add_argument("--serve-ar", action="store_true",
                    help="also serve ar (SpecConfig('ar'): one target step per round) through the same slots")
    ap.add_argument("--corpus", default="/root/jspec-cache/corpus")
    a = ap.parse_args()
    t_start = time.perf_counter()
    L, B = _shape(a.shape)
    impl = {"xla": AttnImpl(backend="xla"), "pallas": AttnImpl(backend="pallas"), "auto": AttnImpl()}[a.impl]
    impl = dataclasses.replace(impl, dense_rows=a.dense_rows)
    m = jspec.load(a.model, dtype="float32" if jax.default_backend() == "cpu" else None)
    cfg, params = m.cfg, m.params
    code, prose = prompt_sources(a.corpus)
    N = a.queue * B
    prompts, sources = make_prompts(_CachedTokenizer(m.tokenizer), L, N, code, prose)
    methods = a.methods.split(",")
    cap = int(-(-(L + a.new + 16) // 128) * 128)
    key = jax.random.key(0)
    lens = jnp.full((B,), L, jnp.int32)
    records, outputs = [], {}

    def batches():
        for i in range(0, N, B):
            yield jnp.asarray(prompts[i:i + B])

    for name in methods:
        spec = None if name == "ar" else spec_for(name, a)
        drafter = None
        if name == "longspec":
            d = api.load_drafter_for(m, None)
            spec, drafter = dataclasses.replace(spec, window=d.window), d.params

        def static_batch(tokens):
            """(prefill s, decode s, tokens [B, new], per-row tau or None, per-row rounds or None)"""
            t = time.perf_counter()
            if spec is None:
                logits, cache = gen.prefill(params, cfg, tokens, lens, api.new_cache(m, batch=B, capacity=cap),
                                            impl=impl)
                jax.block_until_ready(cache)
                t1 = time.perf_counter()
                out, _, _ = gen.decode(params, cfg, GREEDY, cache, logits, key, max_new_tokens=a.new, impl=impl)
                out = np.asarray(out)
                return t1 - t, time.perf_counter() - t1, out, None, None
            state = engine.init(params, cfg, spec, tokens, lens, cap, impl=impl, drafter=drafter)
            jax.block_until_ready(state)
            t1 = time.perf_counter()
            out, _, st, _ = engine.run_donating(params, cfg, spec, GREEDY, state, key, a.new, impl=impl,
                                                drafter=drafter)
            out = np.asarray(out)
            return t1 - t, time.perf_counter() - t1, out, st.tau_per_sequence(), np.asarray(st.rounds)

        static_batch(next(batches()))                      # compile
        pre = dec = 0.0
        outs, taus, straggler, used, iters = [], [], [], 0, 0
        for tokens in batches():
            p, d, out, tau, rnd = static_batch(tokens)
            pre, dec = pre + p, dec + d
            outs.append(out)
            if tau is not None:
                taus.extend(tau.tolist())
                straggler.append(float(np.mean(tau) / np.min(tau)))
                used, iters = used + int(rnd.sum()), iters + int(rnd.max())   # the batch runs max(rounds)
        outputs[(name, "static")] = np.concatenate(outs)
        new_tokens = N * a.new
        rec = base_record(method=name, mode="static", L=L, B=B, queue=N, new_tokens=a.new, impl=a.impl,
                          dense_rows=a.dense_rows,
                          decode_s=round(dec, 3), prefill_s=round(pre, 3),
                          decode_tokens_per_s=round(new_tokens / dec, 1),
                          total_tokens_per_s=round(new_tokens / (dec + pre), 1),
                          tau=round(float(np.mean(taus)), 3) if taus else 1.0,
                          straggler=round(float(np.mean(straggler)), 3) if straggler else 1.0,
                          occupancy=round(used / (B * iters), 3) if iters else 1.0,
                          spec=dataclasses.asdict(spec) if spec else None)
        records.append(rec)
        print(json.dumps(rec), flush=True)
        if spec is None and not a.serve_ar:
            continue
        if spec is None:
            spec = SpecConfig("ar")
        for refill, staged in ((int(r), bool(int(g))) for r in a.refill.split(",") for g in a.staged.split(",")):
            kw = dict(batch=B, capacity=cap, max_new_tokens=a.new, impl=impl, drafter=drafter, refill=refill,
                      staged=staged)
            serve(params, cfg, spec, GREEDY, list(prompts[:B + refill]), **kw)   # compile (one refill)
            outs, st = serve(params, cfg, spec, GREEDY, list(prompts), **kw)
            mode = f"{'staged' if staged else 'served'}{refill}"
            outputs[(name, mode)] = np.stack(outs)
            rec = base_record(method=name, mode=mode, refill=refill, staged=staged, L=L, B=B, queue=N,
                              new_tokens=a.new, impl=a.impl, dense_rows=a.dense_rows,
                              decode_s=round(st.decode_s, 3), prefill_s=round(st.prefill_s, 3), segments=st.segments,
                              iterations=st.iterations, occupancy=round(st.occupancy, 3),
                              decode_tokens_per_s=round(st.new_tokens / st.decode_s, 1),
                              total_tokens_per_s=round(st.tokens_per_s, 1), tau=round(st.tau, 3),
                              spec=dataclasses.asdict(spec))
            records.append(rec)
            print(json.dumps(rec), flush=True)

    ar = next((r for r in records if r["method"] == "ar"), None)
    for r in records:
        ref = outputs.get(("ar", "static"))
        mine = outputs[(r["method"], r["mode"])]
        if ref is not None:
            r["agree_with_ar"] = round(float(np.mean(mine == ref)), 4)
        if ar is not None:
            r["decode_speedup_vs_ar"] = round(r["decode_tokens_per_s"] / ar["decode_tokens_per_s"], 3)
            r["total_speedup_vs_ar"] = round(r["total_tokens_per_s"] / ar["total_tokens_per_s"], 3)
    summary = {f'{r["method"]}_{r["mode"]}_decode_speedup_vs_ar': r.get("decode_speedup_vs_ar") for r in records}
    summary.update(command="python bench/serve.py " + " ".join(sys.argv[1:]), sources=sources[:8],
                   wall_s=round(time.perf_counter() - t_start, 1))
    write_json(a.out, records, summary)
    for r in records:
        print(f'{r["method"]:>9} {r["mode"]:>8}: decode {r["decode_tokens_per_s"]:>9.1f} tok/s '
              f'(x{r.get("decode_speedup_vs_ar", 1):.2f}), total {r["total_tokens_per_s"]:>9.1f} '
              f'(x{r.get("total_speedup_vs_ar", 1):.2f}), tau {r["tau"]:.2f}, agree {r.get("agree_with_ar")}')


if __name__ == "__main__":
    main()
