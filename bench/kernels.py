"""How fast are the Pallas attention kernels on one GPU, against cuDNN and XLA? (docs/kernels.md, docs/performance.md)

    PYTHONPATH=. python bench/kernels.py --out bench/results/kernels_h200.json [--quick] [--reps 5] [--time-budget S]
    python bench/plot_kernels.py bench/results/kernels_h200.json

Shapes: SmolLM2-135M (N=9, K=3, H=64) and Llama-3-8B (N=32, K=8, H=128) attention layers, bf16 caches
of S in {8K, 32K, 128K} positions, all valid (kv_len = S), batch B in {1, 16}.
  flash_scores   decode (T=1) and verify (T=5), with and without score_rows=(0, T-1) (weights), against
                 cuDNN (jax.nn.dot_product_attention, kv lengths only) and (T=5) the XLA f32 reference.
  sparse         T=5 + causal tail over budgets of 1%, 5%, 10% of S: GB/s on the gathered bytes and the
                 speedup over full flash attention (T=5, no scores) at the same S.
  tree           n in {16, 64, 128} tree tokens after a 32K-n prefix vs dense masked attention (the XLA
                 f32 reference with the explicit full mask; also jax.nn.dot_product_attention(xla) in bf16).
Every timing: jit compiled (AOT) outside the timed region, 2 warm-up calls, then the median over `reps`
samples of back-to-back calls (enough per sample to last >= 5 ms, so launch overhead is amortised as
it is in a real decode step). Each measurement is guarded: a failure becomes a record with "error".
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import HBM_BYTES_PER_S, base_record, write_json  # noqa: E402
import pallas_kernels as pk  # noqa: E402

MODELS = {"smollm2-135m": (9, 3, 64), "llama-3-8b": (32, 8, 128)}  # N, K, H
DTYPE = jnp.bfloat16
MEM_LIMIT = 60e9
SUMMARY_MODEL = "llama-3-8b"


def _log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def time_fn(fn, args, reps: int) -> float:
    """Median seconds per call of fn(*args), compiled outside the timing."""
    compiled = jax.jit(fn).lower(*args).compile()
    for _ in range(2):
        jax.block_until_ready(compiled(*args))
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    one = max(time.perf_counter() - t, 1e-6)
    inner = int(min(200, max(1, math.ceil(5e-3 / one))))
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            out = compiled(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t) / inner)
    return float(np.median(samples))


class Runner:
    def __init__(self, reps: int, time_budget_s: float):
        self.reps = reps
        self.deadline = time.time() + time_budget_s
        self.records: list[dict] = []

    def measure(self, kernel: str, fn, args, *, bytes_moved: float, mem: float, **fields) -> dict:
        rec = base_record(kernel=kernel, dtype=jnp.dtype(DTYPE).name, **fields)
        if mem > MEM_LIMIT:
            rec["skipped"] = f"needs ~{mem / 1e9:.0f} GB > {MEM_LIMIT / 1e9:.0f} GB"
        elif time.time() > self.deadline:
            rec["skipped"] = "time budget exhausted"
        else:
            try:
                sec = time_fn(fn, args, self.reps)
                rec.update(time_ms=round(sec * 1e3, 4), gbps=round(bytes_moved / sec / 1e9, 1),
                           bytes=int(bytes_moved), hbm_frac=round(bytes_moved / sec / HBM_BYTES_PER_S, 3))
            except Exception as e:  # one failure must not end the run
                rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                traceback.print_exc(limit=2)
        _log(f"{kernel:28s} {_fields(fields)} -> "
             + (f"{rec['time_ms']:.4f} ms {rec['gbps']:.0f} GB/s" if "time_ms" in rec
                else rec.get("error", rec.get("skipped", ""))[:160]))
        self.records.append(rec)
        return rec


def _fields(f):
    return " ".join(f"{k}={v}" for k, v in f.items() if k in ("model", "B", "S", "T", "n", "budget"))


def _cache(key, B, S, K, H):
    """Random bf16 k, v [B,S,K,H], drawn one sequence at a time (keeps each draw far below 2^31 elements)."""
    draw = jax.jit(jax.vmap(lambda kk: jax.random.normal(kk, (S, K, H), DTYPE)))
    kk, kv = jax.random.split(key)
    return draw(jax.random.split(kk, B)), draw(jax.random.split(kv, B))


def bench_flash_and_sparse(run: Runner, model, B, S, budgets, Ts, with_baselines: bool):
    N, K, H = MODELS[model]
    kv_bytes = 2 * B * S * K * H * 2
    if kv_bytes * 1.2 > MEM_LIMIT:
        _log(f"skip {model} B={B} S={S}: cache alone needs {kv_bytes / 1e9:.0f} GB")
        return
    k, v = _cache(jax.random.key(S + B), B, S, K, H)
    kv_len = jnp.full((B,), S, jnp.int32)
    shape = dict(model=model, B=B, S=S, N=N, K=K, H=H)
    flash_t = {}
    for T in Ts:
        q = jax.random.normal(jax.random.key(T), (B, T, N, H), DTYPE)
        qo_bytes = 2 * B * T * N * H * 2
        rows = (0, T - 1)
        base = run.measure("flash_scores", lambda q, k, v, l: pk.flash_scores_kernel(q, k, v, l)[:2],
                           (q, k, v, kv_len), bytes_moved=kv_bytes + qo_bytes, mem=kv_bytes, T=T, **shape)
        flash_t[T] = base.get("time_ms")
        with_scores = lambda q, k, v, l: pk.flash_scores_kernel(q, k, v, l, score_rows=rows)  # noqa: E731
        rec = run.measure("flash_scores+scores", with_scores, (q, k, v, kv_len), bytes_moved=kv_bytes + qo_bytes,
                          mem=kv_bytes * 1.1, T=T, score_rows=list(rows), score_mode="weights", **shape)
        if "time_ms" in rec and base.get("time_ms"):
            rec["overhead_vs_no_scores"] = round(rec["time_ms"] / base["time_ms"], 4)
        if with_baselines:
            cudnn = lambda q, k, v, l: jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=l,
                                                                    implementation="cudnn")
            run.measure("cudnn", cudnn, (q, k, v, kv_len), bytes_moved=kv_bytes + qo_bytes, mem=kv_bytes * 1.1,
                        T=T, mask="kv_len only (no causal part)", **shape)
        if with_baselines and T > 1:  # the f32 reference only at verification (T=5): slow, one is enough
            ref_mem = kv_bytes * 5 + 3 * B * N * T * S * 4
            run.measure("xla_reference", lambda q, k, v, l: pk.flash_scores_reference(q, k, v, l)[:2],
                        (q, k, v, kv_len), bytes_moved=kv_bytes + qo_bytes, mem=ref_mem, T=T, **shape)
    # Sparse: T=5 plus the causal tail over `budget` of S, random distinct positions (sorted, as a top-k
    # selection returns them after sorting; order does not change the bytes moved).
    T = 5
    q = jax.random.normal(jax.random.key(T), (B, T, N, H), DTYPE)
    rng = np.random.default_rng(0)
    for budget in budgets:
        M = max(1, int(budget * S))
        idx = np.stack([np.sort(rng.choice(S - T, size=M, replace=False)) for _ in range(B)]).astype(np.int32)
        idx, n_valid = jnp.asarray(idx), jnp.full((B,), M, jnp.int32)
        gathered = 2 * B * (M + T) * K * H * 2 + 2 * B * T * N * H * 2
        rec = run.measure("sparse_attention", lambda q, k, v, i, nv, l: pk.sparse_attention_kernel(q, k, v, i, nv, l),
                          (q, k, v, idx, n_valid, kv_len), bytes_moved=gathered, mem=kv_bytes * 1.1, T=T,
                          budget=budget, M=M, **shape)
        if "time_ms" in rec and flash_t.get(T):
            rec["speedup_vs_flash"] = round(flash_t[T] / rec["time_ms"], 3)
    del k, v


def _tree_mask(rng, B, n):
    mask = np.zeros((B, n, n), bool)
    for b in range(B):
        parent = [-1] + [int(rng.integers(max(0, i - 4), i)) for i in range(1, n)]  # bushy, depth ~n/2
        for i in range(n):
            j = i
            while j >= 0:
                mask[b, i, j] = True
                j = parent[j]
    return jnp.asarray(mask)


def bench_tree(run: Runner, model, B, S, ns):
    N, K, H = MODELS[model]
    kv_bytes = 2 * B * S * K * H * 2
    k, v = _cache(jax.random.key(7 + B), B, S, K, H)
    rng = np.random.default_rng(1)
    shape = dict(model=model, B=B, S=S, N=N, K=K, H=H)
    for n in ns:
        q = jax.random.normal(jax.random.key(n), (B, n, N, H), DTYPE)
        prefix_len = jnp.full((B,), S - n, jnp.int32)
        tree_mask = _tree_mask(rng, B, n)
        moved = kv_bytes + 2 * B * n * N * H * 2
        tree = run.measure("tree_attention", lambda q, k, v, p, m: pk.tree_attention_kernel(q, k, v, p, m),
                           (q, k, v, prefix_len, tree_mask), bytes_moved=moved, mem=kv_bytes * 1.2, n=n, **shape)
        full_mask = pk.tree_full_mask(prefix_len, tree_mask, S)  # built outside the timing
        dense_mem = kv_bytes * 5 + 3 * B * N * n * S * 4 + B * n * S
        dense = run.measure("dense_masked_reference", lambda q, k, v, m: pk.masked_attention_reference(q, k, v, m),
                            (q, k, v, full_mask), bytes_moved=moved, mem=dense_mem, n=n, **shape)
        if tree.get("time_ms") and dense.get("time_ms"):
            tree["speedup_vs_dense"] = round(dense["time_ms"] / tree["time_ms"], 3)
        # A stronger dense baseline than the f32 reference: XLA's own bf16 attention with the same mask.
        xla = lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m[:, None], implementation="xla")
        dense_bf16 = run.measure("dense_masked_xla_bf16", xla, (q, k, v, full_mask), bytes_moved=moved,
                                 mem=kv_bytes + 3 * B * N * n * S * 4 + B * n * S, n=n, **shape)
        if tree.get("time_ms") and dense_bf16.get("time_ms"):
            tree["speedup_vs_dense_xla_bf16"] = round(dense_bf16["time_ms"] / tree["time_ms"], 3)
        del full_mask
    del k, v


def hbm_copy_gbps(reps) -> float | None:
    """Measured device copy bandwidth (read + write of a 4 GB buffer)."""
    try:
        x = jnp.ones((1 << 31,), jnp.bfloat16)
        sec = time_fn(lambda x: x * 2, (x,), reps)
        return round(2 * x.size * 2 / sec / 1e9, 1)
    except Exception as e:
        _log(f"copy bandwidth failed: {e}")
        return None


def _find(records, **want):
    for r in records:
        if all(r.get(k) == v for k, v in want.items()) and "time_ms" in r:
            return r
    return None


def summarize(records, copy_gbps):
    s = {"hbm_copy_gbps_measured": copy_gbps, "hbm_reference_gbps": HBM_BYTES_PER_S / 1e9}
    for B in (16, 1):  # flash_scores overhead: Vegas verification shape
        shape = dict(model=SUMMARY_MODEL, B=B, S=32768, T=5)
        a, b = _find(records, kernel="flash_scores+scores", **shape), _find(records, kernel="flash_scores", **shape)
        if a and b:
            s["flash_scores_overhead"] = round(a["time_ms"] / b["time_ms"], 4)
            s["flash_scores_overhead_at"] = dict(shape, score_rows=[0, 4], score_mode="weights")
            break
    for B in (16, 1):
        r = _find(records, kernel="sparse_attention", model=SUMMARY_MODEL, B=B, S=131072, budget=0.05)
        if r:
            s["sparse_attention_bw_frac"] = round(r["gbps"] * 1e9 / HBM_BYTES_PER_S, 4)
            s["sparse_attention_bw_frac_at"] = dict(model=SUMMARY_MODEL, B=B, S=131072, budget=0.05, T=5)
            s["sparse_attention_speedup_vs_flash"] = r.get("speedup_vs_flash")
            break
    for B in (1, 16):
        r = _find(records, kernel="tree_attention", model=SUMMARY_MODEL, B=B, S=32768, n=64)
        if r and r.get("speedup_vs_dense"):
            key = "tree_attention_speedup" if "tree_attention_speedup" not in s else f"tree_attention_speedup_b{B}"
            s[key] = r["speedup_vs_dense"]
            s[key + "_at"] = dict(model=SUMMARY_MODEL, B=B, S=32768, n=64)
    cud = [(r, _find(records, kernel="flash_scores", **{k: r[k] for k in ("model", "B", "S", "T")}))
           for r in records if r["kernel"] == "cudnn" and "time_ms" in r]
    if cud:
        s["flash_vs_cudnn_time_ratio"] = {f"{r['model']} B={r['B']} S={r['S']} T={r['T']}":
                                          round(f["time_ms"] / r["time_ms"], 3) for r, f in cud if f}
    s["errors"] = sum("error" in r for r in records)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="tiny subset: a first compile check")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--time-budget", type=float, default=320.0,
                    help="seconds after which remaining measurements are recorded as skipped")
    args = ap.parse_args()
    t0 = time.time()
    _log(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    run = Runner(args.reps, args.time_budget)
    if args.quick:
        bench_tree(run, "llama-3-8b", 1, 8192, ns=(16,))
        for model in MODELS:
            bench_flash_and_sparse(run, model, 1, 8192, budgets=(0.05,), Ts=(5,), with_baselines=True)
        copy = None
    else:
        copy = hbm_copy_gbps(args.reps)
        _log(f"HBM copy bandwidth: {copy} GB/s")
        # Summary shapes first (8B tree, then 8B flash/sparse), so a slow run still yields the summary.
        for model in reversed(MODELS):
            for B in (1, 16):
                bench_tree(run, model, B, 32768, ns=(16, 64, 128))
        for model in reversed(MODELS):
            for S in (32768, 131072, 8192):
                for B in (16, 1):
                    bench_flash_and_sparse(run, model, B, S, budgets=(0.01, 0.05, 0.10), Ts=(1, 5),
                                           with_baselines=True)
    summary = summarize(run.records, copy)
    summary["wall_s"] = round(time.time() - t0, 1)
    _log(f"summary: {summary}")
    write_json(args.out, run.records, summary, quick=args.quick)


if __name__ == "__main__":
    main()
