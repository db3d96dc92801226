"""How fast are the fused dense launches (pallas_kernels/dense.py) at SmolLM2's decode shapes, per config?

    PYTHONPATH=. python bench/dense_sweep.py --out $OUT/dense_sweep_h200.json [--rows 64,320]

For each mode (qkv_rope; glu; residual after attention, Kd = N*H; residual after the MLP, Kd = F) and row
count M, times 30 launches in one program (one per layer of stacked random bf16 weights, as in a forward)
over block_n x max_chunk x num_warps, next to XLA doing the same step the way jspec.model's XLA path does
(RMSNorm fusion, cuBLAS GEMM, RoPE / SwiGLU / residual fusions). Times are per launch (per layer).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import base_record, write_json  # noqa: E402
from bench.kernels import time_fn  # noqa: E402
from jspec import model  # noqa: E402
from jspec.config import ModelConfig  # noqa: E402
from pallas_kernels import dense as Dn  # noqa: E402

L = 30


def xla_step(mode, cfg, x, w, i, nw, aux):
    """The same step as jspec.model's XLA path."""
    if mode == "qkv_rope":
        K, G, H = cfg.n_kv_heads, cfg.group, cfg.head_dim
        h = model.rms_norm(x, nw[i], cfg.norm_eps)
        y = jnp.dot(h, w[i]).reshape(x.shape[0], 1, K, G + 2, H)
        pos = aux.reshape(-1, 1)
        q = model.rope(y[:, :, :, :G].reshape(x.shape[0], 1, K * G, H), pos, cfg)
        k = model.rope(y[:, :, :, G], pos, cfg)
        return q, k, y[:, :, :, G + 1]
    if mode == "glu":
        h = model.rms_norm(x, nw[i], cfg.norm_eps)
        g, u = jnp.split(jnp.dot(h, w[i]), 2, axis=1)
        return jax.nn.silu(g) * u
    return aux + jnp.dot(x, w[i], preferred_element_type=jnp.float32).astype(x.dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="64,320")
    ap.add_argument("--budget-s", type=float, default=400)
    a = ap.parse_args()
    t_end = time.time() + a.budget_s
    cfg = ModelConfig(arch="llama", vocab_size=49152, d_model=576, n_layers=L, n_heads=9, n_kv_heads=3,
                      head_dim=64, ffn_dim=1536, rope_theta=100000.0)
    D, F, N, K, G, H = 576, 1536, 9, 3, 3, 64
    bf = jnp.bfloat16
    seeds = itertools.count()

    def rnd(shape, scale=0.05):
        return (scale * jax.random.normal(jax.random.key(next(seeds)), shape)).astype(bf)

    nw = (1 + rnd((L, D), 0.1).astype(jnp.float32)).astype(bf)
    shapes = {"qkv_rope": (D, K * (G + 2) * H), "glu": (D, 2 * F), "residual_o": (N * H, D), "residual_down": (F, D)}
    weights = {m: rnd((L,) + s) for m, s in shapes.items()}
    inv = model._inv_freq(cfg)
    records = []
    for M, (name, (kd, nc)) in itertools.product([int(r) for r in a.rows.split(",")], shapes.items()):
        mode = "residual" if name.startswith("residual") else name
        x = rnd((M, kd), 1.0)
        aux = jax.random.randint(jax.random.key(next(seeds)), (M,), 0, 8000) if mode == "qkv_rope" else (
            rnd((M, nc), 1.0) if mode == "residual" else None)
        w = weights[name]
        t = time_fn(lambda x, w, nw, aux: [xla_step(mode, cfg, x, w, i, nw, aux) for i in range(L)], (x, w, nw, aux), 5)
        base = base_record(kind="xla", mode=name, M=M, us_per_launch=round(t / L * 1e6, 2))
        records.append(base)
        print(base, flush=True)
        grid = itertools.product((64,) if mode == "qkv_rope" else (16, 32, 64), (64, 128, 256, 512), (2, 4))
        for bn, mc, nwarps in grid:
            if time.time() > t_end:
                break
            kw = dict(mode=mode, norm_w=nw if mode != "residual" else None, aux=aux, block_n=bn, max_chunk=mc,
                      num_warps=nwarps, eps=cfg.norm_eps)
            if mode == "qkv_rope":
                kw.update(inv_freq=inv, head_dim=H, groups=G)
            try:
                t = time_fn(lambda x, w, nw, aux, kw=kw: [Dn.dense_kernel(x, w, i, **{**kw, "norm_w": nw if mode != "residual" else None, "aux": aux})
                                                          for i in range(L)], (x, w, nw, aux), 5)
                rec = base_record(kind="pallas", mode=name, M=M, block_n=bn, max_chunk=mc, num_warps=nwarps,
                                  us_per_launch=round(t / L * 1e6, 2))
            except Exception as e:  # noqa: BLE001 -- a config Triton cannot compile is a result too
                rec = base_record(kind="pallas", mode=name, M=M, block_n=bn, max_chunk=mc, num_warps=nwarps,
                                  error=f"{type(e).__name__}: {str(e)[:200]}")
            records.append(rec)
            print(rec, flush=True)
    best = {}
    for r in records:
        if r["kind"] == "pallas" and "us_per_launch" in r:
            k = f'{r["mode"]}_M{r["M"]}'
            if k not in best or r["us_per_launch"] < best[k]["us_per_launch"]:
                best[k] = {f: r[f] for f in ("us_per_launch", "block_n", "max_chunk", "num_warps")}
    xla = {f'{r["mode"]}_M{r["M"]}': r["us_per_launch"] for r in records if r["kind"] == "xla"}
    write_json(a.out, records, {"best_pallas": best, "xla_us": xla,
                                "command": "PYTHONPATH=. python bench/dense_sweep.py --out $OUT/dense_sweep_h200.json"})
    for k in best:
        print(f"{k}: pallas {best[k]} vs xla {xla.get(k)} us")


if __name__ == "__main__":
    main()
