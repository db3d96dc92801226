"""Plain greedy decoding of the real SmolLM2-135M on one GPU, against Hugging Face's static cache.

    PYTHONPATH=. python bench/decode.py --out $OUT/ar_decode_h200.json [--impl xla,pallas] [--hf] [--quick]
                                        [--devices N]   # tensor parallel over N GPUs (jspec/sharding.py)

For each prompt length L and batch B: prefill (untimed), then one jitted while_loop decodes 128 tokens
(stop tokens ignored, like the Hugging Face anchor with min_new_tokens). tokens/s counts the B*(new-1)
tokens the loop produces (the first comes from prefill), as ../shared/anchors/hf_baseline.py does.
Roofline: bytes one step must read (weights + B * mean context * KV bytes per token) at 4.3 TB/s.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import HBM_BYTES_PER_S, base_record, peak_memory_bytes, timed, write_json  # noqa: E402
import jspec  # noqa: E402
from jspec import api, data, decoding as gen, model as jmodel  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.config import SamplingConfig  # noqa: E402


def roofline_tokens_per_s(cfg, weight_bytes, L, B, new):
    mean_ctx = L + new / 2
    step_bytes = weight_bytes + B * mean_ctx * cfg.kv_bytes_per_token()
    return B / (step_bytes / HBM_BYTES_PER_S), step_bytes


def run_jspec(m, prompts_np, L, B, new, impl, reps):
    cfg = m.cfg
    capacity = int(-(-(L + new) // 128) * 128)
    toks = jnp.asarray(prompts_np[:B])
    lens = jnp.full((B,), L, jnp.int32)
    samp = SamplingConfig()
    times, out = [], None
    impl = api.attn_impl(m, impl)   # with --devices N: the Pallas kernels run per head shard
    for r in range(reps + 1):   # first run compiles
        cache = api.new_cache(m, batch=B, capacity=capacity)   # sharded like the heads with --devices N
        logits, cache = gen.prefill(m.params, cfg, toks, lens, cache, impl=impl)
        jax.block_until_ready(logits)
        (out, n_out, _), dt = timed(gen.decode, m.params, cfg, samp, cache, logits, jax.random.key(0),
                                    max_new_tokens=new, stop_tokens=(), impl=impl)
        if r:
            times.append(dt)
    dt = float(np.median(times))
    return B * (new - 1) / dt, dt, np.asarray(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--impl", default="xla", help="comma list of attention backends: xla, pallas")
    ap.add_argument("--lengths", default="1024,4096,8000")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--hf", action="store_true", help="also run Hugging Face transformers (static cache)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--devices", type=int, default=1, help="tensor parallelism over the first N devices")
    a = ap.parse_args()
    if a.quick:
        a.lengths, a.batches, a.reps = "1024", "1,16", 1

    m = jspec.load(a.model, devices=a.devices)
    cfg = m.cfg
    wbytes = jmodel.param_bytes(m.params)
    Ls = [int(x) for x in a.lengths.split(",")]
    Bs = [int(x) for x in a.batches.split(",")]
    prompts = {L: np.asarray(data.long_prompts(m.tokenizer, L, max(Bs)), np.int32) for L in Ls}
    records, outs = [], {}
    for impl_name in a.impl.split(","):
        impl = AttnImpl(backend=impl_name)
        for L in Ls:
            for B in Bs:
                try:
                    tps, dt, out = run_jspec(m, prompts[L], L, B, a.new, impl, a.reps)
                except Exception as e:  # keep going: one failure must not lose the run
                    print(f"FAIL jspec {impl_name} L={L} B={B}: {e!r}"[:400], flush=True)
                    records.append(base_record(method="ar", impl=impl_name, L=L, B=B, error=repr(e)[:300]))
                    continue
                roof, step_bytes = roofline_tokens_per_s(cfg, wbytes, L, B, a.new)
                roof *= a.devices   # tensor parallel: each device reads its 1/N of the weights and the cache
                outs[(impl_name, L, B)] = out
                r = base_record(method="ar", impl=impl_name, model=a.model, devices=a.devices, L=L, B=B,
                                new_tokens=a.new,
                                tokens_per_s=round(tps, 1), decode_s=round(dt, 4),
                                roofline_tokens_per_s=round(roof, 1), roofline_frac=round(tps / roof, 4),
                                step_bytes=int(step_bytes), achieved_gbps=round(tps / B * step_bytes / 1e9, 1),
                                peak_memory_gb=round((peak_memory_bytes() or 0) / 1e9, 2))
                records.append(r)
                print(json.dumps(r), flush=True)
    # Greedy outputs of the backends must agree token for token (same model, same prompts).
    impls = a.impl.split(",")
    for L in Ls:
        for B in Bs:
            got = [outs.get((i, L, B)) for i in impls]
            if len(impls) > 1 and all(g is not None for g in got):
                same = float(np.mean([np.array_equal(got[0][b], g[b]) for g in got[1:] for b in range(B)]))
                print(f"L={L} B={B}: backends agree on {same:.0%} of sequences")
    if a.hf:
        np.savez("/tmp/jspec_prompts.npz", **{str(L): prompts[L] for L in Ls})
        hf_out = "/tmp/jspec_hf.json"
        cmd = [sys.executable, os.path.join(os.path.dirname(__file__), "hf_decode.py"), "--prompts",
               "/tmp/jspec_prompts.npz", "--model-dir", m.path, "--batches", a.batches, "--new", str(a.new),
               "--out", hf_out]
        try:
            subprocess.run(cmd, check=True, timeout=900)
            for h in json.load(open(hf_out)):
                records.append(base_record(method="hf_static", model=a.model, new_tokens=a.new, **h))
                print(json.dumps(records[-1]), flush=True)
        except Exception as e:
            print(f"FAIL hf: {e!r}", flush=True)
    summary = {}
    best = {}
    for r in records:
        if r.get("method") == "ar" and "tokens_per_s" in r:
            k = (r["L"], r["B"])
            if k not in best or r["tokens_per_s"] > best[k]["tokens_per_s"]:
                best[k] = r
    hf = {(r["L"], r["B"]): r for r in records if r.get("method") == "hf_static" and "tokens_per_s" in r}
    k = (8000, 64)
    if k in best:
        summary["roofline_frac_L8000_B64"] = best[k]["roofline_frac"]
        summary["best_impl_L8000_B64"] = best[k]["impl"]
        if k in hf:
            summary["speedup_vs_hf_L8000_B64"] = round(best[k]["tokens_per_s"] / hf[k]["tokens_per_s"], 2)
    write_json(a.out, records, summary)
    print("\n   impl     L    B   tok/s  roofline%   HF tok/s")
    for (L, B), r in sorted(best.items()):
        h = hf.get((L, B), {}).get("tokens_per_s", float("nan"))
        print(f"{r['impl']:>7} {L:5d} {B:4d} {r['tokens_per_s']:8.0f} {100 * r['roofline_frac']:8.1f}% {h:9.0f}")


if __name__ == "__main__":
    main()
