"""Time whole generation loops (ar and vegas) under the current XLA_FLAGS: one process per compiler setting.

    XLA_FLAGS=... PYTHONPATH=. python bench/flags_ab.py --out $OUT/flags_<tag>.json --tag <tag> [--shape 8000x64]

The programs compile in parallel threads (compile time is the point of comparing settings that trade GEMM
autotuning against compile time), then each loop runs --reps times from the same prefilled cache (best kept).
bench/spec_h200.sh runs it once per candidate setting and keeps the faster one for the benchmark.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import base_record, write_json  # noqa: E402
from bench.spec import GREEDY, _CachedTokenizer, _shape, make_prompts, prompt_sources  # noqa: E402
import jspec  # noqa: E402
from jspec import api, decoding as gen, kv_cache  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.speculative import SpecConfig, engine  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", default="")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--shape", default="8000x64")
    ap.add_argument("--new", type=int, default=65)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--corpus", default="/root/jspec-cache/corpus")
    ap.add_argument("--impl", default="pallas", choices=["pallas", "xla"], help="xla: CPU smoke test")
    ap.add_argument("--dense-rows", type=int, default=None,
                    help="AttnImpl.dense_rows: fused Pallas dense layers for steps of <= this many tokens (0: off)")
    ap.add_argument("--dense-tuned", default="", help='JSON {mode: [block_m, block_n, max_chunk, num_warps]} '
                    "overriding pallas_kernels.dense.TUNED")
    a = ap.parse_args()
    t0 = time.perf_counter()
    L, B = _shape(a.shape)
    impl = AttnImpl(backend=a.impl)
    if a.dense_rows is not None:
        impl = dataclasses.replace(impl, dense_rows=a.dense_rows)
    if a.dense_tuned:   # launch configs of pallas_kernels/dense.py for this run (a sweep in whole loops)
        from pallas_kernels import dense
        dense.TUNED.update({k: tuple(v) for k, v in json.loads(a.dense_tuned).items()})
    m = jspec.load(a.model, progress=False)
    cfg, params = m.cfg, m.params
    code, prose = prompt_sources(a.corpus)
    tokens = jnp.asarray(make_prompts(_CachedTokenizer(m.tokenizer), L, B, code, prose)[0])
    lens = jnp.full((B,), L, jnp.int32)
    cap = int(-(-(L + a.new + 8) // 128) * 128)
    spec = SpecConfig("vegas", gamma=4, budget=512)
    key = jax.random.key(0)
    cache_sds = jax.eval_shape(lambda: kv_cache.init(cfg, batch=B, capacity=cap))
    logit_sds = jax.ShapeDtypeStruct((B, cfg.vocab_size), jnp.float32)
    vec = jax.ShapeDtypeStruct((B,), jnp.int32)
    state_sds = jax.eval_shape(lambda p, c, lg, t: engine._prepare(p, cfg, spec, c, lg, t, impl),
                               params, cache_sds, logit_sds, vec)
    lowered = {
        "prefill": gen.prefill.lower(params, cfg, jax.ShapeDtypeStruct((B, L), jnp.int32), vec, cache_sds, impl=impl),
        "ar": gen.decode.lower(params, cfg, GREEDY, cache_sds, logit_sds, key, max_new_tokens=a.new, stop_tokens=(),
                               impl=impl),
        "prepare": engine.prepare.lower(params, cfg, spec, cache_sds, logit_sds, vec, impl=impl),
        "run": engine.run_donating.lower(params, cfg, spec, GREEDY, state_sds, key, a.new, stop_tokens=(), impl=impl),
    }
    t1 = time.perf_counter()
    with ThreadPoolExecutor(len(lowered)) as pool:
        c = dict(zip(lowered, pool.map(lambda lw: lw.compile(), lowered.values())))
    compile_s = time.perf_counter() - t1
    logits, cache = c["prefill"](params, tokens, lens, api.new_cache(m, batch=B, capacity=cap))
    best = {"ar": 1e9, "vegas": 1e9}
    tau = None
    for _ in range(a.reps):
        t = time.perf_counter()
        out, _, cache = c["ar"](params, cache, logits, key)
        out.block_until_ready()
        best["ar"] = min(best["ar"], time.perf_counter() - t)
        ar_tokens = np.asarray(out)
        cache = kv_cache.rollback(cache, lens)
        state = c["prepare"](params, cache, logits, tokens[:, -1])
        jax.block_until_ready(state)
        t = time.perf_counter()
        out, _, st, final = c["run"](params, state, key)
        out.block_until_ready()
        best["vegas"] = min(best["vegas"], time.perf_counter() - t)
        cache, tau = kv_cache.rollback(final.cache, lens), st.tau()
        vegas_tokens = np.asarray(out)
    n = min(ar_tokens.shape[1], vegas_tokens.shape[1])
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    np.save(os.path.splitext(a.out)[0] + "_ar_tokens.npy", ar_tokens)   # compare settings' greedy output
    rec = base_record(tag=a.tag, dense_rows=impl.dense_rows, dense_tuned=a.dense_tuned, L=L, B=B, new_tokens=a.new, compile_s=round(compile_s, 1),
                      ar_s=round(best["ar"], 4), vegas_s=round(best["vegas"], 4), vegas_tau=round(tau, 3),
                      vegas_equals_ar=float(np.mean(ar_tokens[:, :n] == vegas_tokens[:, :n])),
                      ar_tokens_per_s=round(B * (a.new - 1) / best["ar"], 1),
                      vegas_tokens_per_s=round(B * (a.new - 1) / best["vegas"], 1),
                      total_s=round(best["ar"] + best["vegas"], 4), wall_s=round(time.perf_counter() - t0, 1))
    print(json.dumps(rec), flush=True)
    write_json(a.out, [rec], {"tag": a.tag})


if __name__ == "__main__":
    main()
