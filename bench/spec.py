"""Self-speculative decoding of the real SmolLM2-135M on one GPU: ar vs streaming vs quest vs vegas.

    PYTHONPATH=. python bench/spec.py --out $OUT/spec_h200.json [--quick] [--impl xla|pallas|auto] [--devices N]

--devices N: tensor parallel over the first N GPUs (jspec/sharding.py: heads and cache sharded); the time
split is then skipped (its pieces are compiled for one device's layouts).

For each prompt length L and batch B (real text: stdlib code, plus prose rows when --corpus exists), one
prefill serves every method (the cache is rolled back to the prompt between runs), then each method decodes
--new tokens greedily with stop tokens ignored, in one jitted while_loop. Records per run: tau (mean tokens
per target verification) and the accepted-length histogram, tokens/s (B*(new-1) / decode time, as
bench/decode.py), speedup over ar in the same run, and agreement with ar's tokens. In bfloat16, a sequence
can leave ar's path at a near-tie of the top-2 logits (verification computes the cache entries in
(gamma+1)-token forwards, ar in one-token forwards; tests/test_speculative_smollm2.py shows float32 is exact),
so agreement is reported, not asserted.

Extras at the sweep shape (default L=8000, B=16): budget sweep for vegas and streaming (tau vs budget), gamma
sweep for vegas, and the vegas ablations (all gamma+1 rows instead of Collect-2-Query; raw logits instead of
softmax weights). Time split at the split shape (default L=8000, B=64): the draft (gamma sparse steps),
verification (+ acceptance) and selection pieces jitted separately on the same shapes, median of a few calls.

Compile time dominates (~25 s per program on the H200), so with --impl pallas/auto programs are shared across
prompt lengths: every L of one batch size B uses one cache capacity (the longest L's) and one prompt width
(prompts right-padded, prefilled with their real lengths), so the prefill, ar, prepare, run and time-split
programs exist once per B, not per (L, B). That is faithful because Pallas attention loops over the valid
length only; vegas' top-k and quest's page scoring still scan the capacity (a small cost). --impl xla, whose
attention reads the whole capacity, compiles per (L, B) instead. Records carry the cache capacity used. Every
program is lowered first and compiled in a thread pool (--jobs), then everything runs with the GPU to itself;
shapes come in priority order, and those that would need new programs are dropped when the projected compile
time exceeds --budget-s.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import CompilePool, base_record, peak_memory_bytes, row_stats, write_json  # noqa: E402
import jspec  # noqa: E402
from jspec import api, data, decoding as gen, kv_cache, selection, sharding  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.config import SamplingConfig  # noqa: E402
from jspec.speculative import SpecConfig, engine  # noqa: E402

GREEDY = SamplingConfig()
CODE_MODULES = data.DEFAULT_STDLIB_MODULES + ("collections/__init__", "functools", "pathlib", "subprocess")


class _CachedTokenizer:
    """long_prompts re-encodes its texts on every call; encode each text once."""

    def __init__(self, tok):
        self.tok, self.memo = tok, {}

    def encode(self, text, add_special_tokens=False):
        if text not in self.memo:
            self.memo[text] = self.tok.encode(text, add_special_tokens=add_special_tokens)
        return self.memo[text]


def _shape(s):
    L, B = s.lower().split("x")
    return int(L), int(B)


def prompt_sources(corpus):
    """(code texts, prose texts or None): the CODE_MODULES present, and the *.txt files under `corpus` (each cut
    to 400K characters to bound tokenizing time) when that folder exists.

    On a GPU a missing prose folder is an error (a whole H200 grid once ran on code rows alone because the
    prose was not staged, and its tau was not comparable with the grids before it); set
    JSPEC_BENCH_CODE_ONLY=1 to run on code rows on purpose. On the CPU (smoke tests) it falls back quietly."""
    code = []
    for mod in CODE_MODULES:
        try:
            code.append(data.stdlib_text(mod))
        except FileNotFoundError:
            pass
    prose = None
    if corpus and os.path.isdir(corpus):
        try:
            prose = [t[:400_000] for t in data.read_dir(corpus, exts=(".txt",))]
        except FileNotFoundError:
            prose = None
    if prose is None and jax.default_backend() != "cpu" and os.environ.get("JSPEC_BENCH_CODE_ONLY") != "1":
        raise SystemExit(f"error: no prose *.txt under --corpus {corpus!r}: stage the held-out texts there "
                         f"(../shared/gpu/README.md), or set JSPEC_BENCH_CODE_ONLY=1 to run on code rows only")
    return code, prose


def make_prompts(tok, L, B, code, prose):
    """[B, L] int32; rows alternate code / prose when a prose source exists (B = 1: code)."""
    n_prose = B // 2 if prose else 0
    code_rows = data.long_prompts(tok, L, B - n_prose, texts=code)
    prose_rows = data.long_prompts(tok, L, n_prose, texts=prose) if n_prose else []
    rows, sources = [], []
    for i in range(B):   # interleave: code, prose, code, prose, ...
        src = "prose" if i % 2 and len(prose_rows) > i // 2 else "code"
        rows.append(prose_rows[i // 2] if src == "prose" else code_rows.pop(0))
        sources.append(src)
    return np.asarray(rows, np.int32), sources


# ------------------------------------------------------------------------------------------ time split

def _pieces(cfg, spec, impl):
    """Three jittable pieces of one round on a State (donated and handed back, lengths unchanged)."""
    m = engine.METHOD_MODULES[spec.method]

    def draft(params, state, last, key):
        base = state.cache.lengths
        drafts, _, cache = engine.draft(params, cfg, spec, GREEDY, state.method, state.cache, last, key, impl)
        return drafts, state.replace(cache=kv_cache.rollback(cache, base))

    def verify(params, state, last, drafts, key):
        base = state.cache.lengths
        logits, cache, scores = engine.verify(params, cfg, spec, state.cache, last, drafts, impl)
        n, nxt = engine.accept(GREEDY, drafts, None, logits, key)
        return n, nxt, scores, state.replace(cache=kv_cache.rollback(cache, base))

    def select(state, scores, q):
        """Per-round selection work (update + begin_round); for quest also its per-step page selection
        (gamma steps x L layers), which in a real round runs inside the draft forwards."""
        lengths = state.cache.lengths
        mstate = m.update(spec, state.method, state.cache, scores, lengths)
        sel = m.begin_round(spec, cfg, mstate, lengths)
        if spec.method == "quest":
            page = spec.page_size
            per_layer = jax.vmap(functools.partial(selection.quest_select, max_pages=spec.slots // page, page=page),
                                 in_axes=(0, 0, 0, None, None))
            outs = [per_layer(q + j, sel.mins, sel.maxs, sel.n_complete, sel.n_pages)[0] for j in range(spec.gamma)]
            return mstate, jnp.stack(outs)
        return mstate, sel

    return draft, verify, select


def _median_time(fn, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


# ------------------------------------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--impl", default="xla", choices=["xla", "pallas", "auto"])
    ap.add_argument("--lengths", default="8000,4096,2048")
    ap.add_argument("--batches", default="64,16,1")
    ap.add_argument("--methods", default="streaming,quest,vegas",
                    help="comma-separated; vegas-sort = vegas with XLA's sort for its top-k (vegas: the select "
                         "kernel); vegas-pageN = vegas selecting aligned pages of N slots")
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget", type=int, default=512, help="KV slots of every method's draft selection")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--gammas", default="2,4,6", help="gamma sweep at the sweep shape")
    ap.add_argument("--gamma-methods", default="vegas", help="methods of the gamma sweep (e.g. vegas,streaming)")
    ap.add_argument("--budgets", default="128,256,512,1024", help="budget sweep of the --sweep-methods")
    ap.add_argument("--sweep-methods", default="vegas,streaming", help="methods of the budget sweep")
    ap.add_argument("--sweep-shape", default="8000x16")
    ap.add_argument("--split-shape", default="8000x64")
    ap.add_argument("--reps", type=int, default=2, help="timed runs per config (the fastest is kept)")
    ap.add_argument("--split-reps", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 4), help="parallel compiles")
    ap.add_argument("--corpus", default="/root/jspec-cache/corpus",
                    help="dir of *.txt prose (required on a GPU unless JSPEC_BENCH_CODE_ONLY=1)")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="wall-clock target: shapes (lowest priority first) are dropped when it would be exceeded")
    ap.add_argument("--no-ablation", action="store_true", help="leave out the vegas ablations at the sweep shape")
    ap.add_argument("--plan-only", action="store_true", help="print the shapes and configs, then exit")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dense-rows", type=int, default=None,
                    help="AttnImpl.dense_rows (fused Pallas dense layers for steps of <= this many tokens; 0: off)")
    ap.add_argument("--devices", type=int, default=1, help="tensor parallelism over the first N devices")
    ap.add_argument("--no-fuse", action="store_true", help="keep the stored weight layout (separate q/k/v and "
                    "gate/up weights) instead of jspec.load's fused one: an A/B of model.fuse_projections")
    # Share programs across L even with --impl xla (testing the sharing on CPU; its timings are distorted).
    ap.add_argument("--share-lengths", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.quick:
        a.lengths, a.batches, a.new, a.gammas, a.budgets = "2048", "16,1", 64, "2,4", "256,512"
        a.sweep_shape = a.split_shape = "2048x16"
    t_start = time.perf_counter()
    impl = {"xla": AttnImpl(backend="xla"), "pallas": AttnImpl(backend="pallas"), "auto": AttnImpl()}[a.impl]
    if a.dense_rows is not None:
        impl = dataclasses.replace(impl, dense_rows=a.dense_rows)

    # CPU matmuls in bf16 are emulated and slow: CPU smoke tests run in float32 (as bench/longspec.py).
    m = jspec.load(a.model, dtype="float32" if jax.default_backend() == "cpu" else None, devices=a.devices,
                   fuse=not a.no_fuse)
    cfg, params = m.cfg, m.params
    impl = api.attn_impl(m, impl)   # with a mesh the Pallas kernels run per head shard
    tok = _CachedTokenizer(m.tokenizer)
    code, prose = prompt_sources(a.corpus)
    print(f"prompt sources: code ({len(code)} stdlib modules)" + (f" + prose ({len(prose)} files)" if prose else
                                                                    " only (no prose corpus)"), flush=True)

    Ls = [int(x) for x in a.lengths.split(",")]
    Bs = [int(x) for x in a.batches.split(",")]
    methods = [x for x in a.methods.split(",") if x]
    gammas = sorted({int(x) for x in a.gammas.split(",")} | {a.gamma})
    budgets = sorted({int(x) for x in a.budgets.split(",")} | {a.budget})
    sweep, split = _shape(a.sweep_shape), _shape(a.split_shape)
    g_max = max(gammas) + max([method_spec(x).lookup for x in methods] + [0])   # the most slots a round writes ahead

    # Shared programs (see the module docstring): one capacity and prompt width per B, unless --impl xla.
    share = a.share_lengths or a.impl != "xla"
    pkey = (lambda L, B: (B,)) if share else (lambda L, B: (L, B))

    def spec_of(method, gamma=a.gamma, budget=a.budget, **kw):
        return method_spec(method, gamma=gamma, budget=budget, page_size=a.page_size, **kw)

    # ---- the plan: shapes in priority order, each with its configs (group, SpecConfig or None for ar)
    shapes = [(L, B) for L in Ls for B in Bs]
    for s in (sweep, split):
        if s not in shapes:
            shapes.append(s)
    plan = {}
    for s in shapes:
        cfgs = [("grid", None)] + [("grid", spec_of(x)) for x in methods]
        if s == sweep:
            cfgs += [("budget_sweep", spec_of(x, budget=b)) for x in a.sweep_methods.split(",") if x for b in budgets]
            cfgs += [("gamma_sweep", spec_of(x, gamma=g)) for x in a.gamma_methods.split(",") if x for g in gammas]
            if not a.no_ablation:
                cfgs += [("ablation", spec_of("vegas", collect="all")),
                         ("ablation", spec_of("vegas", score_mode="logits"))]
        seen, plan[s] = set(), []
        for group, spec in cfgs:   # a sweep point equal to a grid config is the grid config
            if spec not in seen:
                seen.add(spec)
                plan[s].append((group, spec))
    wmax = {}   # B -> the longest L planned with it: the shared prompt width
    for L, B in plan:
        wmax[B] = max(wmax.get(B, 0), L)
    width = (lambda L, B: wmax[B]) if share else (lambda L, B: L)

    def programs(L, B, cfgs):
        """Names of the compiled programs shape (L, B) runs (the same names for every L of a B under sharing)."""
        k = pkey(L, B)
        out = [("prefill", k)]
        for group, spec in cfgs:
            out += [("ar", k)] if spec is None else [("prepare", k, spec), ("run", k, spec)]
            if spec is not None and _split_of(spec, group, (L, B) == split, m.mesh):
                out += [(p, spec) for p in ("draft", "verify", "select")]
        return out

    # ---- lower everything (main thread, tracing), compile in a pool (XLA releases the GIL)
    key = jax.random.key(0)
    cp = CompilePool(a.jobs, t_start, first_guess_s=20.0)
    submit, projected_end = cp.submit, cp.projected_end

    n_programs = len({n for s_, cfgs in plan.items() for n in programs(*s_, cfgs)})
    print(f"plan: {len(plan)} shapes, {sum(len(c) for c in plan.values())} runs, {n_programs} programs"
          + (" (shared across L per B)" if share else ""), flush=True)
    for s_, cfgs in plan.items():
        print(f"  L={s_[0]} B={s_[1]}" + (f" (width {width(*s_)})" if share else "") + ": "
              + ", ".join("ar" if c is None else f"{_label(c)}(g{c.gamma},b{c.budget})" for _, c in cfgs), flush=True)
    if a.plan_only:
        return
    skipped = []
    caps = {}
    for (L, B), cfgs in list(plan.items()):
        if all(n in cp for n in programs(L, B, cfgs)):
            continue   # every program already queued by an earlier L of this B: nothing to lower
        # Lowering is serial and the compiles queue behind it: stop adding shapes (they come in priority
        # order) once lowering plus the queued compiles would take ~55% of the wall-clock target.
        if projected_end() > 0.55 * a.budget_s and (L, B) not in (sweep, split):
            print(f"dropping L={L} B={B}: compiles would run past the --budget-s target", flush=True)
            skipped.append(f"L{L}_B{B}")
            del plan[(L, B)]
            continue
        k = pkey(L, B)
        cap = caps[k] = int(-(-(width(L, B) + a.new + g_max + 1) // 128) * 128)
        cache_sds = jax.eval_shape(lambda: kv_cache.init(cfg, batch=B, capacity=cap))
        tok_sds = jax.ShapeDtypeStruct((B, width(L, B)), jnp.int32)
        vec_sds = jax.ShapeDtypeStruct((B,), jnp.int32)
        logit_sds = jax.ShapeDtypeStruct((B, cfg.vocab_size), jnp.float32)
        if m.mesh is not None:   # the compiled programs take sharded inputs: give the avals their layouts
            cache_sds = _laid_out(cache_sds, sharding.cache_sharding(m.mesh))
            tok_sds, vec_sds = (_laid_out(x, NamedSharding(m.mesh, P())) for x in (tok_sds, vec_sds))
        submit(("prefill", k), lambda: gen.prefill.lower(params, cfg, tok_sds, vec_sds, cache_sds, impl=impl))
        if m.mesh is not None:   # later programs take the prefill's outputs as laid out by it
            logit_sds, cache_sds = _laid_out(cp.result(("prefill", k)).out_info)
        for group, spec in cfgs:
            if spec is None:
                submit(("ar", k), lambda: gen.decode.lower(params, cfg, GREEDY, cache_sds, logit_sds, key,
                                                          max_new_tokens=a.new, stop_tokens=(), impl=impl))
                continue
            if ("run", k, spec) in cp and not ((L, B) == split and group == "grid"):
                continue   # shared with an earlier L of this B (the sweep shape's grid configs, say)
            text = {"prompt_tokens": tok_sds} if spec.lookup else {}   # the lookup reads the prompt
            state_sds = jax.eval_shape(lambda p, c, lg, t, kw: engine._prepare(p, cfg, spec, c, lg, t, impl, **kw),
                                       params, cache_sds, logit_sds, vec_sds, text)
            submit(("prepare", k, spec), lambda: engine.prepare.lower(params, cfg, spec, cache_sds, logit_sds,
                                                                      vec_sds, impl=impl, **text))
            if m.mesh is not None:
                state_sds = _laid_out(cp.result(("prepare", k, spec)).out_info)
            submit(("run", k, spec), lambda: engine.run_donating.lower(params, cfg, spec, GREEDY, state_sds, key,
                                                                       a.new, stop_tokens=(), impl=impl))
            if _split_of(spec, group, (L, B) == split, m.mesh):
                draft, verify, select = _pieces(cfg, spec, impl)
                gam = jax.ShapeDtypeStruct((B, spec.gamma), jnp.int32)
                _, _, sc_sds, _ = jax.eval_shape(verify, params, state_sds, vec_sds, gam, key)
                q_sds = jax.ShapeDtypeStruct((cfg.n_layers, B, cfg.n_heads, cfg.head_dim), jnp.float32)
                submit(("draft", spec), lambda: jax.jit(draft, donate_argnums=1).lower(params, state_sds, vec_sds, key))
                submit(("verify", spec), lambda: jax.jit(verify, donate_argnums=1).lower(params, state_sds, vec_sds,
                                                                                         gam, key))
                submit(("select", spec), lambda: jax.jit(select).lower(state_sds, sc_sds, q_sds))
    compiled = cp.results()
    compile_s = time.perf_counter() - t_start

    # ---- run
    records, splits = [], []
    for (L, B), cfgs in plan.items():
        if time.perf_counter() - t_start > 0.92 * a.budget_s and (L, B) not in (sweep, split):
            print(f"skipping L={L} B={B}: past {0.92 * a.budget_s:.0f} s of the --budget-s target", flush=True)
            skipped.append(f"L{L}_B{B}")
            continue
        k = pkey(L, B)
        prompts, sources = make_prompts(tok, L, B, code, prose)
        # Right-padded to the shared width (the prefill takes the real lengths); the drafts follow each
        # row's last real token.
        tokens = jnp.asarray(np.pad(prompts, ((0, 0), (0, width(L, B) - L))))
        last = jnp.asarray(prompts[:, L - 1])
        lens = jnp.full((B,), L, jnp.int32)
        if m.mesh is not None:
            tokens, lens, last = jax.device_put((tokens, lens, last), NamedSharding(m.mesh, P()))
        cache = api.new_cache(m, batch=B, capacity=caps[k])
        logits, cache = compiled[("prefill", k)](params, tokens, lens, cache)
        ar_out, ar_tps, ar_dt = None, None, None
        for group, spec in cfgs:
            best, out, st = None, None, None
            for _ in range(max(1, a.reps)):
                if spec is None:
                    t = time.perf_counter()
                    out, _, cache = compiled[("ar", k)](params, cache, logits, key)
                    out.block_until_ready()
                    dt = time.perf_counter() - t
                else:
                    state = compiled[("prepare", k, spec)](params, cache, logits, last,
                                                           **({"prompt_tokens": tokens} if spec.lookup else {}))
                    jax.block_until_ready(state)
                    t = time.perf_counter()
                    out, _, st, final = compiled[("run", k, spec)](params, state, key)
                    out.block_until_ready()
                    dt = time.perf_counter() - t
                    cache, logits = final.cache, final.logits
                cache = kv_cache.rollback(cache, lens)
                best = dt if best is None else min(best, dt)
            out = np.asarray(out)
            tps = B * (a.new - 1) / best
            rec = base_record(model=a.model, impl=a.impl, devices=a.devices, fused=not a.no_fuse, L=L, B=B,
                              new_tokens=a.new, group=group,
                              capacity=caps[k],
                              sources=sorted(set(sources)), decode_s=round(best, 4), tokens_per_s=round(tps, 1))
            if spec is None:
                ar_out, ar_tps = out, tps
                rec.update(method="ar", label="ar", gamma=0, budget=None, tau=1.0, speedup_vs_ar=1.0, agree_with_ar=1.0)
            else:
                hist = np.asarray(st.accept_hist)
                rounds = np.asarray(st.rounds)
                same = (out == ar_out).all(1)
                prefix = np.where(same, a.new, (out != ar_out).argmax(1))
                rec.update(method=_method(spec), label=_label(spec), gamma=spec.gamma, budget=spec.budget,
                           knobs=spec.describe(),
                           tau=round(st.tau(), 3), accept_hist=hist.sum(0).tolist(),
                           rounds_max=int(rounds.max()), round_s=round(best / max(int(rounds.max()), 1), 5),
                           speedup_vs_ar=round(tps / ar_tps, 3), agree_with_ar=round(float(same.mean()), 3),
                           match_prefix_frac=round(float(prefix.mean()) / a.new, 3), **row_stats(st))
                for src in sorted(set(sources)):
                    rows = np.array([s == src for s in sources])
                    h = hist[rows].sum(0)
                    rec[f"tau_{src}"] = round(float((h * np.arange(1, h.size + 1)).sum() / max(h.sum(), 1)), 3)
            rec["peak_memory_gb"] = round((peak_memory_bytes() or 0) / 1e9, 2)
            records.append(rec)
            print(json.dumps({k: rec[k] for k in ("label", "L", "B", "gamma", "budget", "group", "tau",
                                                  "tokens_per_s", "speedup_vs_ar", "agree_with_ar")}), flush=True)

        if (L, B) == split and m.mesh is None:
            for group, spec in cfgs:
                if spec is None or not _split_of(spec, group, True, None):
                    continue
                state = compiled[("prepare", k, spec)](params, cache, logits, last)
                c_draft, c_verify, c_select = (compiled[(p, spec)] for p in ("draft", "verify", "select"))
                q = jax.random.normal(jax.random.key(1), (cfg.n_layers, B, cfg.n_heads, cfg.head_dim))
                box = {"state": state}

                def run_draft():
                    d, box["state"] = c_draft(params, box["state"], last, key)
                    box["drafts"] = d
                    return d

                def run_verify():
                    n, nxt, sc, box["state"] = c_verify(params, box["state"], last, box["drafts"], key)
                    box["scores"] = sc
                    return n

                for _ in range(2):   # warm up (the first calls are slow even after compiling), fill drafts/scores
                    run_draft(), run_verify()
                draft_s = _median_time(run_draft, a.split_reps)
                verify_s = _median_time(run_verify, a.split_reps)
                select_s = _median_time(lambda: c_select(box["state"], box["scores"], q), a.split_reps)
                cache, logits = box["state"].cache, box["state"].logits
                # Quest's per-step page selection runs inside its draft forwards: don't count it twice.
                round_s = draft_s + verify_s + (0.0 if spec.method == "quest" else select_s)
                run_rec = next(r for r in records if r["method"] == _method(spec) and r["L"] == L and r["B"] == B
                               and r["group"] == "grid")
                s = base_record(kind="time_split", method=_method(spec), L=L, B=B, gamma=spec.gamma,
                                budget=spec.budget, draft_s=round(draft_s, 5), verify_s=round(verify_s, 5),
                                select_s=round(select_s, 5), pieces_round_s=round(round_s, 5),
                                measured_round_s=run_rec["round_s"],
                                draft_frac=round(draft_s / round_s, 3), verify_frac=round(verify_s / round_s, 3),
                                selection_frac=round(select_s / round_s, 3),
                                note="quest: select_s includes its per-step selection, which draft_s also contains"
                                if spec.method == "quest" else "")
                splits.append(s)
                print(json.dumps({k: s[k] for k in ("method", "draft_s", "verify_s", "select_s", "selection_frac",
                                                    "measured_round_s")}), flush=True)
        del cache, logits

    summary = _summary(records, splits, sweep, split, Ls, Bs, a)
    summary.update(compile_s=round(compile_s, 1), shared_programs=share, **cp.stats(),
                   wall_s=round(time.perf_counter() - t_start, 1), skipped=skipped)
    write_json(a.out, records + splits, summary)
    _table(records, splits, summary)


def _split_of(spec, group, at_split_shape, mesh):
    """Whether a config gets the offline draft / verify / select time split (grid configs at the split shape,
    one device; not with a lookup chain, whose pieces are not split out)."""
    return at_split_shape and group == "grid" and mesh is None and not spec.lookup


def _laid_out(avals, shardings=None):
    """ShapeDtypeStructs carrying `shardings` (a matching pytree or one sharding), or their own (a compiled
    program's out_info) without the memory layout."""
    if shardings is None:
        return jax.tree.map(lambda o: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=o.sharding), avals)
    if not isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda o, s: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=s), avals, shardings)
    return jax.tree.map(lambda o: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=shardings), avals)


def method_spec(name: str, **kw) -> SpecConfig:
    """SpecConfig for a benchmark method name: a speculative method, or "vegas-sort" (Vegas with XLA's sort
    for its top-k, SpecConfig.topk="sort"; plain "vegas" uses the default threshold-search kernel); a suffix
    "+lookupN" adds N prompt-lookup tokens after the drafts (SpecConfig.lookup), e.g. vegas-page8+lookup8."""
    name, plus, look = name.partition("+lookup")
    if plus:
        kw["lookup"] = int(look)
    if name == "vegas-sort":
        return SpecConfig("vegas", topk="sort", **kw)
    if name == "vegas-select":   # the default since commit 8c98d46's measurement; kept for old commands
        return SpecConfig("vegas", topk="select", **kw)
    if name.startswith("vegas-page"):   # vegas-page16: whole aligned pages of 16 slots (SpecConfig.select_page)
        return SpecConfig("vegas", select_page=int(name[len("vegas-page"):]), **kw)
    return SpecConfig(name, **kw)


def _method(spec):
    """The record's method: "vegas-sort" for Vegas with XLA's sort-based top-k, else spec.method."""
    if spec.method == "vegas" and spec.select_page > 1:
        return f"vegas-page{spec.select_page}" + ("-sort" if spec.topk == "sort" else "")
    return "vegas-sort" if spec.method == "vegas" and spec.topk == "sort" else spec.method


def _label(spec):
    """method plus the non-default vegas knobs: vegas+all (all gamma+1 rows), vegas+logits."""
    extra = ("+all" if spec.collect == "all" else "") + ("+logits" if spec.score_mode == "logits" else "")
    return _method(spec) + extra + (f"+lookup{spec.lookup}" if spec.lookup else "")


def _find(records, method, L, B, group="grid", **kw):
    for r in records:
        if r["method"] == method and r["L"] == L and r["B"] == B and r["group"] in (group, "grid") and \
                all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def _tau_ratios(records, sweep, by, **fixed):
    """{value of `by`: tau(vegas) / tau(streaming)} at the sweep shape, the `fixed` knobs equal, ablations left out."""
    taus = {}
    for r in records:
        knobs = r.get("knobs", {})
        if (r["L"], r["B"]) == sweep and r["method"] in ("vegas", "streaming") and \
                all(r[k] == v for k, v in fixed.items()) and knobs.get("collect") != "all" and \
                knobs.get("score_mode") != "logits":
            taus.setdefault(r[by], {})[r["method"]] = r["tau"]
    return {v: round(d["vegas"] / d["streaming"], 3) for v, d in sorted(taus.items())
            if "vegas" in d and "streaming" in d}


def _summary(records, splits, sweep, split, Ls, Bs, a):
    # The shape when it ran (as a grid shape or as the sweep / split shape), else the largest grid shape;
    # the key names the shape it was read at.
    big = (8000, 64) if any((r["L"], r["B"]) == (8000, 64) for r in records) else (max(Ls), max(Bs))
    out = {"shape_speedup": f"L{big[0]}_B{big[1]}", "shape_tau": f"L{sweep[0]}_B{sweep[1]}",
           "shape_split": f"L{split[0]}_B{split[1]}", "gamma": a.gamma, "budget": a.budget}
    v = _find(records, "vegas", *big, gamma=a.gamma, budget=a.budget)
    out[f"vegas_speedup_vs_ar_L{big[0]}_B{big[1]}"] = v and v["speedup_vs_ar"]
    vs = _find(records, "vegas", *sweep, gamma=a.gamma, budget=a.budget)
    ss = _find(records, "streaming", *sweep, gamma=a.gamma, budget=a.budget)
    out["tau_ratio_vegas_vs_streaming"] = round(vs["tau"] / ss["tau"], 3) if vs and ss else None
    sp = next((s for s in splits if s["method"] == "vegas"), None)
    out["selection_overhead_frac"] = sp and sp["selection_frac"]
    for mth in ("streaming", "quest", "vegas", "vegas-sort"):
        r = _find(records, mth, *big, gamma=a.gamma, budget=a.budget)
        if r:
            out[f"{mth}_speedup_vs_ar"] = r["speedup_vs_ar"]
            out[f"{mth}_tau"] = r["tau"]
    for s in splits:
        out[f"{s['method']}_selection_frac"] = s["selection_frac"]
    out["tau_ratio_by_budget"] = _tau_ratios(records, sweep, "budget", gamma=a.gamma)
    gam = [r for r in records if (r["L"], r["B"]) == sweep and r["method"] == "vegas" and r["budget"] == a.budget
           and r.get("knobs", {}).get("collect") == "c2q" and r.get("knobs", {}).get("score_mode") == "weights"]
    if gam:
        best = max(gam, key=lambda r: r["tokens_per_s"])
        out["vegas_best_gamma"] = best["gamma"]
        out["vegas_best_gamma_speedup_vs_ar"] = best["speedup_vs_ar"]
    out["tau_ratio_by_gamma"] = _tau_ratios(records, sweep, "gamma", budget=a.budget)   # --gamma-methods
    agree = [r["agree_with_ar"] for r in records if r["method"] != "ar"]
    out["agree_with_ar_min"] = min(agree) if agree else None
    out["agree_with_ar_mean"] = round(float(np.mean(agree)), 3) if agree else None
    return out


def _table(records, splits, summary):
    print("\n method          L    B  g budget group          tau   tok/s  x ar  agree  min-row-tau straggler")
    for r in records:
        print(f" {r['label']:<13} {r['L']:5d} {r['B']:4d} {r['gamma']:2d} {str(r['budget']):>6} {r['group']:<12}"
              f" {r['tau']:5.2f} {r['tokens_per_s']:7.0f} {r['speedup_vs_ar']:5.2f} {r['agree_with_ar']:5.2f}"
              f"  {r.get('tau_row_min', 1.0):5.2f} {r.get('straggler', 1.0):5.2f}")
    for s in splits:
        print(f" split {s['method']:<9} L={s['L']} B={s['B']}: draft {1e3 * s['draft_s']:.2f} ms, verify "
              f"{1e3 * s['verify_s']:.2f} ms, select {1e3 * s['select_s']:.2f} ms "
              f"(selection {100 * s['selection_frac']:.1f}%), measured round {1e3 * s['measured_round_s']:.2f} ms")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
