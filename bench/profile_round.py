"""Where a speculative round's GPU time goes: per-piece wall time and per-kernel device time from a profile.

    PYTHONPATH=. python bench/profile_round.py --out $OUT/profile_round.json [--shape 8000x64] [--no-trace]

At one (L, B) shape, jits the pieces of one round exactly as bench/spec.py's time split does (the gamma
sparse draft steps, the full-attention verification + acceptance, the per-round selection) for each method,
plus one plain one-token decode step (ar). Each piece: median wall time of --reps calls, then (unless
--no-trace) a jax.profiler trace of --trace-calls calls whose Perfetto JSON is summed per kernel name:
kernels per call, device-busy time per call (the sum of kernel durations; wall - busy ~ launch gaps), and the
top kernels by time. Run it twice with different XLA_FLAGS to compare compiler settings on the same pieces.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import base_record, write_json  # noqa: E402
from bench.spec import (GREEDY, _CachedTokenizer, _median_time, _pieces, _shape, make_prompts,  # noqa: E402
                        method_spec, prompt_sources)
import jspec  # noqa: E402
from jspec import api, decoding as gen, kv_cache, model  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.speculative import engine  # noqa: E402


def read_trace(trace_dir):
    """(events, {pid: process name}) of the newest Perfetto trace under trace_dir, or None."""
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)) or \
        sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True))
    if not files:
        return None
    with gzip.open(files[-1], "rt") as f:
        tr = json.load(f)
    events = tr["traceEvents"] if isinstance(tr, dict) else tr
    pname = {e["pid"]: e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    return events, pname


def is_device(process_name):
    return "GPU" in process_name.upper() and "HOST" not in process_name.upper()


def kernel_table(trace, n_calls):
    """{name: [total_us, count]} per call of the trace's device-side events, and the trace's process names."""
    events, pname = trace
    dev = {p for p, n in pname.items() if is_device(n)}
    tab = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") == "X" and e.get("pid") in dev:
            t = tab[e["name"]]
            t[0] += float(e.get("dur", 0.0))
            t[1] += 1
    return {k: [v[0] / n_calls, v[1] / n_calls] for k, v in tab.items()}, sorted(set(pname.values()))


def timeline(trace):
    """Every complete ("X") event of the trace as compact rows [process, thread, name, ts_us, dur_us], by time."""
    events, pname = trace
    rows = [[pname.get(e.get("pid"), str(e.get("pid"))), e.get("tid"), e.get("name", "")[:100],
             float(e.get("ts", 0.0)), float(e.get("dur", 0.0))] for e in events if e.get("ph") == "X"]
    return sorted(rows, key=lambda r: r[3])


def device_gaps(rows, top=10):
    """Idle time on the busiest device stream between consecutive kernels, summed by the kernel that waited:
    (total gap us, [(name, gap us, count)...]) -- where wall time beyond the kernels' sum goes."""
    dev = [r for r in rows if is_device(r[0])]
    if not dev:
        return 0.0, []
    by_stream = defaultdict(list)
    for r in dev:
        by_stream[(r[0], r[1])].append(r)
    stream = max(by_stream.values(), key=len)
    acc = defaultdict(lambda: [0.0, 0])
    end = stream[0][3] + stream[0][4]
    for r in stream[1:]:
        gap = r[3] - end
        if 0 < gap < 1000:   # gaps over 1 ms lie between traced calls (host-side dispatch, not the program)
            acc[r[2]][0] += gap
            acc[r[2]][1] += 1
        end = max(end, r[3] + r[4])
    ranked = sorted(acc.items(), key=lambda kv: -kv[1][0])
    return sum(v[0] for v in acc.values()), [(k[:80], round(v[0], 1), v[1]) for k, v in ranked[:top]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--impl", default="pallas", choices=["xla", "pallas", "auto"])
    ap.add_argument("--shape", default="8000x64")
    ap.add_argument("--methods", default="vegas,streaming", help="also vegas-sort (XLA's sort for the top-k)")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--trace-calls", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--pieces", default="", help="only these pieces (e.g. vegas_verify,streaming_verify); verify "
                    "pieces without their draft piece verify a fixed dummy draft (same cost)")
    ap.add_argument("--timeline", default="", help="write every traced event (device + host) here (.json.gz)")
    ap.add_argument("--loops", type=int, default=0,
                    help="also time whole generation loops of this many new tokens (ar and each method): the "
                         "while_loop overhead that per-piece timings leave out")
    ap.add_argument("--tag", default="", help="a label for this run (e.g. the XLA_FLAGS variant)")
    ap.add_argument("--corpus", default="/root/jspec-cache/corpus")
    a = ap.parse_args()
    L, B = _shape(a.shape)
    impl = {"xla": AttnImpl(backend="xla"), "pallas": AttnImpl(backend="pallas"), "auto": AttnImpl()}[a.impl]
    m = jspec.load(a.model)
    cfg, params = m.cfg, m.params
    tok = _CachedTokenizer(m.tokenizer)
    code, prose = prompt_sources(a.corpus)
    prompts, _ = make_prompts(tok, L, B, code, prose)
    tokens = jnp.asarray(prompts)
    lens = jnp.full((B,), L, jnp.int32)
    last = tokens[:, -1]
    cap = int(-(-(L + 64) // 128) * 128)
    cache = api.new_cache(m, batch=B, capacity=cap)
    logits, cache = jax.jit(gen.prefill, static_argnames=("cfg", "impl"), donate_argnames=("cache",))(
        params, cfg, tokens, lens, cache, impl=impl)
    key = jax.random.key(0)

    def ar_step(params, cache, tok):
        lg, c, _ = model.forward(params, cfg, tok[:, None], cache, impl=impl)
        return lg[:, 0].argmax(-1), kv_cache.rollback(c, cache.lengths)

    only = {p for p in a.pieces.split(",") if p}

    def wanted(piece):
        return not only or piece in only

    pieces = {}
    c_ar = jax.jit(ar_step, donate_argnums=1)
    fresh = jax.jit(lambda c: jax.tree.map(jnp.copy, c))   # each piece family owns a copy of the prefilled cache
    box = {"cache": fresh(cache)}

    def run_ar():
        t, box["cache"] = c_ar(params, box["cache"], last)
        return t

    pieces["ar_step"] = run_ar
    states = {}
    for name in a.methods.split(","):
        spec = method_spec(name, gamma=a.gamma, budget=a.budget)
        draft, verify, select = _pieces(cfg, spec, impl)
        st = {"state": engine.prepare(params, cfg, spec, fresh(cache), logits, last, impl=impl)}
        states[name] = st
        c_d, c_v, c_s = jax.jit(draft, donate_argnums=1), jax.jit(verify, donate_argnums=1), jax.jit(select)
        q = jax.random.normal(jax.random.key(1), (cfg.n_layers, B, cfg.n_heads, cfg.head_dim))

        def run_d(st=st, c_d=c_d):
            d, st["state"] = c_d(params, st["state"], last, key)
            st["drafts"] = d
            return d

        def run_v(st=st, c_v=c_v):
            n, _, sc, st["state"] = c_v(params, st["state"], last, st["drafts"], key)
            st["scores"] = sc
            return n

        def run_s(st=st, c_s=c_s, q=q):
            return c_s(st["state"], st["scores"], q)

        pieces[f"{name}_draft"], pieces[f"{name}_verify"], pieces[f"{name}_select"] = run_d, run_v, run_s
        if wanted(f"{name}_draft"):
            run_d()   # fill drafts (and compile)
        else:
            st["drafts"] = jnp.tile(last[:, None], (1, a.gamma))
        if wanted(f"{name}_verify") or wanted(f"{name}_select"):
            run_v()   # fill scores (and compile)
    loop_boxes = {}
    timers = {}   # pieces that need an untimed set-up per call: name -> (setup, run)
    if a.loops:
        c_dec = jax.jit(gen.decode, static_argnames=("cfg", "samp", "max_new_tokens", "stop_tokens", "impl"),
                        donate_argnames=("cache",))
        lbox = {"cache": fresh(cache)}

        def ar_loop():
            out, _, c = c_dec(params, cfg, GREEDY, lbox["cache"], logits, key, max_new_tokens=a.loops, impl=impl)
            lbox["cache"] = kv_cache.rollback(c, lens)
            return out

        pieces["ar_loop"] = ar_loop
        for name in a.methods.split(","):
            spec = method_spec(name, gamma=a.gamma, budget=a.budget)
            mbox = {"cache": fresh(cache)}

            def setup(spec=spec, mbox=mbox):
                mbox["state"] = engine.prepare(params, cfg, spec, mbox["cache"], logits, last, impl=impl)
                jax.block_until_ready(mbox["state"])

            def run(spec=spec, mbox=mbox):
                out, _, st, final = engine.run_donating(params, cfg, spec, GREEDY, mbox["state"], key, a.loops,
                                                        impl=impl)
                mbox["cache"] = kv_cache.rollback(final.cache, lens)
                mbox["stats"] = st
                return out

            timers[f"{name}_loop"] = (setup, run)
            loop_boxes[f"{name}_loop"] = mbox
            pieces[f"{name}_loop"] = run
    del cache

    def median_wall(name, fn, n):
        if name not in timers:
            return _median_time(fn, n)
        setup, run = timers[name]
        ts = []
        for _ in range(n):
            setup()
            t = time.perf_counter()
            jax.block_until_ready(run())
            ts.append(time.perf_counter() - t)
        return float(np.median(ts))

    records, timelines = [], {}
    trace_root = tempfile.mkdtemp(prefix="jspec-trace-")
    for name, fn in pieces.items():
        if not wanted(name):
            continue
        for _ in range(2):
            median_wall(name, fn, 1)
        wall = median_wall(name, fn, a.reps)
        rec = base_record(kind="piece", piece=name, L=L, B=B, gamma=a.gamma, budget=a.budget, tag=a.tag,
                          xla_flags=os.environ.get("XLA_FLAGS", ""), wall_ms=round(1e3 * wall, 3))
        if not a.no_trace and not name.endswith("_loop"):   # loops: wall time only
            d = os.path.join(trace_root, name)
            jax.profiler.start_trace(d, create_perfetto_trace=True)
            for _ in range(a.trace_calls):
                jax.block_until_ready(fn())
            jax.profiler.stop_trace()
            trace = read_trace(d)
            if trace:
                tab, devs = kernel_table(trace, a.trace_calls)
                busy = sum(v[0] for v in tab.values())
                top = sorted(tab.items(), key=lambda kv: -kv[1][0])[:a.top]
                rows = timeline(trace)
                gap_us, gap_top = device_gaps(rows)
                rec.update(device_gap_ms=round(gap_us / a.trace_calls / 1e3, 3),
                           gaps_before=[{"kernel": k, "us_per_call": round(g / a.trace_calls, 1),
                                         "count_per_call": round(c / a.trace_calls, 1)} for k, g, c in gap_top])
                if a.timeline:
                    timelines[name] = rows
                rec.update(device_busy_ms=round(busy / 1e3, 3), kernels_per_call=round(sum(v[1] for v in tab.values()), 1),
                           trace_processes=devs,
                           top_kernels=[{"name": k[:120], "us_per_call": round(v[0], 1), "count_per_call": round(v[1], 1)}
                                        for k, v in top])
        if name in loop_boxes:
            rec.update(new_tokens=a.loops, tau=round(loop_boxes[name]["stats"].tau(), 3))
        if name.endswith("_loop"):
            rec["tokens_per_s"] = round(B * (a.loops - 1) / wall, 1)
        records.append(rec)
        print(json.dumps({k: rec.get(k) for k in ("piece", "wall_ms", "device_busy_ms", "kernels_per_call", "tau",
                                                  "tokens_per_s")}),
              flush=True)
        for t in rec.get("top_kernels", [])[:8]:
            print(f"    {t['us_per_call']:9.1f} us  x{t['count_per_call']:<6} {t['name']}", flush=True)
        if "device_gap_ms" in rec:
            print(f"    idle between kernels: {rec['device_gap_ms']} ms per call; largest before:", flush=True)
            for g in rec["gaps_before"][:6]:
                print(f"    {g['us_per_call']:9.1f} us  x{g['count_per_call']:<6} {g['kernel']}", flush=True)
        if a.timeline and timelines:   # rewritten after every piece: a cut run keeps what it traced
            with gzip.open(a.timeline, "wt") as f:
                json.dump(timelines, f)
    write_json(a.out, records, {"shape": a.shape, "tag": a.tag, "xla_flags": os.environ.get("XLA_FLAGS", "")})


if __name__ == "__main__":
    main()
