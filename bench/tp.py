"""How does decoding scale over the GPUs of one host? Tensor-parallel ar and vegas on 1, 2 and 4 GPUs, a
Llama-3-8B-shaped model with random weights.

    PYTHONPATH=. python bench/tp.py --out bench/results/tp_h200.json [--devices 1,2,4] [--impl auto]
    # compile only: XLA's per-device memory analysis of ar / vegas programs + their optimized HLO (.txt.gz)
    PYTHONPATH=. python bench/tp.py --memory-report --devices 1,2 --out $OUT/tpmem/tp_memory.json
    # end to end on CPU (tiny config, 4 virtual devices):
    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu PYTHONPATH=. \\
        python bench/tp.py --tiny --out /tmp/tp_cpu.json

For each device count n (those this host has): params and cache are created directly in their sharded
layout (jspec/sharding.py: heads on tp, Megatron MLP, K/V heads of the cache on tp), the B prompts of L
random tokens are prefilled in chunks (untimed), then

    ar     plain greedy decoding: the speculative engine without drafts (SpecConfig("ar")), `--new` tokens
           (stop tokens ignored);
    vegas  self-speculative decoding;

both through jspec.speculative: prepare from the same prefill (untimed), then run_donating (timed, one
while_loop). Each is compiled and warmed up once, then timed `--reps` times from the same prefilled cache
(rolled back to L: only the lengths move). tokens/s counts the B * (new - 1) tokens the loop produces (the
first comes from the prefill logits), as `jspec bench` does. The roofline is the bytes one step must read
(weights + B * mean context * KV bytes per token), spread over n GPUs at bench.common.HBM_BYTES_PER_S each. Random
weights: vegas' acceptance (tau) is not that of a trained model; its tokens/s at a given tau is what this
measures.
"""
from __future__ import annotations

import os

# Before jax (and NCCL) load: NVLink SHARP / multicast paths are not available on the lent machines.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import HBM_BYTES_PER_S, base_record, write_json  # noqa: E402
from jspec import prefill as gen  # noqa: E402
from jspec import kv_cache, model, sharding, speculative  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.config import ModelConfig, SamplingConfig, preset  # noqa: E402
from jspec.speculative import SpecConfig  # noqa: E402

TINY = ModelConfig(arch="llama", vocab_size=512, d_model=256, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=64,
                   ffn_dim=512, rope_theta=500000.0, max_position=4096, dtype="bfloat16")
GREEDY = SamplingConfig()


def peak_memory_gb(devices) -> float | None:
    """Largest peak over the devices of the mesh (None where the backend keeps no statistics, e.g. CPU)."""
    try:
        return round(max(int(d.memory_stats()["peak_bytes_in_use"]) for d in devices) / 1e9, 2)
    except Exception:
        return None


def roofline(cfg, weight_bytes, L, B, new, n):
    """Aggregate tokens/s if every GPU streamed its 1/n of one step's bytes at the HBM ceiling."""
    step_bytes = weight_bytes + B * (L + new / 2) * cfg.kv_bytes_per_token()
    return B / (step_bytes / (n * HBM_BYTES_PER_S)), step_bytes


def prefill(params, cfg, tokens, cache, chunk, impl):
    """Write [B, L] prompts chunk by chunk (bounded activations at 32K x B=16); logits of the last token."""
    B, L = tokens.shape
    logits = None
    for s in range(0, L, chunk):
        part = jnp.asarray(tokens[:, s:s + chunk])
        logits, cache = gen.prefill(params, cfg, part, jnp.full((B,), part.shape[1], jnp.int32), cache, impl=impl)
    return logits, cache


def rewind(cache, L, mesh):
    """The prefilled cache again: lengths back to L (a fresh replicated buffer: the old one was donated)."""
    B = cache.batch
    return cache.replace(lengths=jax.device_put(np.full((B,), L, np.int32), NamedSharding(mesh, P())))


def timed_runs(params, cfg, spec, cache, logits, last, L, mesh, a, impl):
    """Greedy `spec` from the prefilled cache, `a.reps` timed runs after one that compiles.
    Returns (tokens, n_out, SpecStats, median seconds of run_donating, the cache)."""
    times = []
    for r in range(a.reps + 1):
        cache = rewind(cache, L, mesh)
        state = speculative.prepare(params, cfg, spec, cache, logits, last, impl=impl)
        t = time.perf_counter()
        out, n_out, stats, final = speculative.run_donating(params, cfg, spec, GREEDY, state, jax.random.key(0),
                                                            a.new, stop_tokens=(), impl=impl)
        out = np.asarray(jax.block_until_ready(out))
        cache = final.cache
        if r:
            times.append(time.perf_counter() - t)
    return out, n_out, stats, float(np.median(times)), cache


def run_devices(a, cfg, n, prompts, records, outs):
    mesh = sharding.make_mesh(n, cfg=cfg)
    devs = list(mesh.devices.flat)
    impl = AttnImpl(backend=None if a.impl == "auto" else a.impl, interpret=a.interpret, mesh=mesh)
    spec = SpecConfig(method="vegas", gamma=a.gamma, budget=a.budget)
    B, L = prompts.shape
    capacity = -(-(L + a.new + spec.capacity_margin()) // 128) * 128
    common = dict(model=a.model_name, dtype=cfg.dtype, devices=n, impl=a.impl, L=L, B=B, new_tokens=a.new)

    t0 = time.perf_counter()
    params = model.init_params(cfg, jax.random.key(0), mesh=mesh)
    wbytes = model.param_bytes(params)
    cache = sharding.init_cache(cfg, mesh, batch=B, capacity=capacity)
    logits, cache = prefill(params, cfg, prompts, cache, a.prefill_chunk, impl)
    jax.block_until_ready(logits)
    prefill_s = time.perf_counter() - t0
    roof, step_bytes = roofline(cfg, wbytes, L, B, a.new, n)
    print(f"[{n} device(s)] params + prefill of {B}x{L} in {prefill_s:.1f}s (incl. compile)", flush=True)
    last = jnp.asarray(prompts[:, -1])

    # ---- ar: plain greedy decoding
    try:
        out, _, _, dt, cache = timed_runs(params, cfg, SpecConfig("ar"), cache, logits, last, L, mesh, a, impl)
        tps = B * (a.new - 1) / dt
        outs[("ar", n)] = out
        rec = base_record(method="ar", **common, tokens_per_s=round(tps, 1), decode_s=round(dt, 4),
                          step_ms=round(1e3 * dt / (a.new - 1), 3), prefill_s=round(prefill_s, 2),
                          roofline_tokens_per_s=round(roof, 1), roofline_frac=round(tps / roof, 4),
                          step_bytes=int(step_bytes), achieved_gbps_per_device=round(tps / B * step_bytes / n / 1e9, 1),
                          cache_spec=str(cache.k.sharding.spec), peak_memory_gb=peak_memory_gb(devs))
    except Exception as e:  # keep going: one failure must not lose the run
        rec = base_record(method="ar", **common, error=repr(e)[:400])
    records.append(rec)
    print(json.dumps(rec), flush=True)

    # ---- vegas: self-speculative decoding from the same prefill
    try:
        out, n_out, stats, dt, cache = timed_runs(params, cfg, spec, cache, logits, last, L, mesh, a, impl)
        tps = float(np.sum(np.asarray(n_out) - 1)) / dt
        outs[("vegas", n)] = out
        ar = outs.get(("ar", n))
        rec = base_record(method="vegas", **common, tokens_per_s=round(tps, 1), decode_s=round(dt, 4),
                          tau=round(stats.tau(), 3), accept_hist=np.asarray(stats.accept_hist).sum(0).tolist(),
                          rounds_mean=float(np.mean(np.asarray(stats.rounds))), knobs=spec.describe(),
                          matches_ar=None if ar is None else bool(np.array_equal(ar, out)),
                          cache_spec=str(cache.k.sharding.spec), peak_memory_gb=peak_memory_gb(devs),
                          note="random weights: tau is not a trained model's")
    except Exception as e:
        rec = base_record(method="vegas", **common, error=repr(e)[:400])
    records.append(rec)
    print(json.dumps(rec), flush=True)
    del params, cache, logits
    gc.collect()


def memory_report(a, cfg, n, out_dir):
    """Compile (no run) ar's run_donating and vegas' prepare and run_donating for n devices at the benchmark's
    shapes and report XLA's memory analysis per device, plus the ops of the optimized HLO that produce a
    whole-cache-shaped array (copies of the cache are what makes vegas need twice the cache's memory); the HLO
    goes to out_dir."""
    import gzip
    import re
    mesh = sharding.make_mesh(n, cfg=cfg)
    impl = AttnImpl(backend=None if a.impl == "auto" else a.impl, interpret=a.interpret, mesh=mesh)
    spec = SpecConfig(method="vegas", gamma=a.gamma, budget=a.budget)
    capacity = -(-(a.L + a.new + spec.capacity_margin()) // 128) * 128
    params = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0), mesh=mesh))
    params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params,
                          sharding.param_shardings(cfg, mesh))
    cache = jax.eval_shape(lambda: kv_cache.init(cfg, batch=a.B, capacity=capacity))
    cache = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), cache,
                         sharding.cache_sharding(mesh))
    rep = NamedSharding(mesh, P())
    logits = jax.ShapeDtypeStruct((a.B, cfg.vocab_size), jnp.float32, sharding=rep)
    last = jax.ShapeDtypeStruct((a.B,), jnp.int32, sharding=rep)
    key = jax.random.key(0)
    cache_shape = f"[{cfg.n_layers},{a.B},{capacity},{cfg.n_kv_heads // n},{cfg.head_dim}]"
    cache_bytes = 2 * cfg.n_layers * a.B * capacity * cfg.n_kv_heads * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize

    def run_program(sp):
        state = jax.eval_shape(lambda p, c, lg, t: speculative.prepare(p, cfg, sp, c, lg, t, impl=impl),
                               params, cache, logits, last)
        return lambda: speculative.run_donating.lower(params, cfg, sp, GREEDY, state, key, a.new, stop_tokens=(),
                                                      impl=impl)

    progs = {"ar_run_donating": run_program(SpecConfig("ar")),
             "vegas_prepare": lambda: speculative.prepare.lower(params, cfg, spec, cache, logits, last, impl=impl),
             "vegas_run_donating": run_program(spec)}
    rows = []
    os.makedirs(out_dir, exist_ok=True)
    for name, lower in progs.items():
        t0 = time.perf_counter()
        try:
            c = lower().compile()
            ma = c.memory_analysis()
            txt = c.as_text()
            with gzip.open(os.path.join(out_dir, f"hlo_{name}_{n}dev.txt.gz"), "wt") as f:
                f.write(txt)
            inst = re.compile(r"^\s*(?:ROOT\s+)?%\S+ = (\S+(?: \S+)*?) ([a-z][\w-]*)\(")
            ops, big = {}, []
            for ln in txt.splitlines():
                m = inst.match(ln)
                if m and cache_shape in m.group(1) and m.group(2) not in ("parameter", "get-tuple-element", "tuple",
                                                                          "bitcast"):
                    ops[m.group(2)] = ops.get(m.group(2), 0) + 1
                    big.append(ln.strip()[:220])
            r = dict(program=name, devices=n, compile_s=round(time.perf_counter() - t0, 1),
                     temp_gb=round(ma.temp_size_in_bytes / 1e9, 2), argument_gb=round(ma.argument_size_in_bytes / 1e9, 2),
                     output_gb=round(ma.output_size_in_bytes / 1e9, 2), alias_gb=round(ma.alias_size_in_bytes / 1e9, 2),
                     cache_gb_per_device=round(cache_bytes / n / 1e9, 2), cache_shaped_ops=ops, cache_shaped_lines=big[:12])
        except Exception as e:
            r = dict(program=name, devices=n, error=repr(e)[:400])
        print(json.dumps(r), flush=True)
        rows.append(r)
    return rows


def summarize(records, outs, device_counts):
    summary = {}
    for method in ("ar", "vegas"):
        ok = {r["devices"]: r for r in records if r["method"] == method and "tokens_per_s" in r}
        if not ok:
            errs = [r.get("error") or r.get("skipped") for r in records if r["method"] == method]
            summary[method] = errs[0] if errs else "not run"
            continue
        base = ok.get(1)
        summary[method] = {
            f"tokens_per_s_{n}gpu": ok[n]["tokens_per_s"] for n in sorted(ok)}
        if base:
            summary[method].update({f"speedup_{n}gpu": round(ok[n]["tokens_per_s"] / base["tokens_per_s"], 3)
                                    for n in sorted(ok) if n > 1})
            summary[method].update({f"efficiency_{n}gpu": round(ok[n]["tokens_per_s"] / base["tokens_per_s"] / n, 3)
                                    for n in sorted(ok) if n > 1})
        # Greedy tokens across device counts (the f32 all-reduce of wo / w_down keeps them identical in tests).
        ref = outs.get((method, min(ok)))
        summary[method]["same_tokens_as_fewest_devices"] = {
            n: float(np.mean(np.all(outs[(method, n)] == ref, axis=1))) for n in sorted(ok) if (method, n) in outs}
    if any(r["method"] == "vegas" and "tokens_per_s" in r for r in records):
        ar = {r["devices"]: r["tokens_per_s"] for r in records if r["method"] == "ar" and "tokens_per_s" in r}
        summary["vegas_over_ar"] = {f"{r['devices']}gpu": round(r["tokens_per_s"] / ar[r["devices"]], 3)
                                    for r in records if r["method"] == "vegas" and "tokens_per_s" in r
                                    and r["devices"] in ar}
    summary["devices_available"] = jax.device_count()
    summary["devices_asked"] = device_counts
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/tp_h200.json")
    ap.add_argument("--devices", default="1,2,4", help="comma list of tensor-parallel degrees")
    ap.add_argument("--model", default="llama-3.1-8b", help="preset name (random weights)")
    ap.add_argument("--tiny", action="store_true", help="tiny config and shapes (CPU end-to-end check)")
    ap.add_argument("--L", type=int, default=32768, help="prompt length")
    ap.add_argument("--B", type=int, default=16, help="batch")
    ap.add_argument("--new", type=int, default=128, help="new tokens per sequence")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--prefill-chunk", type=int, default=4096)
    ap.add_argument("--impl", default="auto", choices=("auto", "pallas", "xla"))
    ap.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU)")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget", type=int, default=2048, help="vegas KV slots per draft step")
    ap.add_argument("--memory-report", action="store_true",
                    help="compile only: XLA's per-device memory analysis of ar and vegas (+ optimized HLO) to --out")
    a = ap.parse_args()
    if a.tiny:
        cfg, a.model_name = TINY, "tiny"
        a.L, a.B, a.new, a.reps, a.prefill_chunk, a.budget = (min(a.L, 256), min(a.B, 4), min(a.new, 16), 1,
                                                                min(a.prefill_chunk, 128), min(a.budget, 64))
    else:
        cfg, a.model_name = preset(a.model), f"{a.model} (random weights)"
    asked = [int(x) for x in a.devices.split(",")]
    if a.memory_report:
        out_dir = os.path.dirname(os.path.abspath(a.out))
        rows = [r for n in asked if n <= jax.device_count() for r in memory_report(a, cfg, n, out_dir)]
        write_json(a.out, rows, {"kind": "memory_report"}, config=cfg.to_dict(), args=vars(a))
        return
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (a.B, a.L)).astype(np.int32)
    records, outs = [], {}
    for n in asked:
        if n > jax.device_count():
            records.append(base_record(method="ar", devices=n, L=a.L, B=a.B,
                                       skipped=f"only {jax.device_count()} device(s)"))
            print(f"skip {n} devices: only {jax.device_count()}", flush=True)
        else:
            try:
                run_devices(a, cfg, n, prompts, records, outs)
            except Exception as e:   # setup (params, cache, prefill) failed, e.g. out of memory
                records.append(base_record(method="ar", devices=n, L=a.L, B=a.B, error=repr(e)[:400]))
                print(f"FAIL {n} devices: {e!r}"[:600], flush=True)
        # Written after every device count so a run cut short keeps what it measured.
        write_json(a.out, records, summarize(records, outs, asked), config=cfg.to_dict(), args=vars(a))
    print(json.dumps(summarize(records, outs, asked), indent=1))


if __name__ == "__main__":
    main()
