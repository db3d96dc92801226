"""LongSpec on the real SmolLM2-135M, one GPU: trained drafter, chain and tree drafts, vs ar and vegas.

    PYTHONPATH=. python bench/longspec.py [--out $OUT/longspec_h200.json] [--quick] [--impl xla|pallas|auto]
        [--drafter DIR] [--lengths 8000,4096,2048] [--batches 16,64,1] [--temps 0,1] [--widths 4,16,16,16,16|tuned]

For each prompt length L and batch B (held-out text: prose rows from --corpus when present, alternating with
stdlib code rows the drafter was not trained on), one prefill serves every run (the cache is rolled back to
the prompt between runs): `ar` (jspec.decoding), `vegas` (SpecConfig("vegas", gamma=4, budget=512)) and
longspec in chain (gamma drafter steps) and tree (--widths; "tuned": the drafter's tuned.json shape for each
batch size, as `jspec generate` drafts it) mode, each at temperature 0 (greedy) and 1 (plain
sampling), --new tokens with stop tokens ignored. Records: tau (mean tokens per target verification) and the
accepted-length histogram, tokens/s (B * (new - 1) / decode time, as bench/decode.py and bench/spec.py),
speedup over ar and over vegas at the same temperature, agreement with ar's greedy tokens (bf16 near-ties can
flip an argmax: reported, not asserted; tests/test_longspec.py shows float32 identity). At the sweep shape
(default L=8000, B=16, greedy) tree sizes from --sweep-widths give tau (and tokens/s) vs tree size.

Compile time dominates (about a minute per program on the H200, README "Performance notes"), so programs are
shared: every L of one batch size uses one cache capacity (the longest L's) and one prompt width, so the
prefill, prepare and decode programs exist once per B, not per (L, B). That is faithful with the Pallas
kernels (--impl auto/pallas: attention, and the drafter's cross-attention, loop over the valid length only);
--impl xla, whose attention reads the whole capacity, compiles per (L, B) instead. Vegas' per-round top-k
still scans the capacity (a small cost). Every program is lowered first, then compiled in a thread pool
(--jobs); shapes come in priority order and the lowest-priority ones are dropped when the projected time
exceeds --budget-s.
Without a drafter at --drafter, a random one is used (tau ~1: timing only) and the JSON says so.
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
from bench.common import CompilePool, base_record, peak_memory_bytes, row_stats, write_json  # noqa: E402
import jspec  # noqa: E402
from jspec import decoding as gen, kv_cache  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.config import SamplingConfig  # noqa: E402
from jspec.drafter import init_drafter_params, load_drafter  # noqa: E402
from jspec.speculative import SpecConfig, engine  # noqa: E402
# Prompts exactly as bench/spec.py builds them; its CODE_MODULES and the corpus's Emma / Sense and
# Sensibility are held out from the drafter's training text (bench/drafter_h200.sh).
from bench.spec import _CachedTokenizer, _shape, make_prompts, prompt_sources  # noqa: E402

DEFAULT_DRAFTER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "checkpoints", "drafters", "smollm2-135m")
SWEEP_WIDTHS = "1,1,1,1,1;2,4,4,4;4,8,8,8,8;4,16,16,16,16;8,32,32,32"


def _ints(s):
    return tuple(int(x) for x in s.split(",") if x)


def _label(spec):
    if spec is None:
        return "ar"
    if spec.method != "longspec":
        return spec.method
    return f"longspec-{spec.mode}" + (f"+lookup{spec.lookup}" if spec.lookup else "")


def _profile_round(compiled, P, spec, prep, params, dparams, cache, logits, last, tokens, lens, key, top=15):
    """One more greedy run of `spec` under jax.profiler: device time per round and the top kernels by device
    time per round (names as the trace gives them: Pallas kernels by function name, XLA fusions by HLO name).
    Returns (profile dict, cache rolled back to the prompt, logits)."""
    import tempfile

    from bench.profile_round import device_gaps, kernel_table, read_trace, timeline

    state = compiled[("prepare", P, prep)](params, cache, logits, last, drafter=dparams, prompt_tokens=tokens)
    jax.block_until_ready(state)
    with tempfile.TemporaryDirectory() as td:
        with jax.profiler.trace(td):
            t0 = time.perf_counter()
            out, _, st, final = compiled[("run", P, spec, 0.0)](params, state, key, drafter=dparams)
            out.block_until_ready()
            wall = time.perf_counter() - t0
        trace = read_trace(td)
    rounds = max(int(np.asarray(st.rounds).max()), 1)
    tab, _ = kernel_table(trace, rounds) if trace else ({}, None)
    rows = sorted(tab.items(), key=lambda kv: -kv[1][0])
    idle_us, waited = device_gaps(timeline(trace)) if trace else (0.0, [])
    prof = dict(rounds=rounds, wall_ms_per_round=round(1e3 * wall / rounds, 3),
                device_ms_per_round=round(sum(v[0] for v in tab.values()) / 1e3, 3),
                idle_ms_per_round=round(idle_us / 1e3 / rounds, 3),
                idle_before=[dict(name=n, us_per_round=round(g / rounds, 1), count_per_round=round(c / rounds, 2))
                             for n, g, c in waited],
                top_kernels=[dict(name=k[:100], us_per_round=round(v[0], 1), launches_per_round=round(v[1], 2))
                             for k, v in rows[:top]])
    return prof, kv_cache.rollback(final.cache, lens), final.logits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "bench/results"), "longspec.json"))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER, help="a drafter dir (jspec.drafter.load_drafter)")
    ap.add_argument("--impl", default="auto", choices=["xla", "pallas", "auto"])
    ap.add_argument("--lengths", default="8000,4096,2048")
    ap.add_argument("--batches", default="16,64,1")
    ap.add_argument("--temps", default="0,1", help="temperatures (0: greedy)")
    ap.add_argument("--modes", default="tree,chain")
    ap.add_argument("--widths", default="4,16,16,16,16",
                    help="tree widths per level, or 'tuned': the drafter's tuned shape for each batch size")
    ap.add_argument("--gamma", type=int, default=0, help="chain length (0: the tree's depth)")
    ap.add_argument("--lookups", default="", help="greedy runs of every mode also with a prompt-lookup chain of "
                                                  "each of these lengths (SpecConfig.lookup), e.g. 4,8")
    ap.add_argument("--vegas-gamma", type=int, default=4)
    ap.add_argument("--vegas-budget", type=int, default=512)
    ap.add_argument("--sweep-widths", default=SWEEP_WIDTHS, help="';'-separated tree sizes (greedy, sweep shape)")
    ap.add_argument("--sweep-shape", default="8000x16")
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2,
                    help="runs per config, the fastest kept (the first run of a fresh executable is a warm-up: "
                         "one-time loading made it ~30%% slower on the H200)")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 4), help="parallel compiles")
    ap.add_argument("--corpus", default="/root/jspec-cache/heldout", help="dir of held-out *.txt prose")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="wall-clock target: shapes (lowest priority first) are dropped when it would be exceeded")
    ap.add_argument("--profile", default="",
                    help="';'-separated trees to profile once more at the sweep shape (greedy) under jax.profiler: "
                         "device time per round and its top kernels go to the summary")
    ap.add_argument("--plan-only", action="store_true")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: one tiny shape, small trees")
    a = ap.parse_args()
    if a.quick:
        a.lengths, a.batches, a.new, a.sweep_widths = "160", "2", 12, "1,1;2,2,2"
        a.widths = "tuned" if a.widths == "tuned" else "2,3,3"
        a.sweep_shape = "160x2"
        a.budget_s = max(a.budget_s, 1800.0)
    t_start = time.perf_counter()
    impl = {"xla": AttnImpl(backend="xla"), "pallas": AttnImpl(backend="pallas"), "auto": AttnImpl()}[a.impl]

    # CPU matmuls in bf16 are emulated and slow: the smoke test runs in float32 there.
    m = jspec.load(a.model, dtype="float32" if jax.default_backend() == "cpu" else None, progress=False)
    cfg, params = m.cfg, m.params
    tuned = a.widths == "tuned"
    if os.path.isfile(os.path.join(a.drafter, "config.json")):
        d = load_drafter(a.drafter)
        dparams, window, drafter_name = d.params, d.window, os.path.abspath(a.drafter)
        if tuned and d.widths_for(1) is None:
            raise SystemExit(f"error: --widths tuned: the drafter at {a.drafter} has no tuned.json")
    else:
        if tuned:
            raise SystemExit(f"error: --widths tuned needs a drafter with tuned shapes; none at {a.drafter}")
        print(f"no drafter at {a.drafter}: using a RANDOM drafter (tau ~1, timing only)", flush=True)
        dparams = init_drafter_params(cfg, jax.random.key(0), target_params=params, dtype=jnp.dtype(cfg.dtype))
        window, drafter_name = 512, "random"
    tok = _CachedTokenizer(m.tokenizer)
    code, prose = prompt_sources(a.corpus)
    print(f"prompt sources: code ({len(code)} held-out stdlib modules)" +
          (f" + prose ({len(prose)} files from {a.corpus})" if prose else " only (no prose corpus)"), flush=True)

    Ls, Bs, temps = _ints(a.lengths), _ints(a.batches), [float(t) for t in a.temps.split(",") if t]
    sweep = _shape(a.sweep_shape)

    def widths_for(B):   # the grid's tree at batch B
        return tuple(d.widths_for(B)) if tuned else _ints(a.widths)

    widths = widths_for(sweep[1])
    sweep_widths = [_ints(w) for w in a.sweep_widths.split(";") if w]
    samps = {t: SamplingConfig(temperature=t) for t in temps}

    def longspec(mode, w, lookup=0):
        return SpecConfig("longspec", mode=mode, gamma=a.gamma or len(w), tree_widths=w, window=window, lookup=lookup)

    lookups = [g for g in _ints(a.lookups) if g > 0] if a.lookups else []

    vegas = SpecConfig("vegas", gamma=a.vegas_gamma, budget=a.vegas_budget)
    modes = [x for x in a.modes.split(",") if x]

    # ---- the plan: shapes in priority order (the sweep shape, then long contexts first, B=16 before 64, 1)
    shapes = sorted({(L, B) for L in Ls for B in Bs} | {sweep},
                    key=lambda s: (s != sweep, -s[0], {16: 0, 64: 1, 1: 2}.get(s[1], 3), s[1]))
    plan = {}
    for s in shapes:
        cfgs = []
        for t in temps:
            cfgs += [("grid", None, t), ("grid", vegas, t)] + [("grid", longspec(mo, widths_for(s[1])), t)
                                                                for mo in modes]
            if t == 0.0:   # prompt-lookup chains: greedy rows only (what the grid measures)
                cfgs += [("grid", longspec(mo, widths_for(s[1]), g), t) for mo in modes for g in lookups]
        if s == sweep:
            for w in sweep_widths:
                spec = longspec("tree", w)
                if ("grid", spec, 0.0) not in cfgs:
                    cfgs.append(("widths_sweep", spec, 0.0))
        if s not in {(L, B) for L in Ls for B in Bs}:   # a sweep-only shape: greedy ar, vegas and trees
            cfgs = [c for c in cfgs if c[2] == 0.0 and (c[1] is None or c[1].method != "longspec"
                                                        or c[1].mode == "tree")]
        plan[s] = cfgs
    margin = max(sp.capacity_margin() for c in plan.values() for _, sp, _ in c if sp is not None)
    # Shared programs (see the module docstring): one capacity and prompt width per B, unless --impl xla.
    share = a.impl != "xla"
    Lmax = max(s[0] for s in plan)
    pkey = (lambda L, B: B) if share else (lambda L, B: (L, B))
    width = (lambda L: Lmax) if share else (lambda L: L)
    # The longspec State only depends on the drafter's window: one prepare program serves every tree.
    # (with a lookup chain it also records the tokens by slot: one more program for any chain length)
    prep_spec = lambda sp: SpecConfig("longspec", window=window, lookup=min(sp.lookup, 1)) if sp.method == "longspec" else sp
    print(f"drafter: {drafter_name} (window {window}); plan: {len(plan)} shapes, "
          f"{sum(len(c) for c in plan.values())} runs", flush=True)
    for s_, cfgs in plan.items():
        print(f"  L={s_[0]} B={s_[1]}: " + ", ".join(f"{_label(sp)}{'' if sp is None or sp.method != 'longspec' else sp.widths}"
                                                    f"@T{t:g}" for _, sp, t in cfgs), flush=True)
    if a.plan_only:
        return

    # ---- lower (main thread), compile in a pool (XLA releases the GIL)
    key = jax.random.key(0)
    cp = CompilePool(a.jobs, t_start, first_guess_s=30.0)
    submit, projected_end = cp.submit, cp.projected_end

    skipped, caps = [], {}
    for (L, B), cfgs in list(plan.items()):
        if projected_end() > 0.55 * a.budget_s and (L, B) != sweep:
            print(f"dropping L={L} B={B}: compiles would run past the --budget-s target", flush=True)
            skipped.append(f"L{L}_B{B}")
            del plan[(L, B)]
            continue
        P = pkey(L, B)
        cap = caps[P] = int(-(-(width(L) + a.new + margin) // 128) * 128)
        cache_sds = jax.eval_shape(lambda: kv_cache.init(cfg, batch=B, capacity=cap))
        tok_sds = jax.ShapeDtypeStruct((B, width(L)), jnp.int32)
        vec_sds = jax.ShapeDtypeStruct((B,), jnp.int32)
        logit_sds = jax.ShapeDtypeStruct((B, cfg.vocab_size), jnp.float32)
        submit(("prefill", P), lambda: gen.prefill.lower(params, cfg, tok_sds, vec_sds, cache_sds, impl=impl))
        for _, spec, t in cfgs:
            samp = samps.get(t, SamplingConfig(temperature=t))
            if spec is None:
                submit(("ar", P, t), lambda: gen.decode.lower(params, cfg, samp, cache_sds, logit_sds, key,
                                                                max_new_tokens=a.new, stop_tokens=(), impl=impl))
                continue
            extra = dict(drafter=dparams, prompt_tokens=tok_sds) if spec.method == "longspec" else {}
            state_sds = jax.eval_shape(lambda p, c, lg, v, kw: engine._prepare(p, cfg, spec, c, lg, v, impl, **kw),
                                       params, cache_sds, logit_sds, vec_sds, extra)
            submit(("prepare", P, prep_spec(spec)), lambda: engine.prepare.lower(
                params, cfg, prep_spec(spec), cache_sds, logit_sds, vec_sds, impl=impl, **extra))
            run_kw = dict(drafter=dparams) if spec.method == "longspec" else {}
            submit(("run", P, spec, t), lambda: engine.run_donating.lower(params, cfg, spec, samp, state_sds, key,
                                                                             a.new, stop_tokens=(), impl=impl,
                                                                             **run_kw))
    compiled = cp.results()
    compile_s = time.perf_counter() - t_start

    # ---- run
    records, profiles = [], {}
    for (L, B), cfgs in plan.items():
        if time.perf_counter() - t_start > 0.92 * a.budget_s and (L, B) != sweep:
            print(f"skipping L={L} B={B}: past {0.92 * a.budget_s:.0f} s of the --budget-s target", flush=True)
            skipped.append(f"L{L}_B{B}")
            continue
        P = pkey(L, B)
        prompts, sources = make_prompts(tok, L, B, code, prose)
        last = jnp.asarray(prompts[:, -1])
        tokens = jnp.asarray(np.pad(prompts, ((0, 0), (0, width(L) - L))))      # right-padded to the shared width
        lens = jnp.full((B,), L, jnp.int32)
        cache = kv_cache.init(cfg, batch=B, capacity=caps[P])
        logits, cache = compiled[("prefill", P)](params, tokens, lens, cache)
        ar = {}    # temperature -> (tokens, tokens/s)
        vg = {}    # temperature -> tokens/s
        for group, spec, t in cfgs:
            best, out, st = None, None, None
            for _ in range(max(1, a.reps)):
                if spec is None:
                    t0 = time.perf_counter()
                    out, _, cache = compiled[("ar", P, t)](params, cache, logits, key)
                    out.block_until_ready()
                    dt = time.perf_counter() - t0
                else:
                    kw = dict(drafter=dparams, prompt_tokens=tokens) if spec.method == "longspec" else {}
                    state = compiled[("prepare", P, prep_spec(spec))](params, cache, logits, last, **kw)
                    jax.block_until_ready(state)
                    run_kw = dict(drafter=dparams) if spec.method == "longspec" else {}
                    t0 = time.perf_counter()
                    out, _, st, final = compiled[("run", P, spec, t)](params, state, key, **run_kw)
                    out.block_until_ready()
                    dt = time.perf_counter() - t0
                    cache, logits = final.cache, final.logits
                cache = kv_cache.rollback(cache, lens)
                best = dt if best is None else min(best, dt)
            out = np.asarray(out)
            tps = B * (a.new - 1) / best
            rec = base_record(model=a.model, impl=a.impl, drafter=drafter_name, L=L, B=B, T=t, new_tokens=a.new,
                              capacity=caps[P],
                              group=group, sources=sorted(set(sources)), decode_s=round(best, 4),
                              tokens_per_s=round(tps, 1), label=_label(spec))
            if spec is None:
                ar[t] = (out, tps)
                rec.update(method="ar", mode=None, widths=None, gamma=0, tau=1.0, speedup_vs_ar=1.0)
            else:
                hist = np.asarray(st.accept_hist)
                rounds = np.asarray(st.rounds)
                if spec.method == "vegas":
                    vg[t] = tps
                ls = spec.method == "longspec"
                rec.update(method=spec.method, mode=spec.mode if ls else None,
                           widths=list(spec.widths) if ls else None, gamma=spec.depth,
                           draft_tokens=sum(spec.widths), knobs=spec.describe(), tau=round(st.tau(), 3),
                           accept_hist=hist.sum(0).tolist(), rounds_max=int(rounds.max()),
                           round_s=round(best / max(int(rounds.max()), 1), 5),
                           speedup_vs_ar=round(tps / ar[t][1], 3) if t in ar else None, **row_stats(st))
                for src in sorted(set(sources)):
                    rows = np.array([s == src for s in sources])
                    h = hist[rows].sum(0)
                    rec[f"tau_{src}"] = round(float((h * np.arange(1, h.size + 1)).sum() / max(h.sum(), 1)), 3)
            rec["speedup_vs_vegas"] = round(tps / vg[t], 3) if t in vg else None
            if t == 0.0 and t in ar:
                same = (out == ar[t][0]).all(1)
                rec["agree_with_ar"] = round(float(same.mean()), 3)
                prefix = np.where(same, a.new, (out != ar[t][0]).argmax(1))
                rec["match_prefix_frac"] = round(float(prefix.mean()) / a.new, 3)
            rec["peak_memory_gb"] = round((peak_memory_bytes() or 0) / 1e9, 2)
            records.append(rec)
            print(json.dumps({k: rec.get(k) for k in ("label", "L", "B", "T", "widths", "group", "tau",
                                                      "tokens_per_s", "speedup_vs_ar", "speedup_vs_vegas",
                                                      "agree_with_ar", "tau_row_min", "straggler")}), flush=True)
        if (L, B) == sweep and a.profile:
            for w in [_ints(x) for x in a.profile.split(";") if x]:
                spec = longspec("tree", w)
                if ("run", P, spec, 0.0) not in compiled:
                    print(f"--profile {w}: not among the sweep shape's greedy trees, skipped", flush=True)
                    continue
                prof, cache, logits = _profile_round(compiled, P, spec, prep_spec(spec), params, dparams, cache,
                                                     logits, last, tokens, lens, key)
                profiles[",".join(map(str, w))] = prof
                keys = ("rounds", "wall_ms_per_round", "device_ms_per_round", "idle_ms_per_round", "idle_before")
                print(json.dumps({"profile": w, **{k: prof[k] for k in keys}}), flush=True)
        del cache, logits

    summary = _summary(records, sweep, widths)
    if profiles:
        summary["profile_L{}_B{}".format(*sweep)] = profiles
    st = cp.stats()
    train = os.path.join(a.drafter, "summary.json")   # train_drafter.py's summary, kept with the checkpoint
    if drafter_name != "random" and os.path.isfile(train):
        with open(train) as f:
            # the whole training script's wall time (tokenization, calibration, compiles, evals included)
            summary["drafter_train_minutes"] = round(json.load(f)["wall_s"] / 60, 1)
    summary.update(drafter=drafter_name, compile_s=round(compile_s, 1), programs=st["programs"],
                   compile_each_s_mean=st["compile_each_s_mean"],
                   wall_s=round(time.perf_counter() - t_start, 1), skipped=skipped)
    write_json(a.out, records, summary)
    _table(records, summary)


def _find(records, label, L, B, T=0.0, widths=None, group="grid"):
    for r in records:
        if r["label"] == label and r["L"] == L and r["B"] == B and r["T"] == T and r["group"] in (group, "grid") \
                and (widths is None or r.get("widths") == list(widths)):
            return r
    return None


def _summary(records, sweep, widths):
    """Headline numbers at L=8000 (or the longest L run), B=16 (or the sweep shape's B)."""
    Lmax = max((r["L"] for r in records), default=0)
    L = 8000 if any(r["L"] == 8000 for r in records) else Lmax
    out = {"shape": f"L{L}_B{sweep[1]}", "widths": list(widths)}
    for T in (0.0, 1.0):
        sfx = "" if T == 0.0 else "_T1"
        for mode in ("tree", "chain"):
            r = _find(records, f"longspec-{mode}", L, sweep[1], T)
            out[f"longspec_tau_{mode}_L8000{sfx}"] = r and r["tau"]
            out[f"longspec_{mode}_speedup_vs_ar_L8000_B{sweep[1]}{sfx}"] = r and r["speedup_vs_ar"]
            out[f"longspec_{mode}_speedup_vs_vegas_L8000_B{sweep[1]}{sfx}"] = r and r["speedup_vs_vegas"]
        v = _find(records, "vegas", L, sweep[1], T)
        out[f"vegas_tau_L8000{sfx}"] = v and v["tau"]
    r16 = _find(records, "longspec-tree", L, 16)   # the headline shape, whatever the sweep shape
    out["longspec_speedup_vs_ar_L8000_B16"] = r16 and r16["speedup_vs_ar"]
    best = {}
    for r in records:
        if r["method"] == "longspec" and r["T"] == 0.0 and r["L"] == L:
            k = f"B{r['B']}"
            if k not in best or r["speedup_vs_ar"] > best[k]["speedup_vs_ar"]:
                best[k] = r
    out["longspec_best_speedup_vs_ar_L8000"] = {k: {"speedup": r["speedup_vs_ar"], "label": r["label"],
                                                    "widths": r["widths"]} for k, r in sorted(best.items())}
    out["tau_by_tree_size"] = {str(sum(r["widths"])) + ":" + ",".join(map(str, r["widths"])):
                               {"tau": r["tau"], "tokens_per_s": r["tokens_per_s"]}
                               for r in records if r["method"] == "longspec" and (r["L"], r["B"]) == sweep
                               and r["T"] == 0.0 and r["mode"] == "tree" and not r["knobs"].get("lookup")}
    for r in records:   # prompt-lookup chains (--lookups) at L=8000 (or the longest L)
        if r["method"] == "longspec" and r["knobs"].get("lookup") and r["L"] == L:
            out[f"{r['label']}_speedup_vs_ar_L8000_B{r['B']}"] = r["speedup_vs_ar"]
            out[f"{r['label']}_tau_L8000_B{r['B']}"] = r["tau"]
    agree = [r["agree_with_ar"] for r in records if r["method"] != "ar" and "agree_with_ar" in r]
    out["agree_with_ar_mean"] = round(float(np.mean(agree)), 3) if agree else None
    return out


def _table(records, summary):
    print("\n label             L    B   T widths              tau   tok/s  x ar  x vegas")
    for r in records:
        w = ",".join(map(str, r["widths"])) if r.get("widths") else "-"
        sv = r.get("speedup_vs_vegas")
        print(f" {r['label']:<15} {r['L']:5d} {r['B']:4d} {r['T']:3g} {w:<16} {r['tau']:6.2f} {r['tokens_per_s']:7.0f}"
              f" {r['speedup_vs_ar'] or 0:5.2f} {sv if sv is not None else float('nan'):8.2f}")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
