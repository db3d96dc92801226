"""How many kernels does each kind of forward step launch, of what kind, and where does its time go? (issue 31;
with --exact, where bf16 exact mode's cost goes against a run without it: issue 29)

    PYTHONPATH=. python bench/profile_step.py --out $OUT/profile_step_h200.json [--texts DIR] [--L 7936]
        [--batches 64,16,1] [--kinds plain_step,draft_step,...] [--dense-rows N] [--exact] [--quick]
    PYTHONPATH=. python bench/profile_step.py --tiny --out /tmp/profile_step_cpu.json   # CPU plumbing check

At context L (ragged long-task prompts as `jspec bench` makes them, from --texts or the standard library) and
each batch size B, builds the state through the public pieces (`speculative.init`, `longspec.init` with the
bundled drafter, `engine.start`) and jits each step kind alone, warmed up, the cache donated as the engine does:

    plain_step            one target forward, one token per row, full attention, + the greedy token
    draft_step            vegas' sparse draft step (one token, attention over the round's selection + tail)
    streaming_draft_step  the same with streaming's sink + window selection
    vegas_verify          the gamma+1-row verification with vegas' score collection (rows 0 and gamma)
    vegas_select          vegas' per-layer top-k selection from those scores
    longspec_draft        the LongSpec drafter growing one round's tree (all its levels)
    longspec_verify       the tree-masked target verification of that tree
    ar_round, vegas_round, longspec_round (, streaming_round)   `engine.round_` on the engine's loop carry:
                          what one iteration of the generation while_loop costs, glue included

Each record: wall time per call (median over --reps samples of back-to-back calls), and from a profiler trace of
--trace-calls calls (GPU only; the calls are separated so they can be told apart): device time per call
(median of the per-call sum of kernel durations), the span from the first kernel's start to the last's end
(span - device = the gaps between launches), kernels per call, kernels by group (gemm, attention, fusion, data
movement, reduce/sort/top-k, other) with per-layer counts, and the top kernels. Every record also carries a
*static* count, from the compiled program's optimized HLO (`compiled.as_text()`, any backend, no dump needed):
launch-like instructions (fusions, custom calls, copies, ...; while bodies times their known trip counts), by
group and by origin (the jspec source lines XLA's metadata names for the launch's ops), and a list of launches
that exist only because of how the program is written (layout copies, concatenations, casts, separate RMSNorm /
RoPE / cache-append / residual fusions). A trace kernel is matched to its HLO instruction by name, so the top
kernels carry their origin too. The static count is an estimate of kernels per call: a cuBLAS GEMM or a Pallas
call may launch more than one kernel.

Summary keys per B: `<kind>_ms_B<B>` (wall), `<kind>_device_ms_B<B>`, `kernels_per_<kind>_B<B>` (traced) and
`static_launches_<kind>_B<B>`, e.g. kernels_per_plain_step_B64, plain_step_ms_B64, draft_step_ms_B64.

On a CPU the trace has no device kernels: the tool then gives wall times and static counts only (--tiny: a
2-layer random model at L=192, B=2, for tests). On the H200, after bench/gpu.sh's staging (stage1..3), from the
repo root, one call (the programs of all batch sizes compile together in a thread pool first; estimated 3-4
minutes; --time-budget S records the kinds still unmeasured after S seconds as skipped):

    JSPEC_COMMIT=<sha:hash> JSPEC_CACHE=/root/jspec-cache PYTHONPATH=/tmp/site:. \
        python3 bench/profile_step.py --texts /root/jspec-cache/corpus --out $OUT/profile_step_h200.json
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jspec  # noqa: E402  (first: sets jspec's XLA flags before jax starts a backend)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from bench import common, hlo_fusions  # noqa: E402
from jspec import api, kv_cache, model, sampling, speculative  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.config import ModelConfig, SamplingConfig  # noqa: E402
from jspec.speculative import engine, longspec, streaming, vegas  # noqa: E402

KINDS = ("plain_step", "draft_step", "streaming_draft_step", "vegas_verify", "vegas_select", "longspec_draft",
         "longspec_verify", "ar_round", "vegas_round", "longspec_round")
EXTRA_KINDS = ("streaming_round",)
GREEDY = SamplingConfig()
MAX_NEW = 64   # the loop carry's output width; the round wrapper resets the counters, so it is never reached


# --- device kernels from a profiler trace ---------------------------------------------------------------------

def trace_record(calls, static_by_name, per_layer_div, top: int) -> dict:
    """Per-call device time (median), span, kernel count, groups and top kernels of the split trace."""
    n = len(calls)
    busy = [sum(d for _, _, d in c) for c in calls]
    span = [max(t + d for _, t, d in c) - c[0][1] for c in calls]
    tab = collections.defaultdict(lambda: [0.0, 0])
    for c in calls:
        for nm, _, d in c:
            tab[nm][0] += d / n
            tab[nm][1] += 1 / n
    groups = collections.defaultdict(lambda: [0.0, 0.0])
    tops = []
    for nm, (us, cnt) in sorted(tab.items(), key=lambda kv: -kv[1][0]):
        g, hit = hlo_fusions.kernel_group(nm, static_by_name)
        groups[g][0] += us
        groups[g][1] += cnt
        if len(tops) < top:
            tops.append(dict(name=nm[:100], us=round(us, 1), count=round(cnt, 2), group=g,
                             per_layer=round(cnt / per_layer_div, 2) if per_layer_div else None,
                             label=hit["label"] if hit else None, origins=hit["origins"][:2] if hit else None))
    counts = [len(c) for c in calls]
    kpc = statistics.median(counts)
    return dict(device_ms=round(statistics.median(busy) / 1e3, 4), span_ms=round(statistics.median(span) / 1e3, 4),
                kernels_per_call=kpc, kernels_per_call_range=[min(counts), max(counts)],
                kernels_per_layer=round(kpc / per_layer_div, 2) if per_layer_div else None,
                by_group={g: dict(us=round(v[0], 1), count=round(v[1], 2),
                                  per_layer=round(v[1] / per_layer_div, 2) if per_layer_div else None)
                          for g, v in sorted(groups.items(), key=lambda kv: -kv[1][0])},
                top_kernels=tops)


# --- the model, the prompts and the methods' configs -----------------------------------------------------------

TINY = ModelConfig(arch="llama", vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                   ffn_dim=128, max_position=4096, bos_token_id=1, eos_token_ids=(2,), dtype="float32")


@dataclasses.dataclass
class Setup:
    cfg: ModelConfig
    params: dict
    prompts: list          # token lists of the largest batch; a batch of B takes the first B (rows depend on i only)
    specs: dict            # "ar" / "vegas" / "streaming" -> SpecConfig
    longspec_spec: object  # B -> the longspec SpecConfig generate would run at B
    drafter: object        # the drafter block's params


def setup(*, model_name: str, tiny: bool, L: int, B: int, texts, gamma: int) -> Setup:
    """The default model (or --tiny: random weights) with ragged long-task prompts and generate's configs."""
    S = speculative.SpecConfig
    if tiny:   # random weights and tokens; small selections so that they select at L=192
        from jspec.drafter import init_drafter_params
        cfg = TINY
        params = model.init_params(cfg, jax.random.key(0))
        rng = np.random.default_rng(0)
        prompts = [rng.integers(3, cfg.vocab_size, L - int(rng.integers(0, L // 10))).tolist() for _ in range(B)]
        specs = dict(ar=S("ar"), vegas=S("vegas", gamma=gamma, budget=64, select_page=8),
                     streaming=S("streaming", gamma=gamma, budget=64))
        drafter = init_drafter_params(cfg, jax.random.key(1), target_params=params)
        return Setup(cfg, params, prompts, specs, lambda b: S("longspec", tree_widths=(2, 2), window=32), drafter)
    from jspec import bench as jb
    m = jspec.load(model_name, progress=False)
    texts_ = jb._Texts(m.tokenizer, *jb.text_sources(texts))
    prompts = [p.tokens for p in jb.long_tasks(m.tokenizer, texts_, L, B)]
    # what `jspec bench`'s headline grid runs: vegas in pages of 8, streaming and longspec with their defaults
    specs = dict(ar=S("ar"), vegas=S("vegas", gamma=gamma, select_page=8), streaming=S("streaming", gamma=gamma))
    d = api.load_drafter_for(m)
    lspec = lambda b: api._longspec_spec(m, S("longspec"), d, tuned_for=b, keep_shape=False)[0]  # noqa: E731
    return Setup(m.cfg, m.params, prompts, specs, lspec, d.params)


# --- one jitted program per step kind ---------------------------------------------------------------------------

NEEDS = {"vegas_select": "vegas_verify", "longspec_verify": "longspec_draft"}   # a kind's input comes from another


def forwards(kind: str, spec) -> int:
    """Target forwards per call (0: none), to turn counts into per-layer counts."""
    if kind in ("vegas_round", "streaming_round"):
        return spec.gamma + 1
    return 0 if kind in ("vegas_select", "longspec_draft") else 1


def trace_programs(S: Setup, B: int, cap: int, kinds, impl) -> dict:
    """{name: jax Traced} of every program one batch size needs (builders, selections, loop starts, the kinds),
    traced on abstract inputs so that all of them can be compiled together before anything runs."""
    cfg, p, dp = S.cfg, S.params, S.drafter
    vs, ss, ls, ar = S.specs["vegas"], S.specs["streaming"], S.longspec_spec(B), S.specs["ar"]
    P = max(len(t) for t in S.prompts[:B])
    P = -(-P // 64) * 64
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)   # noqa: E731
    live, last, key = jax.ShapeDtypeStruct((B,), jnp.bool_), i32(B), jax.random.key(0)
    want = set(kinds) | {NEEDS[k] for k in kinds if k in NEEDS}
    out = {}

    def add(name, fn, donate, *args):
        out[name] = jax.jit(fn, donate_argnums=donate).trace(*args)
        return out[name].out_info

    st = add("build", lambda p, t, n: speculative.init(p, cfg, vs, t, n, cap, impl=impl), (), p, i32(B, P), i32(B))
    cache = st.cache
    if want & {"longspec_draft", "longspec_round"}:
        lst = add("build_longspec", lambda dp, p, t, n: longspec.init(dp, p, cfg, ls, t, n, cap), (), dp, p,
                  i32(B, P), i32(B))

    def one_token(p, c, tok, live, **kw):   # a forward over one token per row + its greedy token; lengths kept
        lg, c2, _ = model.forward(p, cfg, tok[:, None], c, impl=impl, live=live, **kw)
        return sampling.greedy(lg[:, 0]), kv_cache.rollback(c2, c.lengths)

    if "plain_step" in want:
        add("plain_step", one_token, 1, p, cache, last, live)
    for kind, mod, spec, ms in (("draft_step", vegas, vs, st.method), ("streaming_draft_step", streaming, ss, ())):
        if kind in want:
            sel = add(f"sel_{kind}", lambda ms, n, mod=mod, spec=spec: mod.begin_round(spec, cfg, ms, n), (), ms,
                      i32(B))
            add(kind, lambda p, c, t, lv, sel, mod=mod, spec=spec: one_token(p, c, t, lv, **mod.draft_kwargs(spec, sel, 0)),
                1, p, cache, last, live, sel)
    if "vegas_verify" in want:
        def verify(p, c, t, drafts, lv):
            lg, c2, scores = engine.verify(p, cfg, vs, c, t, drafts, impl, lv)
            return lg.argmax(-1), kv_cache.rollback(c2, c.lengths), scores
        scores = add("vegas_verify", verify, 1, p, cache, last, i32(B, vs.gamma), live)[2]
        if "vegas_select" in want:
            add("vegas_select", lambda sc, point: vegas.update(vs, None, None, sc, point), (), scores, i32(B))
    if "longspec_draft" in want:
        d = add("longspec_draft", lambda dp, p, ms, c, t, k, lv: longspec.draft(p, cfg, ls, GREEDY, dp, ms, c, t, k,
                                                                               impl, lv), (),
                dp, p, lst, cache, last, key, live)
        if "longspec_verify" in want:
            def tree_verify(p, c, tree, lv):
                lg, c2 = longspec.verify(p, cfg, ls, c, tree, impl, lv)
                return lg.argmax(-1), kv_cache.rollback(c2, c.lengths)
            add("longspec_verify", tree_verify, 1, p, cache, d.tree, live)
    for method, spec in (("ar", ar), ("vegas", vs), ("streaming", ss), ("longspec", ls)):
        if f"{method}_round" not in want:
            continue
        ms = {"ar": (), "vegas": st.method, "streaming": (), "longspec": None}[method]
        ms = lst if method == "longspec" else ms

        def start(c, logits, ms, k, spec=spec):   # only the cache is donated: the logits and state are reused
            return engine.start(spec, GREEDY, engine.State(cache=c, logits=logits, method=ms), k, MAX_NEW)

        def round_(p, dp, loop, spec=spec):   # one round; then the row counters go back, so rows never finish
            new = engine.round_(p, cfg, spec, GREEDY, loop, MAX_NEW, (), impl, dp)
            return new.replace(cache=new.cache.replace(lengths=loop.cache.lengths), n_out=loop.n_out, done=loop.done)
        loop = add(f"start_{method}", start, 0, cache, st.logits, ms, key)
        add(f"{method}_round", round_, 2, p, dp if method == "longspec" else None, loop)
    return out


class Runner:
    """Runs one batch size's compiled programs in order, the cache donated from one to the next."""

    def __init__(self, S: Setup, B: int, compiled: dict):
        self.S, self.C, self.B = S, compiled, B
        rows = S.prompts[:B]
        P = -(-max(len(t) for t in rows) // 64) * 64
        toks = np.zeros((B, P), np.int32)
        for b, t in enumerate(rows):
            toks[b, :len(t)] = t
        self.lengths = jnp.asarray([len(t) for t in rows], jnp.int32)
        self.last = jnp.asarray([t[-1] for t in rows], jnp.int32)
        self.live, self.key = jnp.ones((B,), bool), jax.random.key(0)
        self.drafts = jnp.tile(self.last[:, None], (1, S.specs["vegas"].gamma))   # any tokens: the cost is the same
        self.st = compiled["build"](S.params, jnp.asarray(toks), self.lengths)
        self.ls = compiled["build_longspec"](S.drafter, S.params, jnp.asarray(toks), self.lengths) \
            if "build_longspec" in compiled else None
        self.box = {"cache": self.st.cache}
        self.sel = {k: compiled[f"sel_{k}"](self.st.method if k == "draft_step" else (), self.lengths)
                    for k in ("draft_step", "streaming_draft_step") if f"sel_{k}" in compiled}

    def call(self, kind):
        """A zero-argument function running one call of `kind` (the cache kept in self.box)."""
        C, p, box = self.C[kind], self.S.params, self.box
        for needs, key in (("vegas_verify", "scores"), ("longspec_draft", "tree")):   # inputs made by another kind
            if NEEDS.get(kind) == needs and key not in box:
                jax.block_until_ready(self.call(needs)())
        if kind.endswith("_round"):
            method = kind[:-len("_round")]
            ms = {"ar": (), "streaming": (), "vegas": self.st.method, "longspec": self.ls}[method]
            box["loop"] = self.C[f"start_{method}"](box.pop("cache"), self.st.logits, ms, self.key)
            dp = self.S.drafter if method == "longspec" else None

            def run():
                box["loop"] = C(p, dp, box["loop"])
                return box["loop"].last
            return run

        def run():
            if kind in ("plain_step", "draft_step", "streaming_draft_step"):
                extra = (self.sel[kind],) if kind in self.sel else ()
                tok, box["cache"] = C(p, box["cache"], self.last, self.live, *extra)
                return tok
            if kind == "vegas_verify":
                tok, box["cache"], box["scores"] = C(p, box["cache"], self.last, self.drafts, self.live)
                return tok
            if kind == "vegas_select":
                return C(box["scores"], self.lengths)
            if kind == "longspec_draft":
                d = C(self.S.drafter, p, self.ls, box["cache"], self.last, self.key, self.live)
                box["tree"] = d.tree
                return d.tree.tokens
            if kind == "longspec_verify":
                tok, box["cache"] = C(p, box["cache"], box["tree"], self.live)
                return tok
            raise ValueError(kind)
        return run

    def done(self):
        if "loop" in self.box:   # back from the loop carry to the bare cache
            self.box["cache"] = self.box.pop("loop").cache


# --- measuring ----------------------------------------------------------------------------------------------------

def measure(run, *, reps: int, trace_calls: int):
    """(median wall seconds per call over `reps` samples of back-to-back calls, (the traced calls' device kernels
    split per call, the device threads read) or ([], []) without tracing). Two warm-up calls first."""
    for _ in range(2):
        jax.block_until_ready(run())
    t = time.perf_counter()
    jax.block_until_ready(run())
    inner = int(min(50, max(1, np.ceil(5e-3 / max(time.perf_counter() - t, 1e-6)))))   # samples of >= ~5 ms
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            out = run()
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t) / inner)
    if not trace_calls:
        return statistics.median(samples), ([], [])
    d = tempfile.mkdtemp(prefix="jspec-step-trace-")
    jax.profiler.start_trace(d, create_perfetto_trace=True)
    for _ in range(trace_calls):
        jax.block_until_ready(run())
        time.sleep(0.003)   # a gap wider than any inside a call: device_calls splits the calls there
    jax.profiler.stop_trace()
    trace = common.read_trace(d)
    return statistics.median(samples), common.device_calls(trace, trace_calls) if trace else ([], [])


def compile_all(S: Setup, batches, cap: int, kinds, impl, jobs: int, t0: float):
    """Trace every program of every batch size, then compile them together in a thread pool. Returns
    ({"B/name": compiled}, {"B/name": error}): a program that fails to lower or compile is recorded, not fatal."""
    pool = common.CompilePool(jobs or min(16, os.cpu_count() or 1), t0)
    errors = {}
    for B in batches:
        for name, tr in trace_programs(S, B, cap, kinds, impl).items():
            try:
                pool.submit(f"{B}/{name}", tr.lower)
            except Exception as e:   # a kernel that does not lower here: that kind's record says so
                errors[f"{B}/{name}"] = f"{type(e).__name__}: {str(e)[:400]}"
    _log(t0, f"lowered {len(pool.names)} programs; compiling with {pool.jobs} threads")
    compiled = {}
    for name in pool.names:
        try:
            compiled[name] = pool.result(name)
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {str(e)[:400]}"
    pool.pool.shutdown()
    _log(t0, f"compiled {len(compiled)} programs ({pool.stats()}), {len(errors)} failed")
    return compiled, errors


def profile_kind(run: "Runner", kind: str, spec, *, trace_calls: int, reps: int, top: int, over: bool) -> dict:
    """One record: the static count of the kind's compiled program, then (unless `over`, the time budget spent)
    its wall time and, with trace_calls, its device kernels."""
    cfg = run.S.cfg
    nf = forwards(kind, spec)
    div = nf * cfg.n_layers
    launches = hlo_fusions.static_launches(run.C[kind].as_text())
    rec = common.base_record(kind=kind, B=run.B, prompt_len_mean=round(float(np.mean(run.lengths)), 1),
                             n_layers=cfg.n_layers, forwards=nf, spec=None if kind == "plain_step" else spec.describe(),
                             static=hlo_fusions.summarize_static(launches, div))
    if over:
        rec["skipped"] = "time budget spent"
        return rec
    try:
        wall, (calls, threads) = measure(run.call(kind), reps=reps, trace_calls=trace_calls)
    except Exception as e:   # one failure must not end the run (the next kinds may still run)
        rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        return rec
    finally:
        run.done()
    rec["wall_ms"] = round(wall * 1e3, 4)
    if calls:
        rec.update(trace_record(calls, hlo_fusions.trace_names(launches), div, top), trace_threads=threads)
    return rec


def profile(*, out: str, model_name: str = "smollm2-135m", tiny: bool = False, L: int = 7936,
            batches=(64, 16, 1), kinds=KINDS, texts=None, gamma: int = 4, dense_rows: int = 0, exact: bool = False,
            reps: int = 7, trace_calls: int = 4, top: int = 25, jobs: int = 0, time_budget_s: float = 240.0) -> dict:
    """Profile every step kind at every batch size (trace_calls=0: no profiler trace; a CPU has no device
    kernels to trace anyway). Writes `out` (bench.common.write_json, with provenance) after each batch size and
    returns its {"records": [...], "summary": {...}}."""
    from jspec import provenance
    t0 = time.perf_counter()
    provenance.record(allow_dirty=os.environ.get("JSPEC_ALLOW_DIRTY") == "1")   # refuse before spending the GPU
    bad = set(kinds) - set(KINDS + EXTRA_KINDS)
    if bad:
        raise SystemExit(f"error: unknown step kinds {sorted(bad)}; known: {', '.join(KINDS + EXTRA_KINDS)}")
    kinds = [k for k in KINDS + EXTRA_KINDS if k in kinds]   # a kind's inputs come from kinds before it
    S = setup(model_name=model_name, tiny=tiny, L=L, B=max(batches), texts=texts, gamma=gamma)
    if jax.devices()[0].platform != "gpu":
        trace_calls = 0
    _log(t0, f"{jax.devices()[0].device_kind}: {'tiny' if tiny else model_name} ({S.cfg.n_layers} layers), L={L}, "
             f"B={list(batches)}: prompts ready")
    margin = max(s.capacity_margin() for s in list(S.specs.values()) + [S.longspec_spec(B) for B in batches])
    cap = -(-(max(len(t) for t in S.prompts) + margin + 16) // 128) * 128
    compiled, errors = compile_all(S, batches, cap, kinds, AttnImpl(dense_rows=dense_rows, exact=exact), jobs, t0)
    records, summary = [], {}
    settings = dict(model="tiny" if tiny else model_name, L=L, batches=list(batches), kinds=list(kinds), gamma=gamma,
                    dense_rows=dense_rows, exact=exact, reps=reps, trace_calls=trace_calls, capacity=cap,
                    specs={k: v.describe() for k, v in S.specs.items()}, compile_errors=errors)
    for B in batches:
        mine = {k.split("/", 1)[1]: v for k, v in compiled.items() if k.startswith(f"{B}/")}
        try:
            run = Runner(S, B, mine)
        except Exception as e:   # no state for this batch size: every kind says why
            run, why = None, f"building the state failed: {type(e).__name__}: {str(e)[:300]}"
        for kind in kinds:
            spec = S.longspec_spec(B) if kind.startswith("longspec") else \
                S.specs.get(kind.split("_")[0], S.specs["vegas"])
            if run is None or kind not in mine:
                rec = common.base_record(kind=kind, B=B, L=L,
                                         error=why if run is None else errors.get(
                                             f"{B}/{kind}", "an input's program did not compile: settings.compile_errors"))
                records.append(rec)
                print(f"B={B:<3} {kind:<21} error: {rec['error'][:200]}", flush=True)
                continue
            rec = profile_kind(run, kind, spec, trace_calls=trace_calls, reps=reps, top=top,
                               over=time.perf_counter() - t0 > time_budget_s)
            rec["L"] = L
            records.append(rec)
            _print_record(rec)
            for key, field in (("{}_ms_B{}", "wall_ms"), ("{}_device_ms_B{}", "device_ms"),
                               ("kernels_per_{}_B{}", "kernels_per_call")):
                if rec.get(field) is not None:
                    summary[key.format(kind, B)] = rec[field]
            summary[f"static_launches_{kind}_B{B}"] = rec["static"]["launches"]
        del run
        summary["wall_s"] = round(time.perf_counter() - t0, 1)
        common.write_json(out, records, summary, settings=settings, complete=B == batches[-1])
    _report(records)
    return {"records": records, "summary": summary}


# --- printing ------------------------------------------------------------------------------------------------------

def _log(t0, msg):
    print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", flush=True)


def _print_record(r):
    f = lambda v, w=9, d=3: f"{v:{w}.{d}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"  # noqa: E731
    st = r["static"]
    print(f"B={r['B']:<3} {r['kind']:<21} wall {f(r.get('wall_ms'))} ms  device {f(r.get('device_ms'))} ms  span "
          f"{f(r.get('span_ms'))} ms  kernels {f(r.get('kernels_per_call'), 6, 0)} ({f(r.get('kernels_per_layer'), 5, 1)}"
          f"/layer)  static {st['launches']:5d} ({f(st['per_layer'], 5, 1)}/layer)" +
          (f"  {r.get('skipped') or r.get('error')}"[:200] if "skipped" in r or "error" in r else ""),
          flush=True)


def _report(records):
    """Per step kind at the largest B: the static groups and the launches the program's writing adds."""
    B = max(r["B"] for r in records)
    print(f"\nlaunches by group (static; per layer in brackets) and the program-structure launches, B={B}:")
    for r in records:
        if r["B"] != B or "static" not in r:
            continue
        st = r["static"]
        groups = "  ".join(f"{g} {n}" + (f" ({pl})" if pl is not None else "") for g, (n, pl) in st["by_group"].items())
        print(f"  {r['kind']:<21} {groups}")
        print(f"  {'':<21} written-in: " + ", ".join(f"{k} {n}" + (f" ({pl})" if pl is not None else "")
                                                     for k, (n, pl) in list(st["written_in"].items())[:8]))
    for r in records:
        if r["B"] == B and r["kind"] == "plain_step" and r.get("top_kernels"):
            print(f"\ntop kernels of plain_step, B={B} (us per call, count per call, group, origin):")
            for k in r["top_kernels"][:15]:
                print(f"  {k['us']:9.1f} {k['count']:6.1f}  {k['group']:<18} {k['name'][:48]:<48} "
                      f"{(k.get('origins') or [''])[0]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m", help="known name or converted checkpoint directory")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer random model (CPU plumbing check)")
    ap.add_argument("--L", type=int, default=None, help="longest prompt (ragged rows in [0.9 L, L]; default 7936, "
                                                         "--tiny 192)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default 64,16,1; --tiny 2)")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"step kinds (also {', '.join(EXTRA_KINDS)})")
    ap.add_argument("--texts", default=None, help="text folder for the prompts (as jspec bench --texts)")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--dense-rows", type=int, default=0, help="AttnImpl(dense_rows=N): the fused dense launches")
    ap.add_argument("--exact", action="store_true",
                    help="AttnImpl(exact=True): bf16 exact mode (its target steps; drafts keep the default path)")
    ap.add_argument("--reps", type=int, default=7, help="timed samples per step kind")
    ap.add_argument("--trace-calls", type=int, default=4, help="calls in each step kind's profiler trace")
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--jobs", type=int, default=0, help="compile threads (default: CPU count, at most 16)")
    ap.add_argument("--time-budget", type=float, default=240.0,
                    help="seconds after which the remaining step kinds are recorded as skipped")
    ap.add_argument("--quick", action="store_true", help="one batch size (the first), 3 samples, 2 traced calls")
    a = ap.parse_args(argv)
    batches = [int(x) for x in (a.batches or ("2" if a.tiny else "64,16,1")).split(",") if x.strip()]
    if a.quick:
        batches, a.reps, a.trace_calls = batches[:1], 3, 2
    profile(out=a.out, model_name=a.model, tiny=a.tiny, L=a.L or (192 if a.tiny else 7936), batches=batches,
            kinds=[k for k in a.kinds.split(",") if k], texts=a.texts, gamma=a.gamma, dense_rows=a.dense_rows,
            exact=a.exact, reps=a.reps, trace_calls=0 if a.no_trace else a.trace_calls, top=a.top, jobs=a.jobs,
            time_budget_s=a.time_budget)


if __name__ == "__main__":
    main()
