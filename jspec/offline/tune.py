"""Vegas' three-stage tuning (docs/methods.md): pick the budget ratio and gamma by measurement.

    1. ratio   at a fixed gamma, raise the ratio of the context each draft step keeps (SpecConfig.ratio,
               clamped to [min_tokens, budget]) step by step until the accepted tokens per verification (tau)
               stop rising: the first ratio whose next step gains less than `plateau_tol` (relative) wins.
    2. gamma   at that ratio, sweep gamma and keep the one with the best measured throughput (tokens/s).
    3. refine  at that gamma, try the ratios around the stage-1 value (its grid neighbours and the geometric
               midpoints towards them) and keep the fastest: a smaller ratio drafts faster, a larger one
               accepts more.
    4. page    (vegas, with `pages` beyond 1) at that ratio and gamma, try selecting whole aligned pages of each
               candidate size (SpecConfig.select_page; the budget rounded up to whole pages) and keep the
               fastest, single slots on a tie. Pages rank fewer scores and keep a selected token's neighbours;
               whether that beats single slots depends on the model, context and GPU, hence the measurement
               (docs/performance.md).

The search (`search`) only sees a `measure(spec) -> (tau, tokens_per_s)` callable, so its rules are tested
without a model. `tune` measures on a real model: one prefill serves every config (the cache is rolled back
to the prompt between runs), each config decodes greedily with stop tokens ignored,
its first run compiles and warms up, and the fastest of `reps` timed runs counts.

    result = tune(jspec.load("smollm2-135m"), prompt_tokens=2048, batch=4, out="tune.json")
    jspec.generate(model, prompts, config="tune.json")          # or: jspec generate --config tune.json

The JSON holds the SpecConfig knobs in their flat form (`SpecConfig.describe()`: the shared knobs, verify and
the method's own, e.g. vegas' select_page), the measurements and where they were taken (model, prompt_tokens,
batch, device, jax version).

LongSpec has no ratio: `tune(model, method="longspec")` measures each candidate draft shape (`trees`: tree
widths per level; all-ones widths run as a chain) with the same harness and keeps the fastest. Which shape
wins depends on the batch: at B=1 a round is launch-bound and a larger tree costs little, while at larger
batches tree verification's attention turns compute-bound and small trees or a chain win (docs/performance.md,
"LongSpec").
`budget` is the static selection width: ceil(ratio * (prompt + new tokens)), so the ratio rule is not capped
by it for contexts up to the tuned length.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jspec.attention import AttnImpl
from jspec.config import SamplingConfig
from jspec.errors import InputError
from jspec.speculative.config import METHODS, LongSpecOptions, SpecConfig, StreamingOptions
# The config-file helpers live beside SpecConfig (the API reads config files too); kept importable from here.
from jspec.speculative.config import draft_widths, read_config, write_config  # noqa: F401

DEFAULT_RATIOS = (0.01, 0.02, 0.05, 0.1, 0.2)
DEFAULT_GAMMAS = (2, 3, 4, 6, 8)
DEFAULT_PAGES = (1, 8, 16)   # vegas' stage 4: single slots (the paper's rule), then pages of 8 and 16
GREEDY = SamplingConfig()

# LongSpec draft shapes tried by default: a chain, then trees from 14 to 104 nodes.
# Candidates of the longspec shape search: the chain, narrow deep trees (small trees win at larger batches),
# mid-sized ones (which can win at B=1) and the public default (4,16,16,16,16); around (2,4,4,4), the bundled
# SmolLM2 drafter's tuned shape, one level deeper and one level wider, for drafters that accept more.
DEFAULT_TREES = ((1, 1, 1, 1, 1), (2, 2, 2, 2, 2), (2, 2, 2, 2, 2, 2, 2), (2, 4, 4, 4), (2, 4, 4, 4, 4),
                 (4, 4, 4, 4), (4, 8, 8, 8, 8), (4, 16, 16, 16, 16), (8, 32, 32, 32))


# ---------------------------------------------------------------------------------------------- search

def search(measure: Callable[[SpecConfig], tuple[float, float]], make_spec: Callable[[float, int], SpecConfig], *,
           ratios: Sequence[float], gammas: Sequence[int], gamma0: Optional[int] = None, plateau_tol: float = 0.02,
           on_measure: Optional[Callable[[dict], None]] = None, precompile: Optional[Callable[[list], None]] = None,
           lookahead: int = 1) -> dict:
    """The three stages over a measuring function (no model needed).

    Args:
      measure: spec -> (tau, tokens_per_s). Called at most once per distinct spec (results are memoised).
      make_spec: (ratio, gamma) -> SpecConfig.
      ratios, gammas: the candidate grids (sorted and de-duplicated here).
      gamma0: the gamma of stage 1 (default: the median candidate gamma).
      plateau_tol: stage 1 stops at the first ratio whose next step raises tau by less than this fraction.
      on_measure: called with each new measurement record (for progress output).
      precompile: called with the specs about to be measured, before any of them is (to compile them in
        parallel): a whole stage at once for stages 2 and 3, `lookahead` ratios at a time in stage 1 (which
        may then compile up to lookahead - 1 ratios past the plateau that are never measured).
    Returns:
      {"ratio", "gamma", "stage1_ratio", "measurements": [{"stage", "ratio", "gamma", "tau", "tokens_per_s"}]}
    """
    ratios = sorted({float(r) for r in ratios})
    gammas = sorted({int(g) for g in gammas})
    if not ratios or not gammas:
        raise InputError("need at least one candidate ratio and one candidate gamma")
    if plateau_tol < 0:
        raise InputError(f"plateau_tol={plateau_tol} must be >= 0")
    if gamma0 is None:
        gamma0 = gammas[(len(gammas) - 1) // 2]
    memo: dict = {}
    records: list = []

    def ahead(pairs):
        todo = [make_spec(r, g) for r, g in pairs if (r, g) not in memo]
        if precompile is not None and todo:
            precompile(todo)

    def point(stage, ratio, gamma):
        if (ratio, gamma) not in memo:
            tau, tps = measure(make_spec(ratio, gamma))
            rec = {"stage": stage, "ratio": ratio, "gamma": gamma, "tau": float(tau), "tokens_per_s": float(tps)}
            memo[ratio, gamma] = rec
            records.append(rec)
            if on_measure is not None:
                on_measure(rec)
        return memo[ratio, gamma]

    # Stage 1: tau against the ratio; the plateau starts where one more step no longer pays.
    i1 = len(ratios) - 1
    step = max(1, lookahead)
    ahead([(r, gamma0) for r in ratios[:step]])
    prev = point(1, ratios[0], gamma0)["tau"]
    for i in range(1, len(ratios)):
        if i % step == 0:
            ahead([(r, gamma0) for r in ratios[i:i + step]])
        tau = point(1, ratios[i], gamma0)["tau"]
        if tau - prev < plateau_tol * prev:
            i1 = i - 1
            break
        prev = tau
    r1 = ratios[i1]

    # Stage 2: throughput against gamma at the plateau ratio (ties: the smaller gamma, listed first).
    ahead([(r1, g) for g in gammas])
    g = max(gammas, key=lambda g: point(2, r1, g)["tokens_per_s"])

    # Stage 3: throughput against the ratio near r1 at that gamma.
    near = [r1]
    for j in (i1 - 1, i1 + 1):
        if 0 <= j < len(ratios):
            mid = float(f"{math.sqrt(r1 * ratios[j]):.3g}")
            near += [x for x in (mid, ratios[j]) if x not in near]
    ahead([(r, g) for r in near])
    r = max(near, key=lambda r: (point(3, r, g)["tokens_per_s"], r == r1))
    return {"ratio": r, "gamma": g, "stage1_ratio": r1, "measurements": records}


def _page_sizes(pages) -> list:
    """Sorted distinct page sizes, each >= 1 (InputError otherwise)."""
    pages = sorted({int(p) for p in pages})
    if not pages or pages[0] < 1:
        raise InputError(f"page sizes {pages} must be integers >= 1")
    return pages


def pick_page(measure: Callable[[SpecConfig], tuple[float, float]], make_spec: Callable[..., SpecConfig],
              found: dict, pages: Sequence[int], *, on_measure: Optional[Callable[[dict], None]] = None,
              precompile: Optional[Callable[[list], None]] = None) -> dict:
    """Stage 4 over a measuring function: at `found`'s ratio and gamma (a `search` result, whose measurements
    hold the single-slot config), measure make_spec(ratio, gamma, page) for each page size > 1 in `pages` and
    keep the fastest; single slots win ties. Returns `found` with "select_page" set and the new records
    ({"stage": 4, ..., "select_page"}) appended to its measurements."""
    pages = _page_sizes(pages)
    r, g = found["ratio"], found["gamma"]
    records = list(found["measurements"])
    base = next(m for m in records if (m["ratio"], m["gamma"]) == (r, g))
    best_p, best_tps = 1, base["tokens_per_s"] if 1 in pages else -1.0
    todo = [p for p in pages if p > 1]
    if precompile is not None and todo:
        precompile([make_spec(r, g, p) for p in todo])
    for p in todo:
        tau, tps = measure(make_spec(r, g, p))
        rec = {"stage": 4, "ratio": r, "gamma": g, "select_page": p, "tau": float(tau), "tokens_per_s": float(tps)}
        records.append(rec)
        if on_measure is not None:
            on_measure(rec)
        if tps > best_tps:
            best_p, best_tps = p, tps
    return {**found, "select_page": best_p, "measurements": records}


# ------------------------------------------------------------------------------------------------ tune

def tune(model, *, prompts=None, prompt_tokens: int = 2048, batch: int = 1, max_new_tokens: int = 64,
         method: str = "vegas", ratios: Sequence[float] = DEFAULT_RATIOS, gammas: Sequence[int] = DEFAULT_GAMMAS,
         pages: Sequence[int] = DEFAULT_PAGES, trees: Sequence[Sequence[int]] = DEFAULT_TREES, drafter=None,
         baseline: bool = True,
         gamma0: Optional[int] = None, plateau_tol: float = 0.02, min_tokens: Optional[int] = None,
         score_mode: str = "weights", collect: str = "c2q", reps: int = 2, impl: AttnImpl = AttnImpl(),
         jobs: Optional[int] = None, seed: int = 0, progress: bool = True,
         log: Optional[Callable[[str], None]] = None, out: Optional[str] = None) -> dict:
    """Tune `method`'s ratio and gamma on `model` (a `jspec.Model`) by measurement; see the module docstring.

    Args:
      prompts: text or token-id lists (one batch); default: `batch` stdlib documents of `prompt_tokens` tokens.
      max_new_tokens: tokens each measured run decodes (greedy, stop tokens ignored).
      ratios, gammas, gamma0, plateau_tol: the search grid and stage-1 rule (`search`).
      pages: vegas' stage 4 (`pick_page`): candidate SpecConfig.select_page sizes (1 = single slots); (1,)
        skips the stage. Ignored by the other methods.
      min_tokens: lower clamp of the ratio rule; default min(256, ceil(min(ratios) * shortest prompt)), so the
        smallest candidate ratio is not clamped away.
      baseline: also time plain greedy decoding (ar) on the same prompts: the result gets `ar_tokens_per_s` and
        `speedup_vs_ar`, and a note is printed when no candidate beats ar.
      trees, drafter: LongSpec only: the candidate draft shapes (widths per level; all ones = a chain of that
        length) and the drafter (a `jspec.drafter.Drafter`, its directory, or None for the bundled one).
      reps: timed runs per config after one warm-up run; the fastest counts.
      jobs: configs compiled in parallel ahead of their measurement (default min(4, CPU cores / 4); 1: each
        compiles in its warm-up run); every compile finishes before the next timed run starts, so timings
        never overlap a compile.
      log: receives one line per measured config (default: printed above the progress bar).
      out: write the JSON here too.
    Returns:
      The config dict (see the module docstring); `SpecConfig(**read_config(result))` rebuilds the spec.
    """
    from tqdm.auto import tqdm

    from jspec import api, kv_cache
    from jspec import prefill as gen
    from jspec.speculative import engine

    if method not in METHODS:
        raise InputError(f"unknown speculative method {method!r} for tuning; available: {', '.join(METHODS)}")
    if reps < 1:
        raise InputError(f"reps={reps} must be >= 1")
    longspec = method == "longspec"
    if longspec:
        trees = [tuple(int(w) for w in t) for t in trees]
        if not trees:
            raise InputError("need at least one candidate tree")
        for t in trees:
            if not t or min(t) < 1:
                raise InputError(f"tree widths {list(t)} must be a non-empty list of integers >= 1")
        drafter_path = os.path.abspath(os.fspath(drafter)) if isinstance(drafter, (str, os.PathLike)) else (
            api.bundled_drafter_dir(model) if drafter is None else None)
        drafter = api.load_drafter_for(model, drafter)
    else:
        if not ratios or not gammas:
            raise InputError("need at least one candidate ratio and one candidate gamma")
        for r in ratios:
            if not 0.0 < float(r) <= 1.0:
                raise InputError(f"ratio {r} must be in (0, 1]")
        for g in gammas:
            if int(g) < 1:
                raise InputError(f"gamma {g} must be >= 1")
        pages = _page_sizes(pages) if method == "vegas" else [1]   # checked before the prefill
        if method != "vegas" and (score_mode, collect) != ("weights", "c2q"):
            raise InputError(f"score_mode and collect are vegas options, not {method!r}'s")
    cfg = model.cfg
    if prompts is None:
        from jspec import data
        prompts = data.long_prompts(model.tokenizer, prompt_tokens, count=batch)
    elif isinstance(prompts, str):
        prompts = [prompts] * batch
    ids = api.encode(model, prompts)
    lengths = np.array([len(p) for p in ids], np.int32)
    B = len(ids)
    g_max = max(sum(t) for t in trees) if longspec else max(int(g) for g in gammas)
    context = int(lengths.max(initial=0)) + max_new_tokens
    if context > cfg.max_position:
        raise InputError(f"prompt + new tokens ({context}) exceed the model's context of {cfg.max_position}")
    capacity = -(-(context + g_max + 1) // 128) * 128
    api.check_request(lengths, capacity=capacity, max_new_tokens=max_new_tokens, vocab_size=cfg.vocab_size,
                      tokens=np.concatenate([np.asarray(p) for p in ids]))
    if longspec:
        pass
    elif min_tokens is None:
        min_tokens = min(256, max(1, math.ceil(min(ratios) * int(lengths.min()))))
        if method == "streaming":
            min_tokens = max(min_tokens, StreamingOptions.sink)

    def make_spec(ratio: float, gamma: int, page: int = 1) -> SpecConfig:
        # The static width covers ceil(ratio * context) up to the longest context measured, in whole units of
        # lcm(8, page) slots (vegas' pages: the width must hold whole pages).
        unit = math.lcm(8, page)
        width = -(-max(min_tokens, math.ceil(ratio * context)) // unit) * unit
        try:
            own = dict(score_mode=score_mode, collect=collect, select_page=page) if method == "vegas" else {}
            return SpecConfig(method=method, gamma=gamma, budget=width, ratio=ratio, min_tokens=min_tokens, **own)
        except TypeError as e:
            raise InputError(f"bad speculative option: {e}") from None

    def tree_spec(widths: tuple) -> SpecConfig:
        chain = max(widths) == 1
        return SpecConfig(method="longspec", mode="chain" if chain else "tree", gamma=len(widths),
                          tree_widths=widths if not chain else LongSpecOptions.tree_widths,
                          window=drafter.window)

    if longspec:
        [tree_spec(t) for t in trees]   # bad shapes fail before the prefill
    else:
        make_spec(min(ratios), min(gammas))   # bad knobs fail before the prefill, not after minutes of it

    impl = api.attn_impl(model, impl)
    params = model.params
    tokens, lens = gen.pad_prompts(ids)
    tokens, lens = jnp.asarray(tokens), jnp.asarray(lens)
    last = jnp.take_along_axis(tokens, (lens - 1)[:, None], axis=1)[:, 0]
    logits, cache = gen.prefill(params, cfg, tokens, lens, api.new_cache(model, batch=B, capacity=capacity),
                                impl=impl)
    box = {"cache": cache, "logits": logits}
    key = jax.random.key(seed)
    # LongSpec's prepare also reads the prompt (the drafter's own prefill); both calls take the drafter.
    prep_kw = dict(drafter=drafter.params, prompt_tokens=tokens) if longspec else {}
    run_kw = dict(drafter=drafter.params) if longspec else {}

    # XLA's CPU compiler is itself multi-threaded: parallel compiles only pay with cores to spare.
    jobs = max(1, jobs or min(4, (os.cpu_count() or 1) // 4))
    pool = ThreadPoolExecutor(jobs) if jobs > 1 else None

    def compile_one(spec: SpecConfig):
        # Compiling ahead of time fills the jit caches, so `measure`'s ordinary calls find the programs.
        prep = engine.prepare.lower(params, cfg, spec, kv_cache.rollback(box["cache"], lens), box["logits"], last,
                                    impl=impl, **prep_kw).compile()
        if model.mesh is None:   # single device: plain avals are what a call with the real state looks up
            state = jax.eval_shape(lambda c, lg, kw: engine._prepare(params, cfg, spec, c, lg, last, impl, **kw),
                                   kv_cache.rollback(box["cache"], lens), box["logits"], prep_kw)
        else:                    # sharded: the layout prepare's program gives the state
            state = jax.tree.map(lambda o: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=o.sharding),
                                 prep.out_info)
        engine.run_donating.lower(params, cfg, spec, GREEDY, state, key, max_new_tokens, stop_tokens=(),
                                  impl=impl, **run_kw).compile()

    def precompile(specs: list) -> None:
        if pool is not None and len(specs) > 1:
            for f in [pool.submit(compile_one, s) for s in specs]:
                f.result()

    def measure(spec: SpecConfig) -> tuple[float, float]:
        pk, rk = (prep_kw, run_kw) if spec.method == "longspec" else ({}, {})   # not "ar" (the baseline)
        times = []
        for rep in range(reps + 1):    # rep 0 compiles and warms up: not timed
            state = engine.prepare(params, cfg, spec, kv_cache.rollback(box["cache"], lens), box["logits"], last,
                                   impl=impl, **pk)
            jax.block_until_ready(state)
            t = time.perf_counter()
            toks, n_out, stats, final = engine.run_donating(params, cfg, spec, GREEDY, state, key, max_new_tokens,
                                                            stop_tokens=(), impl=impl, **rk)
            jax.block_until_ready((toks, n_out, stats))
            dt = time.perf_counter() - t
            box["cache"], box["logits"] = final.cache, final.logits   # the donated buffers, for the next run
            if rep:
                times.append(dt)
        # The first token comes from the prefill logits, the loop makes the rest.
        produced = int(np.maximum(np.asarray(n_out) - 1, 0).sum())
        return stats.tau(), produced / max(min(times), 1e-9)

    say = log if log is not None else tqdm.write
    ar_tps = None
    if baseline:
        ar_tps = measure(SpecConfig("ar"))[1]   # the engine without drafts, timed like every candidate
        say(f"ar (plain greedy decoding, the baseline): {ar_tps:9.1f} tok/s")
    if longspec:
        try:
            return _tune_trees(trees, tree_spec, measure, precompile, jobs=jobs, progress=progress,
                               say=say, out=out, model=model, lengths=lengths, batch=B,
                               max_new_tokens=max_new_tokens, reps=reps, drafter_path=drafter_path, ar_tps=ar_tps)
        finally:
            if pool is not None:
                pool.shutdown()
    n_ratios, n_gammas = len(set(ratios)), len(set(gammas))
    bar = tqdm(total=n_ratios + n_gammas - 1 + 4 + len(pages) - 1, desc=f"tune {method}", unit="config",
               disable=not progress)

    def on_measure(rec):
        bar.update(1)
        page = rec.get("select_page", 1)
        budget = make_spec(rec["ratio"], rec["gamma"], page).budget
        say(f"stage {rec['stage']}: ratio {rec['ratio']:<7.4g} gamma {rec['gamma']:<2d} budget {budget:<6d} "
            + (f"pages of {page:<3d} " if page > 1 else "")
            + f"tau {rec['tau']:6.3f}  {rec['tokens_per_s']:9.1f} tok/s")

    try:
        found = search(measure, make_spec, ratios=ratios, gammas=gammas, gamma0=gamma0, plateau_tol=plateau_tol,
                       on_measure=on_measure, precompile=precompile, lookahead=jobs)
        found = pick_page(measure, make_spec, found, pages, on_measure=on_measure, precompile=precompile)
    finally:
        bar.total = bar.n
        bar.close()
        if pool is not None:
            pool.shutdown()
    best = make_spec(found["ratio"], found["gamma"], found["select_page"])
    for rec in found["measurements"]:
        rec.setdefault("select_page", 1)
        rec["budget"] = make_spec(rec["ratio"], rec["gamma"], rec["select_page"]).budget
    page = found["select_page"]
    chosen = next(m for m in found["measurements"]
                  if (m["ratio"], m["gamma"], m["select_page"]) == (best.ratio, best.gamma, page))
    return _finish(best, chosen, found["measurements"], f"ratio {best.ratio:.4g}, gamma {best.gamma}, budget "
                   f"{best.budget}" + (f", pages of {page}" if page > 1 else ""),
                   model=model, lengths=lengths, batch=B, max_new_tokens=max_new_tokens,
                   reps=reps, ar_tps=ar_tps, out=out, say=say, stage1_ratio=found["stage1_ratio"],
                   ratios=sorted({float(r) for r in ratios}), gammas=sorted({int(g) for g in gammas}),
                   pages=pages, plateau_tol=plateau_tol)


def _tune_trees(trees, tree_spec, measure, precompile, *, jobs, progress, say, out, model, lengths, batch,
                max_new_tokens, reps, drafter_path, ar_tps) -> dict:
    """LongSpec: measure every candidate draft shape (compiled `jobs` at a time ahead of timing) and keep the
    fastest; ties go to the shape listed first."""
    from tqdm.auto import tqdm

    records = []
    with tqdm(total=len(trees), desc="tune longspec", unit="shape", disable=not progress) as bar:
        for i in range(0, len(trees), max(1, jobs)):
            group = trees[i:i + max(1, jobs)]
            precompile([tree_spec(t) for t in group])
            for t in group:
                spec = tree_spec(t)
                tau, tps = measure(spec)
                rec = {"tree_widths": list(t), "mode": spec.options.mode, "nodes": sum(t), "tau": float(tau),
                       "tokens_per_s": float(tps)}
                records.append(rec)
                bar.update(1)
                say(f"{spec.options.mode:<5s} {','.join(map(str, t)):<16s} nodes {sum(t):<4d} tau {tau:6.3f}  "
                    f"{tps:9.1f} tok/s")
    best_i = max(range(len(records)), key=lambda i: (records[i]["tokens_per_s"], -i))
    best, chosen = tree_spec(trees[best_i]), records[best_i]
    return _finish(best, chosen, records, f"{best.options.mode} {','.join(map(str, trees[best_i]))}", model=model,
                   lengths=lengths, batch=batch, max_new_tokens=max_new_tokens, reps=reps, ar_tps=ar_tps, out=out,
                   say=say, drafter=drafter_path, trees=[list(t) for t in trees])


def _finish(best: SpecConfig, chosen: dict, measurements: list, what: str, *, model, lengths, batch: int,
            max_new_tokens: int, reps: int, ar_tps: Optional[float], out: Optional[str], say, **extra) -> dict:
    """The tuned config: every SpecConfig field of `best` (so the file rebuilds exactly this config), the
    chosen measurement, all measurements, the search's own settings (`extra`) and where it was measured;
    written to `out` and announced in one line."""
    d = jax.devices()[0]
    result = {
        **best.describe(),
        "tau": chosen["tau"], "tokens_per_s": chosen["tokens_per_s"], "measurements": measurements, **extra,
        "model": model.path, "prompt_tokens": int(lengths.max()), "batch": batch, "max_new_tokens": max_new_tokens,
        "reps": reps, "device": f"{d.platform}:{getattr(d, 'device_kind', '?')}",
        "devices": 1 if model.mesh is None else int(model.mesh.size), "jax": jax.__version__,
        **_vs_ar(chosen["tokens_per_s"], ar_tps),
    }
    if out:
        write_config(out, result)
    say(f"chosen: {what}: tau {chosen['tau']:.3f}, {chosen['tokens_per_s']:.1f} tok/s" + _ar_note(result)
        + (f" -> {out}" if out else ""))
    return result


def _vs_ar(tps: float, ar_tps: Optional[float]) -> dict:
    if ar_tps is None:
        return {}
    return {"ar_tokens_per_s": ar_tps, "speedup_vs_ar": tps / ar_tps if ar_tps > 0 else None}


def _ar_note(result: dict) -> str:
    x = result.get("speedup_vs_ar")
    if x is None:
        return ""
    note = f" ({x:.2f}x ar)"
    if x < 1.0:
        note += "; NOTE: plain decoding is faster at this batch and context (generate --method ar)"
    return note
