"""How fast are the Pallas attention kernels on one GPU, against cuDNN and XLA? (docs/kernels.md, docs/performance.md)

    PYTHONPATH=. python bench/kernels.py --out bench/results/kernels_h200.json [--quick] [--reps 5] [--time-budget S]
                                         [--only verify,tree,flash,decode] [--tiny]
    python bench/plot_kernels.py bench/results/kernels_h200.json

Shapes: SmolLM2-135M (N=9, K=3, H=64) and Llama-3-8B (N=32, K=8, H=128) attention layers, bf16 caches
of S in {8K, 32K, 128K} positions, all valid (kv_len = S), batch B in {1, 16}.
  flash_scores   decode (T=1) and verify (T=5), with and without score_rows=(0, T-1) (weights), against
                 cuDNN (jax.nn.dot_product_attention, kv lengths only) and (T=5) the XLA f32 reference.
  sparse         T=5 + causal tail over budgets of 1%, 5%, 10% of S: GB/s on the gathered bytes and the
                 speedup over full flash attention (T=5, no scores) at the same S.
  tree           n in {16, 64, 128} tree tokens after a 32K-n prefix vs dense masked attention (the XLA
                 f32 reference with the explicit full mask; also jax.nn.dot_product_attention(xla) in bf16).
  verify         How much faster is one Dustin verification's attention than a dense one, estimation
                 included, and what share of a dense verification does the estimation cost? (issue 30, 8b;
                 the paper reports 27.85x at Llama-3-8B, S = 32K, B = 16, budget 512.) Llama-3-8B layers,
                 B = 16, S = 32K (then 128K, 8K and B = 1 at budget 512 only), a chain of T = 5 rows
                 (gamma 4), budgets 512 / 256 / 1024 / 128, Verify defaults (sink 4, window 64, tier 1 half
                 the free slots), each through the entry jspec's verification forward calls (`verify_case`):
                   verify_dense   attention.full over the whole cache (flash_scores kernel), one layer
                   verify_sparse  attention.sparse over the budget's I_verify + the causal tail
                                  (sparse_attention kernel), one layer; verify_sparse_splits: the first
                                  budget's through the kernel with fixed split-K counts (`SPARSE_SPLIT_SWEEP`)
                   verify_probe   the A_T estimate: the verification's own probe (dustin.head_weights of rows
                                  0 and T-1 over the prefix) on every target head; heads "srh4" (4 heads in 4
                                  (layer, KV group) pairs over 2 layers: assumed typical profile), "srh10" (10
                                  groups: the profiler's default 2% estimation cap at 8B), "default" (no profile:
                                  all 32 heads of 2 layers); as jspec runs it (the head_weights kernel,
                                  `dustin.PROBE_KERNEL`); verify_probe_xla: the same through XLA
                   verify_select  the selection (dustin.select_verify via sparse_verify._select), B rows, for
                                  each split of the free slots between the tiers (`VERIFY_SIGNALS`; "signals")
                 Counting: probe and select run once per verification for all 32 layers (one I_verify serves
                 every layer; the probe covers all target layers), attention once per layer. "dustin_verify"
                 records both figures: per layer, dense / (estimation + sparse); whole verification,
                 32 x dense / (estimation + 32 x sparse). The summary's verify_attention_speedup_8b_32k_b16 is
                 the whole-verification one (srh4, budget 512, tiers half and half) and estimation_overhead_frac is
                 estimation / (32 x dense). What is left out: the lax.cond between the dense and sparse
                 branches, A_D (the drafts' own forwards produce it) and the rest of the layer (projections,
                 MLP). `--tiny` runs only this section on N=4, K=2, H=64, B=2, S=512 (interpret mode on CPU).
  decode         What does each launch of a B=1 decode step cost, and which launch settings would make it
                 cheaper? (issue 31: a B=1 step is ~550 launches.) SmolLM2-135M, 30 stacked layers, every part
                 run once per layer in one program (the time is per layer):
                   decode_xla        a layer's three dense parts (qkv: norm + q/k/v GEMM + RoPE; out: wo +
                                     residual; mlp: norm + gate/up + SwiGLU + down + residual) as jspec's XLA
                                     path runs them (`layers.Xla`), at M = 1 and 16 rows
                   decode_fused      the same parts on the fused dense launches as `AttnImpl(dense_rows)` runs
                                     them (`layers.Fused`: M = 1 padded to 16 rows, the pads included)
                   decode_dense      each fused launch alone at 16 rows over `DECODE_DENSE_GRID` (weights as
                                     stored [Kd, Nc] or transposed [Nc, Kd]; block_n; max_chunk; warps), the
                                     library's launch first
                   decode_flash      flash_scores at T=1 over 7,936 of 8,192 slots, its split combine included,
                                     with the library's launch first, then over `DECODE_FLASH_GRID`
                 The grids are walked in a fixed shuffled order, each launch with its share of the time left
                 (two for flash_scores), so a time budget cut samples every grid evenly.
Every timing: jit compiled (AOT) outside the timed region, 2 warm-up calls, then the median over `reps`
samples of back-to-back calls (enough per sample to last >= 5 ms). A jitted call costs tens of microseconds
of host dispatch, more than a small kernel's device time, so the verify section runs VERIFY_CALLS independent
instances of each part in one program and reports the time per instance (as the 32 layers of a verification
run in one program). Each measurement is guarded: a failure becomes a record with "error".
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
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
SECTIONS = ("verify", "tree", "flash", "decode")   # --only: flash = the flash_scores and sparse section


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

    def measure(self, kernel: str, fn, args, *, bytes_moved: float, mem: float, calls: int = 1, **fields) -> dict:
        """Time fn(*args); `calls` > 1: fn runs that many independent instances in one program (the time and
        bandwidth are per instance; bytes_moved is one instance's)."""
        rec = base_record(kernel=kernel, dtype=jnp.dtype(DTYPE).name, **fields)
        if calls > 1:
            rec["calls_per_program"] = calls
        if mem > MEM_LIMIT:
            rec["skipped"] = f"needs ~{mem / 1e9:.0f} GB > {MEM_LIMIT / 1e9:.0f} GB"
        elif time.time() > self.deadline:
            rec["skipped"] = "time budget exhausted"
        else:
            try:
                sec = time_fn(fn, args, self.reps) / calls
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
    shown = ("model", "B", "S", "T", "n", "budget", "heads", "signals")
    return " ".join(f"{k}={v}" for k, v in f.items() if k in shown)


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


# ------------------------------------------------------------------------------------ verify (Dustin, part 8b)

VERIFY_SHAPES = {**MODELS, "tiny": (4, 2, 64)}                     # N, K, H ("tiny": the CPU check)
VERIFY_LAYERS = {"smollm2-135m": 30, "llama-3-8b": 32, "tiny": 4}   # n_layers: one verification's attention
VERIFY_T = 5                                                       # a chain of gamma = 4 drafts + the bonus row
VERIFY_HEADS = ("srh4", "srh10", "default")
# Instances of each part per timed program. A verification runs its 32 layers' attention in one program, so no
# per-call host dispatch stands between them; timed one jitted call at a time, the sparse attention (~20 us of
# device time) measured ~60 us (kernels_verify_probe_h100.json), most of it host dispatch. Each instance reads
# memory of its own (its own queries; its own selection and signals), so none is served from L2.
VERIFY_CALLS = 8
SUMMARY_HEADS = "srh4"
# How I_verify's free slots split between the tiers (`Verify.signals`): "hybrid" (half each, Verify's default
# without a profile; the headline), "draft" (tier 1 takes them all: A_D only, so the verification runs no A_T
# probe; the committed self profile's choice), "target" (tier 2 takes them all: A_T only; the committed LongSpec
# profile's). One tier is one threshold search over the row instead of two (dustin.select_verify skips the other).
VERIFY_SIGNALS = ("hybrid", "draft", "target")
# Split-K counts the sparse part is also timed with at the first budget (`verify_sparse_splits` records): its
# ~20 us per layer of fixed cost at 32K, B=16 (kernels_verify_signals_h200.json) sets how far from 20x the
# verification stays; the library's pick (`_common.split_plan`) is the `verify_sparse` record.
SPARSE_SPLIT_SWEEP = (1, 2, 4, 8)


def verify_heads(variant: str, N: int, K: int, n_layers: int) -> tuple:
    """The (layer, q_head) target heads of one estimation variant, layers renumbered 0.. (the bench's stacked
    key cache holds only the layers the estimation reads; which layer it is does not change the cost):
      srh4     4 retrieval heads in 4 distinct (layer, KV group) pairs over 2 layers: a typical profile
               (`jspec profile-heads` keeps adding heads only while ARR gains; assumed, not measured here)
      srh10    10 heads, 10 distinct (layer, group) pairs over 5 layers: the most the profiler's default
               estimation budget allows (estimation_frac 0.02 -> floor(0.02 * 2 * 32 * 8) = 10 groups at 8B)
      default  no profile: every q-head of 2 layers (`sparse_verify.default_heads`), 2 * K groups."""
    from jspec.speculative import sparse_verify
    G = N // K
    if variant == "default":
        target, _ = sparse_verify.default_heads(n_layers, N)
        layers = sorted({l for l, _ in target})
        return tuple((layers.index(l), h) for l, h in target)
    n_layers_used = {"srh4": 2, "srh10": 5}[variant]
    groups = sorted({0, K // 2})                  # two distinct KV groups per layer
    return tuple((l, g * G) for l in range(n_layers_used) for g in groups)


def _calls(fn, n_varied: int):
    """fn over C independent instances in one program: its first n_varied arguments carry a leading axis of C
    (each instance's own inputs), the rest are shared. Returns the C results as a list.

    Each instance gets the shared arrays through an optimization barrier of its own, together with its own
    inputs: to XLA they are then C different values, so it cannot merge the C instances' ops on them into one
    (C dots against the same keys into one GEMM that reads the keys once). Without it the XLA probe read its
    keys at 2.6 TB/s in `kernels_verify_tiersel_h100.json`, faster than the kernel's 2.2: such a merge is
    suspected, not shown. The barrier moves no data."""
    def many(*args):
        varied, shared = args[:n_varied], args[n_varied:]
        out = []
        for c in range(varied[0].shape[0]):
            own, same = jax.lax.optimization_barrier(([a[c] for a in varied], list(shared)))
            out.append(fn(*own, *same))
        return out
    return many


def verify_case(model, B, S, budgets, heads_variants, *, interpret, key=0, calls=1):
    """One verification's attention at (model, B, S) as jspec runs it, through the same entries:
    {part: (fn, args)} with parts
      "dense"             `jspec.attention.full`: T = 5 rows over the whole cache (bottom-right causal), one layer
                          (the lossless verification; no score rows): the flash_scores kernel
      ("sparse", budget)  `jspec.attention.sparse`: the same rows over I_verify (`budget` slots, chosen by the
                          library's selection from random signals, outside the timing) + the causal tail, one
                          layer: the sparse_attention kernel
      ("probe", heads)    what Dustin adds to a verification's layers to estimate A_T: the verification's own probe
                          (`sparse_verify._target_probe`: `dustin.head_weights` of rows 0 and T-1 on the target
                          heads over the prefix) on every target layer, summed as model.forward sums it: once per
                          verification, all target layers together
      ("select", budget)  `sparse_verify._select`: I_verify from A_D and A_T (`dustin.select_verify`: sink, window,
                          tier 1 by A_D, tier 2 by A_T), once per verification for every layer
      ("select", budget, signals)  the same for the one-tier splits "draft" and "target" (`VERIFY_SIGNALS`)
      ("sparse_splits", n)  the first budget's sparse part through the kernel with n split-K programs per
                          (sequence, KV head) instead of the library's choice (`SPARSE_SPLIT_SWEEP`)
    Cache: bf16 [1, B, S, K, H] (layer 0 of a stacked cache, read in place as the model reads it), every sequence
    at kv_len = S with the T verified tokens in its last slots (prefix base = S - T); the probes read a stack of
    their own target layers' keys. `Verify` defaults otherwise (sink 4, window 64, tier 1 = half the free
    slots, page 1). "meta": sizes for the records, "idx": each budget's selection (idx, n_valid).
    calls > 1: each part's fn runs `calls` independent instances (`_calls`) and its varying arguments (queries,
    signals, selections: drawn per instance) carry a leading axis of that size; "idx" holds the stacked
    selections. The arguments are ordered varying first: dense (q, k_all, v_all, kv_len), sparse (q, idx,
    n_valid, k_all, v_all, kv_len), select (a_d, a_t, base), probe (q_est, k_est, base)."""
    from types import SimpleNamespace

    from jspec import attention
    from jspec.speculative import sparse_verify
    from jspec.speculative.config import SpecConfig, Verify
    N, K, H = VERIFY_SHAPES[model]
    n_layers, T = VERIFY_LAYERS[model], VERIFY_T
    G = N // K
    heads = {hv: verify_heads(hv, N, K, n_layers) for hv in heads_variants}
    n_est = max(1 + max(l for l, _ in hs) for hs in heads.values())
    cfg = SimpleNamespace(n_layers=n_layers, n_heads=N)   # all that `sparse_verify.heads` reads
    impl = attention.AttnImpl(backend="pallas", interpret=interpret)
    keys = jax.random.split(jax.random.key(key), 6)
    k, v = _cache(keys[0], B, S, K, H)
    k_all, v_all = k[None], v[None]
    draw = jax.jit(jax.vmap(lambda kk: jax.random.normal(kk, (S, K, H), DTYPE)))
    k_est = jnp.stack([draw(jax.random.split(kk, B)) for kk in jax.random.split(keys[1], n_est)])
    lead = (calls,) if calls > 1 else ()
    q = jax.random.normal(keys[2], lead + (B, T, N, H), DTYPE)
    q_est = jax.random.normal(keys[3], lead + (n_est, B, T, N, H), DTYPE)   # each target layer's own queries
    kv_len = jnp.full((B,), S, jnp.int32)
    base = kv_len - T
    a_d = jax.random.uniform(keys[4], lead + (B, S), jnp.float32)
    a_t = jax.random.uniform(keys[5], lead + (B, S), jnp.float32)

    def part(fn, n_varied):
        return _calls(fn, n_varied) if calls > 1 else fn

    def spec_of(budget, hv=None, signals="hybrid"):
        return SpecConfig(method="vegas", gamma=T - 1, verify=Verify(
            kind="dustin", budget=budget, target_heads=heads[hv or heads_variants[0]], signals=signals))

    def select_fn(spec):
        def select(a_d, a_t, base):
            vs = sparse_verify.State(a_t=a_t, rounds=jnp.ones((), jnp.int32))
            sel = sparse_verify._select(spec, cfg, vs, a_d, base)["sparse"]
            return sel.idx, sel.n_valid
        return select

    def probe_fn(spec, n, kernel=None):
        def probe(q_est, k_est, base):
            p = sparse_verify._target_probe(spec, cfg, base, kernel=kernel, interpret=interpret)
            got = [p(l, q_est[l], k_est, None) for l in range(n)]
            return sum(got[1:], got[0])
        return probe

    def dense(q, k_all, v_all, kv_len):
        return attention.full(q, k_all, v_all, 0, kv_len, impl=impl)[0]

    def sparse(q, idx, n_valid, k_all, v_all, kv_len):
        return attention.sparse(q, k_all, v_all, 0, kv_len, idx, n_valid, impl=impl)

    def sparse_splits(n):
        bs = dataclasses.replace(_sparse_defaults(T * G, H), num_splits=n)

        def run(q, idx, n_valid, k_all, v_all, kv_len):
            return pk.sparse_attention(q, k_all, v_all, idx, n_valid, kv_len, layer=0, block_sizes=bs,
                                       interpret=interpret)[0]
        return run

    v0 = spec_of(budgets[0]).verify
    case = dict(dense=(part(dense, 1), (q, k_all, v_all, kv_len)), idx={},
                meta=dict(N=N, K=K, H=H, T=T, n_layers=n_layers, sink=v0.sink, window=v0.window,
                          kv_bytes=2 * B * S * K * H * 2, qo_bytes=2 * B * T * N * H * 2, select_bytes=2 * B * S * 4))
    for budget in budgets:
        select = part(select_fn(spec_of(budget)), 2)
        got = jax.jit(select)(a_d, a_t, base)
        if calls > 1:
            got = tuple(jnp.stack(x) for x in zip(*got))
        idx, n_valid = case["idx"][budget] = got
        case["select", budget] = (select, (a_d, a_t, base))
        for signals in VERIFY_SIGNALS[1:]:
            case["select", budget, signals] = (part(select_fn(spec_of(budget, signals=signals)), 2), (a_d, a_t, base))
        case["sparse", budget] = (part(sparse, 3), (q, idx, n_valid, k_all, v_all, kv_len))
        case["meta"]["gathered", budget] = 2 * B * (budget + T) * K * H * 2 + 2 * B * T * N * H * 2
    for n in SPARSE_SPLIT_SWEEP:
        case["sparse_splits", n] = (part(sparse_splits(n), 3), case["sparse", budgets[0]][1])
    for hv, hs in heads.items():
        n = 1 + max(l for l, _ in hs)
        groups = len({(l, h // G) for l, h in hs})
        case["probe", hv] = (part(probe_fn(spec_of(budgets[0], hv), n), 1), (q_est, k_est, base))
        case["probe_xla", hv] = (part(probe_fn(spec_of(budgets[0], hv), n, kernel=False), 1), (q_est, k_est, base))
        case["meta"]["heads", hv] = dict(heads=hv, n_target_heads=len(hs), target_layers=n, target_groups=groups,
                                         probe_bytes=groups * B * S * H * 2)
    return case


def _sparse_defaults(rows: int, head_dim: int) -> pk.BlockSizes:
    import importlib
    return importlib.import_module("pallas_kernels.sparse_attention").default_block_sizes(rows, head_dim, DTYPE)


def bench_verify(run: Runner, model, B, S, budgets, heads_variants, *, interpret=False, calls=VERIFY_CALLS):
    """Dense verification attention vs Dustin's (estimation + sparse attention) at one (model, B, S): the timed
    parts (kernel = verify_dense / verify_sparse / verify_select per budget / verify_probe per heads variant) and
    one derived "dustin_verify" record per (budget, heads variant) with the per-layer and whole-verification
    ratios (`_dustin_record`). Each part is timed as `calls` instances in one program, per instance."""
    N, K, H = VERIFY_SHAPES[model]
    kv_bytes = 2 * B * S * K * H * 2
    shape = dict(model=model, B=B, S=S, N=N, K=K, H=H, T=VERIFY_T)
    n_est = max(1 + max(l for l, _ in verify_heads(hv, N, K, VERIFY_LAYERS[model])) for hv in heads_variants)
    need = kv_bytes * (1 + n_est / 2) * 1.3   # the layer's K and V, the target layers' keys, f32 scratch
    try:
        if need > MEM_LIMIT:
            raise MemoryError(f"needs ~{need / 1e9:.0f} GB > {MEM_LIMIT / 1e9:.0f} GB")
        case = verify_case(model, B, S, budgets, heads_variants, interpret=interpret, key=S + B, calls=calls)
    except Exception as e:   # building the inputs failed: one record, the run goes on
        run.records.append(base_record(kernel="dustin_verify", error=f"{type(e).__name__}: {str(e)[:400]}", **shape))
        _log(f"verify {model} B={B} S={S}: {run.records[-1]['error'][:160]}")
        return
    meta = case["meta"]
    dense = run.measure("verify_dense", *case["dense"], bytes_moved=meta["kv_bytes"] + meta["qo_bytes"],
                        mem=kv_bytes, calls=calls, **shape)
    probes, probe_xlas = {}, {}
    for hv in heads_variants:
        hm = meta["heads", hv]
        fields = dict(heads=hv, n_target_heads=hm["n_target_heads"], target_layers=hm["target_layers"],
                      target_groups=hm["target_groups"], **shape)
        probes[hv] = run.measure("verify_probe", *case["probe", hv], bytes_moved=hm["probe_bytes"], mem=0,
                                 calls=calls, **fields)
        # the probe as jspec runs it (dustin.PROBE_KERNEL: the Pallas kernel) and through XLA, for comparison
        probe_xlas[hv] = run.measure("verify_probe_xla", *case["probe_xla", hv],
                                        bytes_moved=hm["probe_bytes"], mem=0, calls=calls, **fields)
    for budget in budgets:
        sparse = run.measure("verify_sparse", *case["sparse", budget], bytes_moved=meta["gathered", budget], mem=0,
                             calls=calls, budget=budget, **shape)
        select = run.measure("verify_select", *case["select", budget], bytes_moved=meta["select_bytes"], mem=0,
                             calls=calls, budget=budget, sink=meta["sink"], window=meta["window"], signals="hybrid",
                             **shape)
        for hv in heads_variants:
            run.records.append(_dustin_record(dense, sparse, select, probes[hv], meta, meta["heads", hv],
                                              budget=budget, probe_xla=probe_xlas[hv], signals="hybrid", **shape))
        # One tier: draft-only runs no probe (no A_T), target-only the summary heads' probe.
        hv = SUMMARY_HEADS if SUMMARY_HEADS in heads_variants else heads_variants[0]
        for signals in VERIFY_SIGNALS[1:]:
            one = run.measure("verify_select", *case["select", budget, signals], bytes_moved=meta["select_bytes"],
                              mem=0, calls=calls, budget=budget, sink=meta["sink"], window=meta["window"],
                              signals=signals, **shape)
            draft = signals == "draft"
            run.records.append(_dustin_record(dense, sparse, one, None if draft else probes[hv], meta,
                                              NO_PROBE if draft else meta["heads", hv], budget=budget,
                                              signals=signals, **shape))
    for n in SPARSE_SPLIT_SWEEP:   # the library's split plan against fixed counts, first budget only
        run.measure("verify_sparse_splits", *case["sparse_splits", n], bytes_moved=meta["gathered", budgets[0]],
                    mem=0, calls=calls, budget=budgets[0], num_splits=n, **shape)
    del case


NO_PROBE = dict(heads="none", n_target_heads=0, target_groups=0)   # signals="draft": no A_T, no probe


def _dustin_record(dense, sparse, select, probe, meta, hm, probe_xla=None, **shape):
    """The derived comparison; L = n_layers:
      estimation_ms = probe + select (both once per verification; timed apart, summed; probe None: a draft-only
                      selection, which runs no probe: select alone)
      speedup_per_layer          dense / (estimation + sparse): as if one layer carried the whole estimation
      attention_speedup_per_layer dense / sparse (no estimation)
      speedup_verification       L * dense / (estimation + L * sparse): the whole verification's attention
      estimation_frac            estimation / (L * dense): share of a dense verification's attention
      estimation_frac_per_layer  estimation / dense
    (probe: as jspec runs it) and, where the XLA probe was timed too, probe_xla_ms and the two whole-verification
    figures with it in place of the default probe (speedup_verification_probe_xla, estimation_frac_probe_xla)."""
    L = meta["n_layers"]
    rec = base_record(kernel="dustin_verify", dtype=jnp.dtype(DTYPE).name, heads=hm["heads"],
                      n_target_heads=hm["n_target_heads"], target_groups=hm["target_groups"], n_layers=L,
                      sink=meta["sink"], window=meta["window"], **shape)
    parts = dict(dense=dense, sparse=sparse, select=select, probe=probe or dict(time_ms=0.0))
    missing = [k for k, r in parts.items() if not r or "time_ms" not in r]
    if missing:
        rec["error"] = "missing part(s): " + ", ".join(
            f"{k} ({(parts[k] or {}).get('error', (parts[k] or {}).get('skipped', 'not run'))[:80]})" for k in missing)
    else:
        d, s = dense["time_ms"], sparse["time_ms"]
        p = parts["probe"]["time_ms"]
        est = p + select["time_ms"]
        rec.update(dense_ms=d, sparse_ms=s, probe_ms=p, select_ms=select["time_ms"],
                   estimation_ms=round(est, 4),
                   speedup_per_layer=round(d / (est + s), 3), attention_speedup_per_layer=round(d / s, 3),
                   dense_verification_ms=round(L * d, 4), dustin_verification_ms=round(est + L * s, 4),
                   speedup_verification=round(L * d / (est + L * s), 3),
                   estimation_frac=round(est / (L * d), 5), estimation_frac_per_layer=round(est / d, 4))
        if probe_xla and "time_ms" in probe_xla:
            est_x = probe_xla["time_ms"] + select["time_ms"]
            rec.update(probe_xla_ms=probe_xla["time_ms"],
                       speedup_verification_probe_xla=round(L * d / (est_x + L * s), 3),
                       estimation_frac_probe_xla=round(est_x / (L * d), 5))
    _log(f"{'dustin_verify':28s} {_fields(shape)} heads={hm['heads']} -> "
         + (f"x{rec['speedup_verification']} per verification, est {100 * rec['estimation_frac']:.2f}%"
            if "error" not in rec else rec["error"][:160]))
    return rec


# ---------------------------------------------------------------------------------------------- decode (issue 31)
# (transposed weights, block_n, max_chunk, num_warps) for the fused dense launches (qkv_rope: block_n is a head)
DECODE_DENSE_GRID = tuple(itertools.product((False, True), (16, 32, 64), (128, 256, 512), (1, 2, 4, 8)))
# (block_k, num_splits, num_warps, num_stages) for flash_scores at T = 1
DECODE_FLASH_GRID = tuple(itertools.product((32, 64, 128, 256), (8, 16, 32, 64, 128), (1, 2, 4), (1, 2, 3)))


def _shuffled(grid, seed=0):
    out = list(grid)
    np.random.default_rng(seed).shuffle(out)
    return out


def bench_decode(run: Runner, name: str, cfg, *, S: int, valid: int, dense_grid=DECODE_DENSE_GRID,
                 flash_grid=DECODE_FLASH_GRID, interpret: bool = False):
    """The decode section (module docstring) for a model `name` of config `cfg` (jspec.config.ModelConfig, with
    random weights), a cache of S slots of which `valid` are filled."""
    from jspec import layers, model as jmodel
    from jspec.attention import AttnImpl
    from pallas_kernels import dense as Dn
    from pallas_kernels.flash_scores import flash_scores_kernel
    L, D, N, K, H, F, G = cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.group
    params = jmodel.init_params(cfg, jax.random.key(0), dtype=DTYPE)
    lp = params["layers"]
    shape = dict(model=name, L=L, D=D, N=N, K=K, H=H, F=F)
    weight_bytes = {"qkv": D * K * (G + 2) * H * 2, "out": N * H * D * 2, "mlp": 3 * D * F * 2}

    def parts(dense):   # part -> fn(x, positions, o), the part of every layer in turn
        one = {"qkv": lambda x, pos, o, i: dense.qkv(x, pos, _layer(lp, i), i),
               "out": lambda x, pos, o, i: dense.out(x, o, _layer(lp, i), i),
               "mlp": lambda x, pos, o, i: dense.mlp(x, _layer(lp, i), i)}
        return {part: (lambda x, pos, o, f=f: [f(x, pos, o, i) for i in range(L)]) for part, f in one.items()}

    for M in (1, 16):
        x = jax.random.normal(jax.random.key(M), (M, 1, D), DTYPE)
        pos = jnp.full((M, 1), valid - 1, jnp.int32)
        o = jax.random.normal(jax.random.key(M + 1), (M, 1, N, H), DTYPE)
        runs = [("decode_xla", layers.Xla(cfg), (x, pos, o))]
        if M == 1:   # what AttnImpl(dense_rows=16) runs: the row padded to 16
            fused = layers.for_step(params, cfg, M, 1, AttnImpl(backend="pallas", interpret=interpret, dense_rows=16))
            runs.append(("decode_fused", fused, (*fused.enter(x, pos), o)))
        for kernel, dense, args in runs:
            for part, fn in parts(dense).items():
                run.measure(kernel, fn, args, bytes_moved=weight_bytes[part], mem=0, calls=L, part=part, M=M, **shape)
    # each fused launch alone, 16 rows; the time left is shared out: one share per launch, two for flash_scores
    end, shares = run.deadline, [1, 1, 1, 1, 2]

    def next_share():
        now = time.time()
        run.deadline = now + max(0.0, end - now) * shares[0] / sum(shares)
        shares.pop(0)

    weights = {"qkv_rope": layers._flat(lp["wqkv"], 2), "glu": layers._flat(lp["w_gu"], 2),
               "residual_o": layers._flat(lp["wo"], 1, 3), "residual_down": lp["w_down"]}
    for part, w in weights.items():   # (`part`, not `name`: that is the model's)
        mode = "residual" if part.startswith("residual") else part
        kd, nc = w.shape[1:]
        x = jax.random.normal(jax.random.key(7), (16, kd), DTYPE)
        aux = (jnp.arange(16, dtype=jnp.int32) + valid - 16 if mode == "qkv_rope" else
               jax.random.normal(jax.random.key(8), (16, nc), DTYPE) if mode == "residual" else None)
        wt = jnp.swapaxes(w, 1, 2) + 0
        nw = {"qkv_rope": lp["attn_norm"], "glu": lp["mlp_norm"]}.get(mode)
        base = dict(mode=mode, norm_w=nw, eps=cfg.norm_eps, interpret=interpret)
        if mode == "qkv_rope":
            base.update(inv_freq=layers._inv_freq(cfg), head_dim=H, groups=G)
        launches = [None] + [g for g in _shuffled(dense_grid) if mode != "qkv_rope" or g[1] == H]
        next_share()
        for launch in launches:
            kw = dict(base)
            tr = False
            if launch is not None:
                tr, bn, mc, nwarps = launch
                kw.update(block_n=bn, max_chunk=mc, num_warps=nwarps, block_m=16, w_transposed=tr)
            fn = (lambda x, w, aux, kw=kw: [Dn._dense_call(x, w, i, aux=aux, **kw) for i in range(L)])
            fields = dict(launch="library") if launch is None else dict(
                launch="grid", transposed=tr, block_n=kw["block_n"], max_chunk=kw["max_chunk"],
                num_warps=kw["num_warps"])
            run.measure("decode_dense", fn, (x, wt if tr else w, aux), bytes_moved=kd * nc * 2, mem=0, calls=L,
                        part=part, M=16, **fields, **shape)
    # flash_scores at T = 1
    k_all = jax.random.normal(jax.random.key(11), (L, 1, S, K, H), DTYPE)
    v_all = jax.random.normal(jax.random.key(12), (L, 1, S, K, H), DTYPE)
    q = jax.random.normal(jax.random.key(13), (1, 1, N, H), DTYPE)
    kv_len = jnp.array([valid], jnp.int32)
    next_share()
    for launch in [None] + _shuffled(flash_grid):
        if launch is not None and S // launch[0] < launch[1]:
            continue
        bs = None if launch is None else pk.BlockSizes(block_m=16, block_k=launch[0], num_splits=launch[1],
                                                       num_warps=launch[2], num_stages=launch[3])
        fn = (lambda q, k, v, n, bs=bs: [flash_scores_kernel(q, k, v, n, layer=i, block_sizes=bs,
                                                             interpret=interpret)[0] for i in range(L)])
        fields = dict(launch="library") if bs is None else dict(
            launch="grid", block_k=bs.block_k, num_splits=bs.num_splits, num_warps=bs.num_warps,
            num_stages=bs.num_stages)
        run.measure("decode_flash", fn, (q, k_all, v_all, kv_len), bytes_moved=2 * valid * K * H * 2, mem=0,
                    calls=L, B=1, S=S, T=1, valid=valid, **fields, **shape)
    run.deadline = end


def decode_model():
    """SmolLM2-135M's shapes (the model the decode section is about)."""
    from jspec.config import ModelConfig
    return ModelConfig(arch="llama", vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
                       head_dim=64, ffn_dim=1536, rope_theta=100000.0, dtype="bfloat16", max_position=8192)


def _layer(lp, i):
    return {k: v[i] for k, v in lp.items()}


def decode_summary(records) -> dict:
    """Per part: XLA's and the fused path's us per layer; per launch: the library's and the grid's best."""
    out = {}
    for r in records:
        if "time_ms" not in r:
            continue
        us = round(r["time_ms"] * 1e3, 2)
        if r["kernel"] in ("decode_xla", "decode_fused"):
            out[f"{r['kernel']}_{r['part']}_M{r['M']}_us"] = us
        elif r["kernel"] in ("decode_dense", "decode_flash"):
            key = f"{r['kernel']}_{r.get('part', 'attention')}"
            if r["launch"] == "library":
                out[key + "_library_us"] = us
            elif us < out.get(key + "_best_us", float("inf")):
                out[key + "_best_us"] = us
                out[key + "_best"] = {k: r[k] for k in ("transposed", "block_n", "max_chunk", "num_warps",
                                                         "block_k", "num_splits", "num_stages") if k in r}
    return out


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


def verify_summary(records, model, B, S, budget=512, heads=SUMMARY_HEADS) -> dict:
    """The verify section's summary keys at one shape (empty when its dustin_verify record has no timing).
    `verify_attention_speedup_8b_32k_b16` and `estimation_overhead_frac` count the whole verification:
    n_layers x dense per layer vs estimation once + n_layers x sparse per layer (`_dustin_record`), with the
    free slots split half and half ("hybrid"); the "_by_signals" keys give the one-tier splits beside it."""
    every = [r for r in records if r["kernel"] == "dustin_verify" and "speedup_verification" in r
             and r["model"] == model and r["B"] == B and r["S"] == S]
    rows = [r for r in every if r.get("signals", "hybrid") == "hybrid"]
    main = [r for r in rows if r["budget"] == budget and r["heads"] == heads]
    if not main:
        return {}
    r = main[0]
    return {"verify_attention_speedup_8b_32k_b16": r["speedup_verification"],
            "estimation_overhead_frac": r["estimation_frac"],
            "verify_attention_at": dict(model=model, B=B, S=S, T=r["T"], budget=budget, heads=heads,
                                        n_target_heads=r["n_target_heads"], n_layers=r["n_layers"],
                                        counted="whole verification: n_layers x dense per layer vs estimation "
                                                "(probe + select) once + n_layers x sparse per layer"),
            "verify_attention_parts_ms": {k: r[k] for k in ("dense_ms", "sparse_ms", "probe_ms", "select_ms",
                                                           "estimation_ms")},
            "verify_attention_speedup_per_layer": r["speedup_per_layer"],
            "verify_attention_speedup_by": {f"budget={x['budget']} heads={x['heads']}": x["speedup_verification"]
                                            for x in rows},
            "estimation_overhead_frac_by_heads": {x["heads"]: x["estimation_frac"] for x in rows
                                                  if x["budget"] == budget},
            # one tier (`VERIFY_SIGNALS`) at this budget: draft-only (no probe) and target-only (these heads)
            "verify_attention_speedup_by_signals": {x["signals"]: x["speedup_verification"] for x in every
                                                    if x["budget"] == budget and x["heads"] in (heads, "none")},
            "estimation_overhead_frac_by_signals": {x["signals"]: x["estimation_frac"] for x in every
                                                    if x["budget"] == budget and x["heads"] in (heads, "none")},
            # the same two figures with the probe's Pallas kernel (None where it was not timed)
            "verify_attention_speedup_probe_xla": r.get("speedup_verification_probe_xla"),
            "estimation_overhead_frac_probe_xla": r.get("estimation_frac_probe_xla"),
            # the sparse part per layer with fixed split-K counts (`SPARSE_SPLIT_SWEEP`) beside the library's pick
            "verify_sparse_ms_by_splits": {"auto": r["sparse_ms"], **{
                x["num_splits"]: x["time_ms"] for x in records if x["kernel"] == "verify_sparse_splits"
                and "time_ms" in x and x["model"] == model and x["B"] == B and x["S"] == S and x["budget"] == budget}}}


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
    s.update(verify_summary(records, SUMMARY_MODEL, 16, 32768))
    s.update(decode_summary(records))
    s["errors"] = sum("error" in r for r in records)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="tiny subset: a first compile check")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--time-budget", type=float, default=320.0,
                    help="seconds after which remaining measurements are recorded as skipped")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections to run, of {','.join(SECTIONS)} (default: all)")
    ap.add_argument("--tiny", action="store_true",
                    help="verify section only, on tiny shapes (N=4, K=2, H=64, B=2, S=512), kernels in interpret "
                         "mode off a GPU: the CPU check")
    args = ap.parse_args()
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    if not only or set(only) - set(SECTIONS):
        ap.error(f"--only {args.only!r}: sections are {', '.join(SECTIONS)}")
    t0 = time.time()
    _log(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    run = Runner(args.reps, args.time_budget)
    interpret = jax.default_backend() != "gpu"
    copy = None
    if args.tiny:
        bench_verify(run, "tiny", 2, 512, budgets=(128, 512), heads_variants=("srh4", "default"), interpret=interpret,
                     calls=2)
    elif args.quick:
        if "tree" in only:
            bench_tree(run, "llama-3-8b", 1, 8192, ns=(16,))
        if "flash" in only:
            for model in MODELS:
                bench_flash_and_sparse(run, model, 1, 8192, budgets=(0.05,), Ts=(5,), with_baselines=True)
        if "verify" in only:
            bench_verify(run, "llama-3-8b", 1, 8192, budgets=(512,), heads_variants=("srh4",), interpret=interpret)
        if "decode" in only:
            bench_decode(run, "smollm2-135m", decode_model(), S=8192, valid=7936, dense_grid=DECODE_DENSE_GRID[:2],
                         flash_grid=DECODE_FLASH_GRID[:2])
    else:
        copy = hbm_copy_gbps(args.reps)
        _log(f"HBM copy bandwidth: {copy} GB/s")
        # Summary shapes first (8B verify at 32K, 8B tree, then 8B flash/sparse), so a slow run still yields the
        # summary.
        if "verify" in only:
            bench_verify(run, "llama-3-8b", 16, 32768, budgets=(512, 256, 1024, 128), heads_variants=VERIFY_HEADS)
        if "tree" in only:
            for model in reversed(MODELS):
                for B in (1, 16):
                    bench_tree(run, model, B, 32768, ns=(16, 64, 128))
        if "flash" in only:
            for model in reversed(MODELS):
                for S in (32768, 131072, 8192):
                    for B in (16, 1):
                        bench_flash_and_sparse(run, model, B, S, budgets=(0.01, 0.05, 0.10), Ts=(1, 5),
                                               with_baselines=True)
        if "decode" in only:
            bench_decode(run, "smollm2-135m", decode_model(), S=8192, valid=7936)
        if "verify" in only:   # the other lengths and B = 1 after everything else
            for S, B in ((131072, 16), (8192, 16), (32768, 1)):
                bench_verify(run, "llama-3-8b", B, S, budgets=(512,), heads_variants=VERIFY_HEADS)
    summary = summarize(run.records, copy)
    summary["wall_s"] = round(time.time() - t0, 1)
    _log(f"summary: {summary}")
    write_json(args.out, run.records, summary, quick=args.quick, tiny=args.tiny, sections=only)


if __name__ == "__main__":
    main()
