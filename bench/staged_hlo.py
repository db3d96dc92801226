"""What an on-device refill (continuous.run_staged) costs. Compiles run_until and run_staged at a served shape
and prints each program's temp memory and the copies of cache-sized buffers in XLA's optimized HLO; with
--time, also times calls that only refill (K rows marked done, K staged rows: the call swaps them in and
returns without a round) against `insert` of K rows, and sums a profiler trace of the former per kernel.

    PYTHONPATH=. python bench/staged_hlo.py [--shape 8000x16 --refill 4 --method longspec] [--time]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.spec import GREEDY, _shape  # noqa: E402
import jspec  # noqa: E402
from jspec import api  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.speculative import SpecConfig, engine  # noqa: E402
from jspec.speculative import continuous as sv  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8000x16")
    ap.add_argument("--refill", type=int, default=4)
    ap.add_argument("--method", default="longspec")
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--loop-ab", action="store_true",
                    help="time and trace a whole decode (every row to its end) by run_until and by run_staged "
                         "with nothing staged: the cost of the refill check alone")
    a = ap.parse_args()
    L, B = _shape(a.shape)
    m = jspec.load("smollm2-135m", dtype="float32" if jax.default_backend() == "cpu" else None)
    impl = AttnImpl(backend="pallas" if jax.default_backend() == "gpu" else "xla")
    drafter = None
    spec = SpecConfig(a.method, gamma=4, budget=512, tree_widths=(2, 2, 2, 2, 2))
    if a.method == "longspec":
        d = api.load_drafter_for(m, None)
        spec, drafter = dataclasses.replace(spec, window=d.window), d.params
    cap = int(-(-(L + a.new + 16) // 128) * 128)

    def started(rows):
        toks = jax.random.randint(jax.random.key(rows), (rows, L), 4, m.cfg.vocab_size)
        return engine.start(spec, GREEDY, engine.init(m.params, m.cfg, spec, toks, jnp.full((rows,), L, jnp.int32),
                                                      cap, impl=impl, drafter=drafter), jax.random.key(0), a.new)

    st = jax.eval_shape(lambda: started(B))
    stage = jax.eval_shape(lambda: started(a.refill))
    axes = sv.batch_axes(st, jax.eval_shape(lambda: started(1)))
    dtype = "bf16" if st.cache.k.dtype == jnp.bfloat16 else "f32"
    cache_shape = "%s[%s]" % (dtype, ",".join(map(str, st.cache.k.shape)))
    retired = jax.ShapeDtypeStruct((B,), jnp.bool_)
    progs = {
        "run_until": sv.run_until.lower(m.params, m.cfg, spec, GREEDY, st, retired, a.new, (), impl, drafter,
                                        jnp.int32(1)),
        "run_staged": sv.run_staged.lower(m.params, m.cfg, spec, GREEDY, st, retired, stage, jnp.int32(a.refill),
                                          axes, a.new, (), impl, drafter),
    }
    for name, low in progs.items():
        comp = low.compile()
        mem = comp.memory_analysis()
        txt = comp.as_text()
        copies = [ln.strip()[:160] for ln in txt.splitlines()
                  if re.search(r"\bcopy(-start)?\(", ln) and cache_shape in ln.split("=")[1][:80]]
        print(f"{name}: temp {mem.temp_size_in_bytes / 2**30:.2f} GiB, args {mem.argument_size_in_bytes / 2**30:.2f} "
              f"GiB, cache {cache_shape}: {len(copies)} copies of cache-shaped buffers", flush=True)
        for c in copies[:6]:
            print("   ", c)
    if a.time:
        time_refills(m, spec, impl, drafter, started, axes, a, B)
    if a.loop_ab:
        loop_ab(m, spec, impl, drafter, started, axes, a, B)


def _trace_table(fn, n=1):
    import tempfile

    from bench.profile_round import kernel_table, read_trace
    d = tempfile.mkdtemp()
    jax.profiler.start_trace(d, create_perfetto_trace=True)
    for _ in range(n):
        fn()
    jax.profiler.stop_trace()
    trace = read_trace(d)
    return kernel_table(trace, n)[0] if trace else {}


def loop_ab(m, spec, impl, drafter, started, axes, a, B):
    import time
    retired = jnp.zeros((B,), bool)
    stage = started(a.refill)
    progs = {
        "run_until": lambda st: sv.run_until(m.params, m.cfg, spec, GREEDY, st, retired, a.new, (), impl, drafter,
                                             jnp.int32(B + 1)),
        "run_staged(n_stage=0)": lambda st: sv.run_staged(m.params, m.cfg, spec, GREEDY, st, retired, stage,
                                                          jnp.int32(0), axes, a.new, (), impl, drafter)[0],
    }
    tables = {}
    for name, fn in progs.items():
        jax.block_until_ready(fn(started(B)))            # compile
        st = started(B)
        jax.block_until_ready(st)
        t = time.perf_counter()
        st = fn(st)
        jax.block_until_ready(st)
        wall = time.perf_counter() - t
        it = int(st.rounds.max())
        tables[name] = _trace_table(lambda: jax.block_until_ready(fn(started(B))))
        dev = sum(v[0] for v in tables[name].values())
        print(f"{name}: {it} rounds, {1e3 * wall:.1f} ms wall ({1e3 * wall / it:.3f} ms per round); traced call "
              f"(prefill included): {dev / 1e3:.1f} ms device, {sum(v[1] for v in tables[name].values()):.0f} "
              f"kernels", flush=True)
    (n1, t1), (n2, t2) = tables.items()
    diff = sorted(set(t1) | set(t2), key=lambda k: -abs(t2.get(k, [0, 0])[0] - t1.get(k, [0, 0])[0]))[:10]
    print("largest per-kernel differences (us, count) " + n1 + " -> " + n2 + ":")
    for k in diff:
        print(f"   {k[:60]}: {t1.get(k, [0, 0])[0]:.0f} x{t1.get(k, [0, 0])[1]:g} -> "
              f"{t2.get(k, [0, 0])[0]:.0f} x{t2.get(k, [0, 0])[1]:g}")


def time_refills(m, spec, impl, drafter, started, axes, a, B):
    import time

    import numpy as np
    K = a.refill
    st, stage = started(B), started(K)
    retired = jnp.zeros((B,), bool)
    rows = jnp.arange(K, dtype=jnp.int32)

    def swaps(st):   # K rows done -> the call swaps K staged rows in and returns
        st = st.replace(done=st.done.at[:K].set(True))
        return sv.run_staged(m.params, m.cfg, spec, GREEDY, st, retired, stage, jnp.int32(K), axes, a.new, (),
                             impl, drafter)

    def inserts(st):
        return (sv.insert(st, stage, rows, axes),)

    for name, fn in (("run_staged_K_swaps", swaps), ("insert_K_rows", inserts)):
        st = fn(st)[0]
        jax.block_until_ready(st)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            out = fn(st)
            jax.block_until_ready(out)
            st = out[0]
            times.append(time.perf_counter() - t)
        print(f"{name}: K={K}: {1e3 * np.median(times):.2f} ms per call (median of 5)", flush=True)
        box = [st]

        def one_call():
            box[0] = jax.block_until_ready(fn(box[0])[0])
        tab = _trace_table(one_call, 3)
        st = box[0]
        if tab:
            top = sorted(tab.items(), key=lambda kv: -kv[1][0])[:8]
            total = sum(v[0] for v in tab.values())
            print(f"   device {total:.0f} us per call; " + "; ".join(f"{n[:40]} {v[0]:.0f} us x{v[1]:g}"
                                                                  for n, v in top), flush=True)


if __name__ == "__main__":
    main()
