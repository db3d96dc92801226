"""Launch-parameter sweep of flash_scores or sparse_attention at one decode/verify shape (is the default the
fastest there?).

    PYTHONPATH=. python bench/flash_sweep.py --out $OUT/flash_sweep_h200.json [--B 64 --S 8064 --kv-len 8000]
    PYTHONPATH=. python bench/flash_sweep.py --kernel sparse --out $OUT/sparse_sweep_h200.json [--budget 512]

SmolLM2-135M attention (N=9, K=3, H=64), bf16 cache [B, S, K, H] read in place as layer 1 of a 2-layer
stacked cache (as the model calls it), T=1 (decode) and T=5 with score_rows=(0, 4) (Vegas' verification;
`--Ts 5,6,7` for gammas 4-6, scoring rows 0 and T-1).
For each T: the default BlockSizes, then a grid of block_k x num_splits x num_stages (4 warps; and 8 at
block_k 128); each timed as bench/kernels.py times kernels (median over reps of back-to-back calls, >= 5 ms
per sample).
--kernel sparse: a Vegas draft step's sparse_attention (T=1 plus its causal tail, every layer's selections
[L, B, M] read at layer 1 as the model passes them), `--budget` selected entries per row either as whole
aligned pages of 16 (`SpecConfig(select_page=16)`) or as single positions (the default selection): the default
BlockSizes, then block_k x num_splits x num_stages x num_warps on the page pattern, then the fastest few of
those and the default on single positions. Bandwidth counts the gathered K/V bytes.
Also (flash) the same bytes in a head-major layout (K=1 and B*K sequences of G query heads: every (sequence,
head) reads one contiguous stretch of keys): does the [S, K, H] interleave of the cache cost bandwidth?
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import HBM_BYTES_PER_S, base_record, write_json  # noqa: E402
from bench.kernels import time_fn  # noqa: E402
import pallas_kernels as pk  # noqa: E402
fs = importlib.import_module("pallas_kernels.flash_scores")   # the module (the package re-exports the function)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--S", type=int, default=8064)
    ap.add_argument("--kv-len", type=int, default=8000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--kernel", default="flash", choices=["flash", "sparse"])
    ap.add_argument("--budget", type=int, default=512, help="sparse: selected entries per row")
    ap.add_argument("--Ts", default="1,5", help="flash: query rows per sequence (T > 1 scores rows 0 and T-1)")
    a = ap.parse_args()
    N, K, H = 9, 3, 64
    B, S = a.B, a.S
    deadline = time.time() + a.budget_s
    key = jax.random.key(0)
    kk, kv, kq = jax.random.split(key, 3)
    k_all = jax.random.normal(kk, (2, B, S, K, H), jnp.bfloat16)
    v_all = jax.random.normal(kv, (2, B, S, K, H), jnp.bfloat16)
    kv_len = jnp.full((B,), a.kv_len, jnp.int32)
    bytes_moved = 2 * B * a.kv_len * K * H * 2
    records = []

    if a.kernel == "sparse":
        bytes_moved = 2 * B * (a.budget + 1) * K * H * 2

    def measure(label, fn, args, **fields):
        rec = base_record(kind=f"{a.kernel}_sweep", label=label, B=B, S=S, kv_len=a.kv_len, **fields)
        if time.time() > deadline:
            rec["skipped"] = "time budget exhausted"
        else:
            try:
                sec = time_fn(fn, args, a.reps)
                rec.update(time_us=round(sec * 1e6, 2), tbps=round(bytes_moved / sec / 1e12, 3),
                           hbm_frac=round(bytes_moved / sec / HBM_BYTES_PER_S, 3))
            except Exception as e:   # one failing configuration must not end the sweep
                rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(f"{label:60s} " + (f"{rec['time_us']:8.1f} us {rec['tbps']:.2f} TB/s" if "time_us" in rec
                                 else rec.get("error", rec.get("skipped", ""))[:120]), flush=True)
        records.append(rec)
        return rec

    if a.kernel == "sparse":
        return sparse_sweep(a, measure, records, k_all, v_all, kq)
    Ts = [int(t) for t in a.Ts.split(",")]
    for T in Ts:
        rows = (0, T - 1) if T > 1 else ()
        q = jax.random.normal(kq, (B, T, N, H), jnp.bfloat16)

        def call(q, k, v, n, bs=None, rows=rows):
            return pk.flash_scores_kernel(q, k, v, n, score_rows=rows, block_sizes=bs, layer=1)[0::2]

        d = fs.default_block_sizes(T * (N // K), H, jnp.bfloat16)
        measure(f"T={T} default {d}", call, (q, k_all, v_all, kv_len), T=T, default=True, block_k=d.block_k,
                num_splits=None, num_stages=d.num_stages, num_warps=d.num_warps)
        grid = list(itertools.product((64, 128, 256), (1, 2, 3, 4, 6), (2, 3), (4,)))
        grid += [(128, sp, st, 8) for sp in (2, 3) for st in (2, 3)]
        for bk, sp, st, nw in grid:
            bs = pk.BlockSizes(block_m=64, block_k=bk, num_splits=sp, num_stages=st, num_warps=nw)
            measure(f"T={T} block_k={bk} splits={sp} stages={st} warps={nw}",
                    lambda q, k, v, n, bs=bs: call(q, k, v, n, bs), (q, k_all, v_all, kv_len), T=T,
                    block_k=bk, num_splits=sp, num_stages=st, num_warps=nw)
        # Head-major proxy: the same bytes with each (sequence, KV head) contiguous.
        kh = k_all.transpose(0, 1, 3, 2, 4).reshape(2, B * K, S, 1, H)
        vh = v_all.transpose(0, 1, 3, 2, 4).reshape(2, B * K, S, 1, H)
        qh = q.reshape(B, T, K, N // K, H).transpose(0, 2, 1, 3, 4).reshape(B * K, T, N // K, H)
        measure(f"T={T} head-major layout, default", call, (qh, kh, vh, jnp.repeat(kv_len, K)), T=T,
                layout="head_major")
        del kh, vh
    ok = [r for r in records if "time_us" in r]
    summary = {}
    for T in Ts:
        rs = [r for r in ok if r["T"] == T and r.get("layout") is None]
        if rs:
            best = min(rs, key=lambda r: r["time_us"])
            dflt = next((r for r in rs if r.get("default")), None)
            summary[f"T{T}"] = {"best": best["label"], "best_us": best["time_us"],
                                "default_us": dflt and dflt["time_us"],
                                "head_major_us": next((r["time_us"] for r in ok
                                                       if r["T"] == T and r.get("layout")), None)}
    write_json(a.out, records, summary)
    print(summary)


def sparse_sweep(a, measure, records, k_all, v_all, kq):
    """The draft step's sparse_attention: pages of 16 over the launch grid, then single positions."""
    sa = importlib.import_module("pallas_kernels.sparse_attention")
    N, K, H = 9, 3, 64
    B, M, T = a.B, a.budget, 1
    rng = np.random.default_rng(0)
    past = a.kv_len - T    # selections lie before the new token

    def pattern(page):
        rows = [np.sort(rng.choice(past // page, M // page, replace=False))[:, None] * page + np.arange(page)
                for _ in range(2 * B)]
        return jnp.asarray(np.stack(rows).reshape(2, B, M), jnp.int32)

    q = jax.random.normal(kq, (B, T, N, H), jnp.bfloat16)
    kv_len = jnp.full((B,), a.kv_len + T, jnp.int32)
    n_valid = jnp.full((2, B), M, jnp.int32)

    def call(q, k, v, idx, bs=None):
        return pk.sparse_attention_kernel(q, k, v, idx, n_valid, kv_len, block_sizes=bs, layer=1)[0]

    d = sa.default_block_sizes(T * (N // K), H, jnp.bfloat16)
    fields = dict(T=T, budget=M)
    idxs = {page: pattern(page) for page in (16, 1)}
    def fused(q, k, v, idx):
        return pk.sparse_attention_kernel(q, k, v, idx, n_valid, kv_len, layer=1, fuse_heads=True)[0]

    for page, idx in idxs.items():   # both defaults (and fused heads) first, whatever the budget leaves
        measure(f"page={page} default {d}", call, (q, k_all, v_all, idx), page=page, default=True,
                block_k=d.block_k, num_splits=None, num_stages=d.num_stages, num_warps=d.num_warps, **fields)
        measure(f"page={page} fused heads, default {d}", fused, (q, k_all, v_all, idx), page=page,
                fused=True, block_k=d.block_k, num_splits=None, num_stages=d.num_stages, num_warps=d.num_warps,
                **fields)
    for page, idx in idxs.items():
        if page == 16:
            grid = list(itertools.product((32, 64, 128, 256), (1, 2, 3, 4, 6), (2, 3), (2, 4)))
            grid += [(bk, sp, 1, 1) for bk in (64, 128) for sp in (1, 2, 4)]
        else:   # the page pattern's five fastest
            ok = sorted((r for r in records if "time_us" in r and not r.get("default") and not r.get("fused")),
                        key=lambda r: r["time_us"])
            grid = [(r["block_k"], r["num_splits"], r["num_stages"], r["num_warps"]) for r in ok[:5]]
        for bk, sp, st, nw in grid:
            bs = pk.BlockSizes(block_m=64, block_k=bk, num_splits=sp, num_stages=st, num_warps=nw)
            measure(f"page={page} block_k={bk} splits={sp} stages={st} warps={nw}",
                    lambda q, k, v, i, bs=bs: call(q, k, v, i, bs), (q, k_all, v_all, idx), page=page,
                    block_k=bk, num_splits=sp, num_stages=st, num_warps=nw, **fields)
    ok = [r for r in records if "time_us" in r]
    summary = {}
    for page in (16, 1):
        rs = [r for r in ok if r["page"] == page]
        if rs:
            best = min(rs, key=lambda r: r["time_us"])
            summary[f"page{page}"] = {"best": best["label"], "best_us": best["time_us"],
                                      "default_us": next((r["time_us"] for r in rs if r.get("default")), None),
                                      "fused_us": next((r["time_us"] for r in rs if r.get("fused")), None)}
    write_json(a.out, records, summary)
    print(summary)


if __name__ == "__main__":
    main()
