"""`jspec profile-heads`: choose Dustin's Semantic Retrieval Heads and tier split offline (the paper's
Algorithm 1; docs/methods.md "Dustin", profiling).

    profile = profile_heads(jspec.load("smollm2-135m"), length=8000, budget=512, out="heads.json")

1. Calibration: `n_prompts` windows of real text (code and prose in turn, `texts_dir` or the running Python's
   stdlib), the first `length` tokens prefilled densely, then `rounds` teacher-forced verification blocks of
   gamma + 1 tokens (jspec/offline/rounds.py). Per block and per (layer, head): the target-historical map
   (the previous block's rows {0, gamma} over the whole cache), the draft map (the drafter's attention while
   it drafts this block), and the dense attention of every layer, head and row of this block.
2. ARR of a choice = mean over blocks of the share of that dense attention which I_verify (select_verify
   from the summed maps of the chosen heads) plus the block's own slots cover, averaged over all target
   layers, heads and rows. Linear in the selection, so only the attention summed over layers, heads and rows
   is kept per block.
3. Greedy, for each tier-1 size m of a grid: start with no head; add the (layer, head) of either signal whose
   map raises ARR most; stop when the gain is < `min_gain` or no head is left that the estimation budget
   allows. The budget counts key bytes: a target head costs its KV group's keys over the whole cache once
   (the scores-only pass reads keys), at most `estimation_frac` of a dense verification's K and V bytes, so
   at most floor(estimation_frac * 2 * L * K) groups. Draft heads cost nothing extra (their scores come from
   forwards the drafter runs anyway). The m with the best final ARR wins.

Writes the Profile JSON (`jspec.dustin.write_profile`; `curves` holds ARR against the number of SRHs for every
m, ARR against m with the chosen heads, and the calibration settings with provenance) and a PNG beside it.
"""
from __future__ import annotations

import functools
import os
import sys
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jspec.dustin import Profile, _check, attention_recovery, model_signature, select_verify, write_profile
from jspec.errors import InputError
from jspec.offline import rounds as R

M_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
DRAFTERS = ("self", "longspec")


# ------------------------------------------------------------------------------------------------ ARR

@functools.partial(jax.jit, static_argnames=("budget", "sink", "window", "m", "page"))
def arr(draft, target, lengths, mass, tail, count, *, budget, sink, window, m, page):
    """ARR of the selection the signals draft, target f32[I, S] give over I calibration blocks.

    mass f32[I, S]: block i's dense attention summed over layers, heads and rows, at slots before the block
    (lengths[i] of them); tail f32[I]: the same sum over the block's own slots (always read); count: layers x
    heads x rows, so (mass + tail) of a block sums to count. Returns the mean over blocks of
    (mass on I_verify + tail) / count."""
    idx, n = select_verify(draft, target, lengths, budget=budget, sink=sink, window=window, m=m, page=page)
    return jnp.mean(attention_recovery(mass / count, idx, n) + tail / count)


@functools.partial(jax.jit, static_argnames=("kind", "budget", "sink", "window", "m", "page", "chunk"))
def arr_added(draft, target, maps, lengths, mass, tail, count, *, kind, budget, sink, window, m, page, chunk=16):
    """ARR with each candidate map of maps f32[C, I, S] added to the `kind` ("draft" or "target") signal ->
    f32[C] (in chunks of `chunk` candidates, bounding memory)."""
    def one(a):
        d, t = (draft + a, target) if kind == "draft" else (draft, target + a)
        return arr(d, t, lengths, mass, tail, count, budget=budget, sink=sink, window=window, m=m, page=page)
    return jax.lax.map(one, maps, batch_size=chunk)


class Calibration:
    """The calibration blocks as the greedy needs them (device arrays): lengths int32[I], mass f32[I, S],
    tail f32[I], count; target maps f32[Ut, I, S] for the units `target_units` ((layer, head) of the target);
    draft maps f32[Ud, I, S] for `draft_units` ((layer, head) of the drafter: target layers for "self", the
    LongSpec block's layer 0 for "longspec")."""

    def __init__(self, lengths, mass, tail, count, target_maps, target_units, draft_maps, draft_units):
        self.lengths, self.mass, self.tail, self.count = lengths, mass, tail, float(count)
        self.target_maps, self.target_units = target_maps, list(target_units)
        self.draft_maps, self.draft_units = draft_maps, list(draft_units)


def greedy(cal: Calibration, *, budget: int, sink: int, window: int, m: int, page: int, group: int,
           max_groups: int, min_gain: float, bar=None) -> dict:
    """Algorithm 1 at one m: add the head (of either signal) with the largest ARR gain until the gain is below
    min_gain or nothing affordable is left. `group` = query heads per KV group (a target head's cost is its
    (layer, group) keys, paid once); at most `max_groups` groups. Ties go to the target signal, then the lower
    (layer, head). Returns {m, arr, target_heads, draft_heads, steps: [{n_srh, arr, added}], groups}."""
    kw = dict(budget=budget, sink=sink, window=window, m=m, page=page)
    args = (cal.lengths, cal.mass, cal.tail, cal.count)
    I, S = cal.mass.shape
    d, t = jnp.zeros((I, S), jnp.float32), jnp.zeros((I, S), jnp.float32)
    free = budget - sink - window
    chosen = {"target": [], "draft": []}
    groups: set = set()
    cur = float(arr(d, t, *args, **kw))
    steps = [dict(n_srh=0, arr=round(cur, 6), added=None)]
    while True:
        best = None   # (gain, kind, unit index)
        for kind, maps, units in (("target", cal.target_maps, cal.target_units),
                                  ("draft", cal.draft_maps, cal.draft_units)):
            # A tier with no slots gains nothing from its signal: skip the evaluation.
            if maps is None or (kind == "target" and m // page * page >= free) or (kind == "draft" and m < page):
                continue
            vals = np.asarray(arr_added(d, t, maps, *args, kind=kind, **kw))
            for u in np.argsort(-vals, kind="stable"):
                unit = units[u]
                if unit in chosen[kind]:
                    continue
                if kind == "target" and (unit[0], unit[1] // group) not in groups and len(groups) >= max_groups:
                    continue
                if best is None or vals[u] - cur > best[0]:
                    best = (float(vals[u] - cur), kind, int(u))
                break
        if best is None or best[0] < min_gain:
            break
        gain, kind, u = best
        unit = (cal.target_units if kind == "target" else cal.draft_units)[u]
        chosen[kind].append(unit)
        if kind == "target":
            groups.add((unit[0], unit[1] // group))
            t = t + cal.target_maps[u]
        else:
            d = d + cal.draft_maps[u]
        cur += gain
        steps.append(dict(n_srh=len(steps), arr=round(cur, 6), added=[kind, *unit]))
        if bar is not None:
            bar.set_postfix_str(f"m={m} SRHs={len(steps) - 1} ARR={cur:.4f}")
    return dict(m=m, arr=cur, target_heads=chosen["target"], draft_heads=chosen["draft"], steps=steps,
                groups=sorted(groups), d=d, t=t)


# ------------------------------------------------------------------------------------------------ calibration

def collect(params, cfg, prompts: np.ndarray, *, length: int, rounds: int, probe: "R.Probe",
            longspec=None, progress: bool = True) -> Calibration:
    """Run the calibration blocks (module docstring, step 1). prompts int32[B, length + rounds * T + 1].
    longspec: (drafter params, window) for the LongSpec drafter's signal; else the modelled self-draft's."""
    from tqdm.auto import tqdm
    B = prompts.shape[0]
    T = probe.T
    S = length + rounds * T
    toks = jnp.asarray(prompts, jnp.int32)
    cache = R.prefill(params, R.new_cache(cfg, B, S), toks[:, :length - T], cfg=cfg)
    zero = jnp.zeros((cfg.n_layers, cfg.n_heads), jnp.float32)
    prev_scores = jnp.zeros((cfg.n_layers, B, S), jnp.float32) if probe.draft_support == "vegas" else None

    def block(cache, s, prev_scores):
        return R.round_step(params, cache, toks[:, s:s + T], toks[:, s + 1:s + T + 1], R.dense_reads(B, S), zero,
                            zero, prev_scores, cfg=cfg, probe=probe)

    out, cache = block(cache, length - T, prev_scores)      # the warm-up block: round 0's historical signal
    hist, prev_scores = out["hist"], out.get("scores")
    lengths, mass, tail, tmaps, dmaps = [], [], [], [], []
    for r in tqdm(range(rounds), desc="profile-heads: calibration", unit="block", disable=not progress,
                  file=sys.stderr):
        s = length + r * T
        if longspec is not None:   # before the block: round_step donates the cache
            dparams, window = longspec
            dmaps.append(R.longspec_draft(dparams, params, toks, cache.lengths, toks[:, s:s + T], cache.k[-1],
                                          cfg=cfg, window=window))                    # [B, N, S]
        out, cache = block(cache, s, prev_scores)
        lengths.append(np.full(B, s, np.int32))
        mass.append(out["mass"])
        tail.append(out["tail"])
        tmaps.append(hist)                                  # the previous block's: what Dustin has at this one
        if longspec is None:
            dmaps.append(out["draft"])                      # [B, L, N, S]
        hist, prev_scores = out["hist"], out.get("scores")
    L, N = cfg.n_layers, cfg.n_heads
    tm = jnp.stack(tmaps).transpose(2, 3, 0, 1, 4).reshape(L * N, rounds * B, S)
    if longspec is None:
        dm = jnp.stack(dmaps).transpose(2, 3, 0, 1, 4).reshape(L * N, rounds * B, S)
        dunits = [(layer, h) for layer in range(L) for h in range(N)]
    else:
        dm = jnp.stack(dmaps).transpose(2, 0, 1, 3).reshape(N, rounds * B, S)
        dunits = [(0, h) for h in range(N)]
    return Calibration(jnp.asarray(np.concatenate(lengths)), jnp.concatenate(mass), jnp.concatenate(tail),
                       L * N * T, tm, [(layer, h) for layer in range(L) for h in range(N)], dm, dunits)


def estimation_groups(cfg, estimation_frac: float) -> int:
    """How many target (layer, KV group)s the scores-only estimation pass may read: its key bytes (one group's
    keys over the cache each) within estimation_frac of a dense verification's K and V bytes (all groups)."""
    return int(np.floor(estimation_frac * 2 * cfg.n_layers * cfg.n_kv_heads + 1e-9))


def profile_heads(model, *, length: int, budget: int = 512, sink: int = 4, window: int = 64, page: int = 1,
                  drafter: str = "self", draft_support: str = "vegas", draft_budget: int = 512,
                  drafter_dir: Optional[str] = None, texts_dir: Optional[str] = None,
                  prompts: Optional[Sequence[Sequence[int]]] = None, n_prompts: int = 4, rounds: int = 8,
                  gamma: int = 4, m_grid: Sequence[float] = M_GRID, min_gain: float = 0.002,
                  estimation_frac: float = 0.02, out: Optional[str] = None, progress: bool = True,
                  log=None) -> Profile:
    """Profile `model` (a `jspec.Model`) for Dustin at context `length` and verify budget `budget`.

    drafter: "self" (the self-speculative drafts; `draft_support` says which: vegas, quest, streaming, or
    oracle = the dense target's own attention, an upper bound) or "longspec" (the LongSpec drafter's
    cross-attention heads; `drafter_dir` or the bundled drafter). prompts: token lists of at least
    length + rounds * (gamma + 1) + 1 tokens (default: cut from texts_dir; n_prompts of them). Returns the
    Profile (also written to `out` with a PNG beside it, when given). Raises InputError on bad input.
    """
    from tqdm.auto import tqdm
    say = log or (lambda s: tqdm.write(s, file=sys.stderr))
    cfg = model.cfg
    T = gamma + 1
    need = length + rounds * T
    _checks(cfg, length=length, budget=budget, sink=sink, window=window, page=page, drafter=drafter,
            draft_support=draft_support, n_prompts=n_prompts, rounds=rounds, gamma=gamma, min_gain=min_gain,
            estimation_frac=estimation_frac, m_grid=m_grid)
    if prompts is None:
        prompts, sources = R.calibration_prompts(model.tokenizer, texts_dir, need + 1, n_prompts)
    else:
        sources = ["given"] * len(prompts)
        short = [len(p) for p in prompts if len(p) < need + 1]
        if short:
            raise InputError(f"calibration prompts need {need + 1} tokens each (length + rounds x (gamma + 1) + 1), "
                             f"got {min(short)}")
    toks = np.asarray([list(p[:need + 1]) for p in prompts], np.int32)
    longspec = None
    if drafter == "longspec":
        from jspec.api import load_drafter_for
        dr = load_drafter_for(model, drafter_dir)
        longspec = (jax.tree.map(jnp.asarray, dr.params), dr.window)
    probe = R.Probe(T=T, per_head=True, draft=longspec is None, mass=True, draft_support=draft_support,
                    draft_budget=draft_budget)
    t0 = time.perf_counter()
    cal = collect(model.params, cfg, toks, length=length, rounds=rounds, probe=probe, longspec=longspec,
                  progress=progress)
    collect_s = time.perf_counter() - t0
    max_groups = estimation_groups(cfg, estimation_frac)
    free = budget - sink - window
    ms = sorted({int(f * free) // page * page for f in m_grid})
    runs = []
    with tqdm(total=len(ms), desc="profile-heads: greedy", unit="m", disable=not progress, file=sys.stderr) as bar:
        for m in ms:
            runs.append(greedy(cal, budget=budget, sink=sink, window=window, m=m, page=page, group=cfg.group,
                               max_groups=max_groups, min_gain=min_gain, bar=bar))
            bar.update()
    best = max(runs, key=lambda r: r["arr"])     # max keeps the first (smallest m) on a tie
    grid = sorted({int(f * free) // page * page for f in np.linspace(0, 1, 9)} | set(ms))
    args = (cal.lengths, cal.mass, cal.tail, cal.count)
    by_m = [dict(m=m, arr=round(float(arr(best["d"], best["t"], *args, budget=budget, sink=sink, window=window,
                                          m=m, page=page)), 6)) for m in grid]
    K = cfg.n_kv_heads
    from jspec import provenance
    curves = dict(
        arr_vs_srh={str(r["m"]): r["steps"] for r in runs},
        arr_vs_m=by_m,
        greedy_by_m=[dict(m=r["m"], arr=round(r["arr"], 6), target_heads=len(r["target_heads"]),
                          draft_heads=len(r["draft_heads"])) for r in runs],
        estimation=dict(groups=len(best["groups"]), max_groups=max_groups,
                        key_bytes_frac_of_dense_verification=round(len(best["groups"]) / (2 * cfg.n_layers * K), 5)),
        calibration=dict(length=length, prompts=len(toks), sources=sources, rounds=rounds, gamma=gamma,
                         texts=texts_dir, draft_support=draft_support if drafter == "self" else "longspec",
                         draft_budget=draft_budget, min_gain=min_gain, estimation_frac=estimation_frac,
                         collect_s=round(collect_s, 1), total_s=round(time.perf_counter() - t0, 1),
                         dtype=str(jax.tree.leaves(model.params)[0].dtype),
                         provenance=provenance.record(allow_dirty=True)))
    prof = Profile(model=model_signature(cfg), drafter=drafter, budget=budget, sink=sink, window=window,
                   m=best["m"], page=page, target_heads=tuple(map(tuple, best["target_heads"])),
                   draft_heads=tuple(map(tuple, best["draft_heads"])), arr=round(best["arr"], 6), curves=curves)
    say(f"profile-heads: m={prof.m}, {len(prof.target_heads)} target + {len(prof.draft_heads)} draft SRHs, "
        f"ARR {prof.arr:.4f} (no heads: {runs[0]['steps'][0]['arr']:.4f}), {len(best['groups'])}/{max_groups} "
        f"estimation groups, {time.perf_counter() - t0:.0f} s")
    if out is not None:
        write_profile(out, prof)
        plot(prof, os.path.splitext(out)[0] + ".png")
    return prof


def _checks(cfg, *, length, budget, sink, window, page, drafter, draft_support, n_prompts, rounds, gamma,
            min_gain, estimation_frac, m_grid):
    for name, v in (("--length", length), ("--prompts", n_prompts), ("--rounds", rounds), ("--gamma", gamma)):
        if v < 1:
            raise InputError(f"{name} {v} must be >= 1")
    if drafter not in DRAFTERS:
        raise InputError(f"--drafter {drafter!r} unknown: {', '.join(DRAFTERS)}")
    if draft_support not in R.DRAFT_SUPPORTS:
        raise InputError(f"--draft-support {draft_support!r} unknown: {', '.join(R.DRAFT_SUPPORTS)}")
    try:
        _check(budget, sink, window, None, page)
    except ValueError as e:
        raise InputError(f"--budget: {e}") from None
    T = gamma + 1
    if length <= T:
        raise InputError(f"--length {length} must exceed gamma + 1 = {T}")
    if length + rounds * T > cfg.max_position:
        raise InputError(f"--length {length} + --rounds {rounds} x (gamma + 1) = {length + rounds * T} positions "
                         f"exceed the model's context of {cfg.max_position}; use --length <= "
                         f"{cfg.max_position - rounds * T}")
    if budget >= length:
        raise InputError(f"--budget {budget} >= --length {length}: the whole context fits, nothing to choose")
    if not 0 <= estimation_frac <= 1 or min_gain < 0:
        raise InputError(f"--estimation-frac {estimation_frac} must be in [0, 1] and --min-gain {min_gain} >= 0")
    if not m_grid or any(not 0 <= f <= 1 for f in m_grid):
        raise InputError(f"m fractions {list(m_grid)} must be in [0, 1]")


# ------------------------------------------------------------------------------------------------ plot, CLI

def plot(prof: Profile, path: str) -> Optional[str]:
    """ARR against the number of SRHs (one line per m, the chosen m bold) and against m (the chosen heads)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for m, steps in prof.curves["arr_vs_srh"].items():
        bold = int(m) == prof.m
        a.plot([s["n_srh"] for s in steps], [s["arr"] for s in steps], marker="o", ms=3,
               lw=2.2 if bold else 1, label=f"m={m}" + (" (chosen)" if bold else ""))
    a.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    a.set_xlabel("SRHs chosen (target + draft heads)")
    a.set_ylabel("ARR")
    a.legend(fontsize=7)
    a.set_title("greedy: ARR against the number of SRHs", fontsize=9)
    bm = prof.curves["arr_vs_m"]
    b.plot([p["m"] for p in bm], [p["arr"] for p in bm], marker="o")
    b.axvline(prof.m, color="0.6", ls="--", lw=1)
    b.set_xlabel(f"m (tier-1 slots of {prof.budget - prof.sink - prof.window})")
    b.set_ylabel("ARR")
    b.set_title("ARR against m, chosen heads", fontsize=9)
    c = prof.curves["calibration"]
    fig.suptitle(f"Dustin profile: budget {prof.budget}, L={c['length']}, drafter {prof.drafter} "
                 f"({c['draft_support']}), {c['prompts']} prompts x {c['rounds']} blocks", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def add_arguments(ap):
    ap.add_argument("--model", default="smollm2-135m", help="known name or converted checkpoint dir")
    ap.add_argument("--length", type=int, default=8000, help="context length L of the calibration (default 8000)")
    ap.add_argument("--budget", type=int, default=512, help="verify budget K (default 512)")
    ap.add_argument("--sink", type=int, default=4, help="protected first positions (default 4)")
    ap.add_argument("--window", type=int, default=64, help="protected newest positions (default 64)")
    ap.add_argument("--page", type=int, default=1, help="selection page size (default 1)")
    ap.add_argument("--drafter", default="self", choices=DRAFTERS,
                    help="self: the self-speculative drafts (--draft-support); longspec: the LongSpec drafter's "
                         "cross-attention heads (default self)")
    ap.add_argument("--draft-support", default="vegas", choices=R.DRAFT_SUPPORTS,
                    help="drafter self: what a draft step reads (vegas, quest, streaming) or oracle (the dense "
                         "target's attention: an upper bound) (default vegas)")
    ap.add_argument("--draft-budget", type=int, default=512, help="drafter self: the draft step's budget (512)")
    ap.add_argument("--drafter-dir", default=None, help="longspec: drafter directory (default: the bundled one)")
    ap.add_argument("--texts", default=None, metavar="DIR",
                    help="calibration text folder (*.py code, other files prose); default: the running Python's "
                         "standard library and pydoc topics")
    ap.add_argument("--prompts", type=int, default=4, help="calibration prompts, code and prose in turn (4)")
    ap.add_argument("--rounds", type=int, default=8, help="verification blocks per prompt (8)")
    ap.add_argument("--gamma", type=int, default=4, help="drafts per block: blocks of gamma + 1 rows (4)")
    ap.add_argument("--min-gain", type=float, default=0.002, help="stop when a head adds less ARR (0.002)")
    ap.add_argument("--estimation-frac", type=float, default=0.02,
                    help="key bytes of the target SRHs' KV groups, as a share of a dense verification (0.02)")
    ap.add_argument("--out", default="dustin-heads.json", help="profile JSON (a .png plot is written beside it)")


def run(a) -> int:
    import jspec
    from jspec import checkpoints
    if a.texts is not None and not os.path.isdir(a.texts):
        raise InputError(f"--texts {a.texts!r} is not a folder")
    path = checkpoints.resolve(a.model, progress=True)
    _checks(checkpoints.load_config(path), length=a.length, budget=a.budget, sink=a.sink, window=a.window,
            page=a.page, drafter=a.drafter, draft_support=a.draft_support, n_prompts=a.prompts, rounds=a.rounds,
            gamma=a.gamma, min_gain=a.min_gain, estimation_frac=a.estimation_frac, m_grid=M_GRID)   # before loading
    model = jspec.load(path)
    prof = profile_heads(model, length=a.length, budget=a.budget, sink=a.sink, window=a.window, page=a.page,
                         drafter=a.drafter, draft_support=a.draft_support, draft_budget=a.draft_budget,
                         drafter_dir=a.drafter_dir, texts_dir=a.texts, n_prompts=a.prompts, rounds=a.rounds,
                         gamma=a.gamma, min_gain=a.min_gain, estimation_frac=a.estimation_frac, out=a.out)
    print(f"wrote {a.out} (ARR {prof.arr:.4f}, m={prof.m}, target heads {list(prof.target_heads)}, draft heads "
          f"{list(prof.draft_heads)})")
    return 0
