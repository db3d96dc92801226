"""Where does a drafter training step's time go? Wall time per step and, from a profiler trace, device time by
kernel (bench.common.trace_table).

    PYTHONPATH=. python bench/profile_train.py --out $OUT/prof_train_h200.json [--batch 16 --seq-len 2048]
        [--objective distill] [--attn pallas|xla] [--steps 6]

The step is `jspec.offline.train_drafter._train_step` as `jspec train-drafter` runs it (anchor-offset positions,
noisy cross-attention, the chosen objective), on random tokens (timing does not depend on the text). On a
CPU (a smoke test: --batch 1 --seq-len 64 --attn xla) the trace holds no kernels.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import base_record, kind, trace_table, write_json  # noqa: E402
import jspec  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.offline import train_drafter as T  # noqa: E402
from jspec.drafter.model import init_drafter_params  # noqa: E402
from jspec.drafter.positions import sample_anchor_positions, sample_lag  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--objective", default="distill", choices=T.OBJECTIVES)
    ap.add_argument("--attn", default="pallas", choices=["pallas", "xla"],
                    help="the target forward's attention (train-drafter's default: pallas where it runs)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps (after two compiling ones)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    m = jspec.load(a.model, progress=False)
    cfg, tparams = m.cfg, m.params
    hp = T.HParams(window=a.window, distill=a.objective == "distill")
    impl = AttnImpl(backend=None if a.attn == "pallas" else a.attn)
    dparams = init_drafter_params(cfg, jax.random.key(0), target_params=tparams)
    opt = T.make_optimizer(hp, 0.0).init(dparams)
    rng = np.random.default_rng(0)
    toks = jnp.asarray(rng.integers(0, cfg.vocab_size, (a.batch, a.seq_len)), jnp.int32)
    pos = jnp.asarray(sample_anchor_positions(rng, a.batch, a.seq_len, cfg.max_position))
    lag = jnp.int32(sample_lag(rng))
    box = [dparams, opt]

    def step():
        box[0], box[1], met = T._train_step(box[0], box[1], tparams, toks, pos, lag, jnp.float32(1e-4), cfg=cfg,
                                            hp=hp, impl=impl)
        return met

    t0 = time.perf_counter()
    jax.block_until_ready(step())
    jax.block_until_ready(step())    # optax's first update changes the state's weak types: one more compile
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(a.steps):
        met = step()
    jax.block_until_ready(met)
    step_s = (time.perf_counter() - t0) / a.steps
    tab = trace_table(lambda: jax.block_until_ready(step()))
    kinds = {}
    for k, (us, n) in tab.items():
        e = kinds.setdefault(kind(k), [0.0, 0.0])
        e[0] += us
        e[1] += n
    rec = base_record(tag=a.tag, batch=a.batch, seq_len=a.seq_len, objective=a.objective, attn=a.attn,
                      step_ms=round(1e3 * step_s, 2), tokens_per_s=round(a.batch * a.seq_len / step_s, 1),
                      compile_s=round(compile_s, 1), device_ms_per_step=round(sum(v[0] for v in tab.values()) / 1e3, 2),
                      kernels_per_step=int(sum(v[1] for v in tab.values())),
                      by_kind={k: [round(v[0], 1), int(v[1])]
                               for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0])},
                      top_kernels=[[k[:80], round(v[0], 1), int(v[1])]
                                   for k, v in sorted(tab.items(), key=lambda kv: -kv[1][0])[:a.top]])
    print(json.dumps({k: v for k, v in rec.items() if k != "top_kernels"}), flush=True)
    for row in rec["top_kernels"][:15]:
        print("   ", row, flush=True)
    write_json(a.out, [rec], {"command": "bench/profile_train.py " + " ".join(sys.argv[1:])})


if __name__ == "__main__":
    main()
