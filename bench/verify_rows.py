"""Vegas' verification attention (flash_scores with Collect-2-Query rows 0 and T-1) per layer at T = gamma+1
query rows, in the isolated sweep's setting and in the model's (why does gamma 5 cost more than one draft step?).

    PYTHONPATH=. python bench/verify_rows.py --out $OUT/verify_rows_h200.json [--Ts 5,6,7 --B 64]

Settings: "isolated" is bench/flash_sweep.py's (layer 1 of a 2-layer [2, B, 8064, K, H] cache, every row at
kv_len 8000); "model" is bench/round_table.py's L=8000 shape (a 30-layer cache of capacity 8192, rows at ragged
kv_len 8000..8128, all 30 layers in one program with the layer index traced, as the decode loop runs them).
`--kernel sparse` times a draft step's sparse_attention in the same settings instead.
Each T runs with the default BlockSizes and, where T*G > 16 (32-row programs), also with 16-row programs
(two row blocks per KV head). Times are per layer: one program's median wall time / layers.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import base_record, write_json  # noqa: E402
from bench.kernels import time_fn  # noqa: E402
from bench.profile_round import kernel_table, read_trace  # noqa: E402
import pallas_kernels as pk  # noqa: E402
from pallas_kernels import _common as C  # noqa: E402

N, K, H = 9, 3, 64   # SmolLM2-135M attention


def setting(name: str, B: int, rng):
    """(layers, S, kv_len before the T new tokens) of one setting: isolated, model, or one of the model's
    differences alone (layers30, S8192, ragged)."""
    layers = 30 if name in ("model", "layers30") else 2
    S = 8192 if name in ("model", "S8192") else 8064
    base = rng.integers(8000, 8129 - 8, B) if name in ("model", "ragged") else np.full(B, 8000)
    return layers, S, base


def _label(bs) -> str:
    return "default" if bs is None else f"{bs.block_m}x{bs.block_k} w{bs.num_warps} s{bs.num_stages}"


def profile(fn, args, layers: int) -> dict:
    """{kernel: device us per layer} of one traced call (the five longest)."""
    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            jax.block_until_ready(compiled(*args))
        trace = read_trace(d)
    if trace is None:
        return {}
    tab = kernel_table(trace, layers)[0]
    top = sorted(tab.items(), key=lambda kv: -kv[1][0])[:5]
    return {k[:60]: round(v[0], 1) for k, v in top}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--Ts", default="5,6,7")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--settings", default="isolated,model", help="also layers30, S8192, ragged")
    ap.add_argument("--profile", action="store_true", help="also a device trace per config: time per kernel")
    ap.add_argument("--grid", action="store_true", help="also block_k x num_warps x num_stages at the default rows")
    ap.add_argument("--kernel", default="flash", choices=["flash", "sparse"],
                    help="sparse: a Vegas draft step's sparse_attention (--Ts 1) over --budget slots per layer")
    ap.add_argument("--budget", type=int, default=512)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    records = []
    for name in a.settings.split(","):
        layers, S, base = setting(name, a.B, rng)
        kk, kv, kq = jax.random.split(jax.random.key(0), 3)
        k_all = jax.random.normal(kk, (layers, a.B, S, K, H), jnp.bfloat16)
        v_all = jax.random.normal(kv, (layers, a.B, S, K, H), jnp.bfloat16)
        if a.kernel == "sparse":   # each layer's own selection: a.budget slots in aligned pages of 8
            pages = np.stack([np.sort(rng.choice(7992 // 8, a.budget // 8, replace=False))
                              for _ in range(layers * a.B)])
            idx = jnp.asarray((pages[:, :, None] * 8 + np.arange(8)).reshape(layers, a.B, a.budget), jnp.int32)
            n_valid = jnp.full((layers, a.B), a.budget, jnp.int32)
        for T in (int(t) for t in a.Ts.split(",")):
            q = jax.random.normal(kq, (a.B, T, N, H), jnp.bfloat16)
            kv_len = jnp.asarray(base + T, jnp.int32)
            blocks = [None] + ([pk.BlockSizes(block_m=16, block_k=128, num_warps=4, num_stages=2)]
                               if T * (N // K) > 16 and a.kernel == "flash" else [])
            if a.grid:
                blocks += [pk.BlockSizes(block_m=C.row_block(T * (N // K), 64), block_k=bk, num_warps=w,
                                         num_stages=st) for bk in (64, 128) for w in (4, 8) for st in (2, 3)]
            for bs in blocks:
                first = 1 if layers == 2 else 0

                def run(q, k_all, v_all, kv_len, bs=bs, first=first):
                    def body(layer, acc):
                        if a.kernel == "sparse":
                            out = pk.sparse_attention_kernel(q, k_all, v_all, idx, n_valid, kv_len, block_sizes=bs,
                                                             layer=layer)[0]
                            return acc + out.astype(jnp.float32).sum()
                        out, _, sc = pk.flash_scores_kernel(q, k_all, v_all, kv_len, score_rows=(0, T - 1),
                                                            block_sizes=bs, layer=layer)
                        return acc + out.astype(jnp.float32).sum() + sc.sum()
                    return jax.lax.fori_loop(first, layers, body, jnp.float32(0))

                per_layer = time_fn(run, (q, k_all, v_all, kv_len), a.reps) / (layers - first)
                rec = base_record(kernel=a.kernel, setting=name, T=T, B=a.B, S=S, layers=layers,
                                  block=_label(bs), us_per_layer=round(per_layer * 1e6, 1))
                if a.profile:
                    rec["kernels_us_per_layer"] = profile(run, (q, k_all, v_all, kv_len), layers - first)
                print(rec["setting"], "T", T, rec["block"], rec["us_per_layer"], "us/layer",
                      rec.get("kernels_us_per_layer", ""), flush=True)
                records.append(rec)
        del k_all, v_all
    write_json(a.out, records, {"command": "bench/verify_rows.py " + " ".join(sys.argv[1:])})


if __name__ == "__main__":
    main()
