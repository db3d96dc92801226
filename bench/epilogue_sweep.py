"""How fast can the "weights" epilogue (flash_scores.score_weights) be at B=64, L=8000 (SmolLM2, K=3, G=3)?

    PYTHONPATH=. python bench/epilogue_sweep.py --out $OUT/epilogue_sweep_h200.json

Times score_weights on random float16 logits [B, K, 16, S] over block_s x num_warps, 30 launches in one
program (one per layer, as in a verification; the sum of their outputs adds ~1 small fusion each), next to
XLA reading the same rows (sum over heads and rows of exp(x - i)). Times are per launch.
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import base_record, write_json  # noqa: E402
from bench.kernels import time_fn  # noqa: E402

fs = importlib.import_module("pallas_kernels.flash_scores")
LAUNCHES = 30


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--S", type=int, default=8064)
    a = ap.parse_args()
    B, K, Rp, S, T, G = a.B, 3, 16, a.S, 5, 3
    sc = jax.random.normal(jax.random.key(0), (B, K, Rp, S), jnp.float16)
    lse = jnp.full((B, K, 16), 9.0, jnp.float32)
    kv_len = jnp.full((B,), 8000, jnp.int32)
    sel = jnp.asarray([0, 1, 2, 12, 13, 14, 0, 0], jnp.int32)
    st = jnp.asarray([0, 0, 0, 4, 4, 4, 0, 0], jnp.int32)
    sw = jnp.asarray([1, 1, 1, 1, 1, 1, 0, 0], jnp.float32)
    useful = B * K * 6 * 8000 * 2
    records = []
    for bs, nw in itertools.product((256, 512, 1024, 2048), (1, 2, 4, 8)):
        def fn(sc, lse, n, bs=bs, nw=nw):   # 30 launches in one program, as in a 30-layer verification
            return sum(fs.score_weights(sc, lse + i, n, sel, st, sw, T=T, block_s=bs, num_warps=nw)
                       for i in range(LAUNCHES))
        try:
            us = time_fn(fn, (sc, lse, kv_len), 5) * 1e6 / LAUNCHES
        except Exception as e:   # one failing configuration must not end the sweep
            records.append(base_record(kind="epilogue", block_s=bs, num_warps=nw, error=str(e)[:300]))
            continue
        records.append(base_record(kind="epilogue", block_s=bs, num_warps=nw, time_us=round(us, 2),
                                   tbps=round(useful / us / 1e6, 3)))
        print(f"score_weights block_s={bs:5d} warps={nw}: {us:7.2f} us", flush=True)
    def xla(sc):
        return sum(jnp.exp(sc[:, :, :6].astype(jnp.float32) - i).sum(axis=(1, 2)) for i in range(LAUNCHES))
    us = time_fn(xla, (sc,), 5) * 1e6 / LAUNCHES
    records.append(base_record(kind="xla_read", time_us=round(us, 2), tbps=round(useful / us / 1e6, 3)))
    print(f"xla read of the same rows: {us:7.2f} us", flush=True)
    best = min((r for r in records if "time_us" in r and r["kind"] == "epilogue"), key=lambda r: r["time_us"])
    write_json(a.out, records, {"best": {k: best[k] for k in ("block_s", "num_warps", "time_us")},
                                "xla_read_us": records[-1]["time_us"], "B": B, "S": S})
    print(np.round(best["time_us"], 2), best["block_s"], best["num_warps"])


if __name__ == "__main__":
    main()
