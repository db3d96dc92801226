"""`jspec fidelity`: what verifying against I_verify costs the target, teacher-forced (issue 30, part 6;
docs/methods.md "Dustin", fidelity).

    doc = fidelity(jspec.load("smollm2-135m"), lengths=(2048, 4096, 8000), budgets=(128, 256, 512, 1024))

For each context length L: `n_prompts` windows of real text (code and prose in turn), the first L tokens
prefilled densely, then `rounds` verification blocks of gamma + 1 tokens teacher-forced (the text's own
tokens, as if every draft were accepted; jspec/offline/rounds.py). Every selection method at every budget runs
the same blocks in one batch beside a dense reference, each row attending at every layer only to what its
method selects before the block plus the block's own slots, and writing its own K/V (the sparse target's
cache, as a Dustin run keeps it). Per row and position: top-1 agreement with the dense reference and the NLL
of the text's next token.

Methods (one global set for every layer and head unless said):
  dustin     sink + window, tier 1 the top-m by the draft signal, tier 2 the rest by the target signal
             (m: the profile's share of the free slots, else half)
  draft      draft-only (m = every free slot);  target: target-only (m = 0)
  streaming  sink + the budget's newest positions (StreamingLLM)
  quest      per layer and row, the budget // page best pages by Quest's min/max key bound for that row's
             own queries, plus the partial last page
Signals: target = the row's own previous block's rows {0, gamma} over the whole cache on the profile's target
heads (all heads without a profile); draft (`draft_signal`) = "oracle": the dense target's own attention at
the block's draft rows (an upper bound for any drafter, labelled so), "vegas" / "quest" / "streaming": that
attention restricted to what a modelled self-draft step reads, "longspec": the LongSpec drafter's
cross-attention while it drafts the block.
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

from jspec.dustin import Profile, _check, read_profile, select_verify
from jspec.errors import InputError
from jspec.offline import rounds as R

METHODS = ("dustin", "draft", "target", "streaming", "quest")
BUDGETS = (128, 256, 512, 1024)
DRAFT_SIGNALS = R.DRAFT_SUPPORTS + ("longspec",)


@functools.partial(jax.jit, static_argnames=("S", "budget", "sink", "window", "m", "page"))
def selection_mask(draft, target, lengths, *, S, budget, sink, window, m, page):
    """select_verify as a mask: bool[B, S], True at the chosen positions."""
    idx, n = select_verify(draft, target, lengths, budget=budget, sink=sink, window=window, m=m, page=page)
    B = idx.shape[0]
    keep = jnp.arange(idx.shape[1])[None] < n[:, None]
    return jnp.zeros((B, S), bool).at[jnp.arange(B)[:, None], jnp.where(keep, idx, S)].set(True, mode="drop")


def _variants(methods, budgets, *, sink, window, page, m_share):
    """[(method, budget, m)] in batch order, the dense reference first (budget None)."""
    out = [("dense", None, None)]
    for method in methods:
        for K in budgets:
            free = K - sink - window
            m = {"dustin": int(m_share * free) // page * page, "draft": free, "target": 0}.get(method)
            out.append((method, K, m))
    return out


def fidelity(model, *, lengths: Sequence[int] = (2048, 4096, 8000), budgets: Sequence[int] = BUDGETS,
             methods: Sequence[str] = METHODS, profile=None, draft_signal: str = "oracle", sink: int = 4,
             window: int = 64, page: int = 1, quest_page: int = 16, draft_budget: int = 512,
             drafter_dir: Optional[str] = None, texts_dir: Optional[str] = None, prompts=None, n_prompts: int = 8,
             rounds: int = 16, gamma: int = 4, progress: bool = True, log=None) -> dict:
    """Teacher-forced fidelity of every method x budget at every context length (module docstring).

    profile: a Profile, its JSON path or None (its heads, m share, sink, window and page are then used).
    prompts: token lists of at least max(lengths) + rounds * (gamma + 1) + 1 tokens (default: cut from
    texts_dir). Returns {settings, records, summary}; a record per (L, method, budget) with agreement,
    nll_dense, nll_sparse, nll_increase, nll_increase_frac, recovered (the rows' own dense attention mass on
    what they read, mean over layers, heads, rows), arr (the selection's ARR against the dense reference's
    attention; global sets only). Raises InputError on bad input."""
    from tqdm.auto import tqdm
    say = log or (lambda s: tqdm.write(s, file=sys.stderr))
    cfg = model.cfg
    prof = profile if isinstance(profile, Profile) or profile is None else read_profile(profile, cfg)
    if prof is not None:
        prof.check_model(cfg)
        sink, window, page = prof.sink, prof.window, prof.page
    T = gamma + 1
    lengths, budgets, methods = list(lengths), list(budgets), list(methods)
    checks(cfg, lengths=lengths, budgets=budgets, methods=methods, draft_signal=draft_signal, sink=sink,
           window=window, page=page, quest_page=quest_page, n_prompts=n_prompts, rounds=rounds, gamma=gamma)
    if prof is not None and (prof.drafter == "longspec") != (draft_signal == "longspec"):
        raise InputError(f"the profile was made for drafter {prof.drafter!r}; --draft-signal {draft_signal} "
                         f"{'is' if draft_signal == 'longspec' else 'is not'} longspec")
    m_share = 0.5 if prof is None or prof.m is None else prof.m / (prof.budget - prof.sink - prof.window)
    head_t = R.heads_mask(cfg, prof.target_heads if prof is not None and prof.target_heads else None)
    if draft_signal == "longspec":
        from jspec.api import load_drafter_for
        dr = load_drafter_for(model, drafter_dir)
        longspec = (jax.tree.map(jnp.asarray, dr.params), dr.window)
        head_d = np.zeros((cfg.n_layers, cfg.n_heads), np.float32)
        head_d[0] = 1.0
        if prof is not None and prof.draft_heads:
            head_d[0] = 0.0
            for _, h in prof.draft_heads:
                head_d[0, h] = 1.0
    else:
        longspec = None
        head_d = R.heads_mask(cfg, prof.draft_heads if prof is not None and prof.draft_heads else None)
    variants = _variants(methods, budgets, sink=sink, window=window, page=page, m_share=m_share)
    S = max(lengths) + rounds * T
    need = max(lengths) + rounds * T + 1
    if prompts is not None:
        short = [len(p) for p in prompts if len(p) < need]
        if short:
            raise InputError(f"prompts need {need} tokens each (max length + rounds x (gamma + 1) + 1), got "
                             f"{min(short)}")
    t0 = time.perf_counter()
    records = []
    bar = tqdm(total=len(lengths) * 2 * rounds, desc="fidelity", unit="block", disable=not progress, file=sys.stderr)
    for L in lengths:
        if prompts is None:
            rows, sources = R.calibration_prompts(model.tokenizer, texts_dir, L + rounds * T + 1, n_prompts)
        else:
            rows, sources = [list(p[:L + rounds * T + 1]) for p in prompts], ["given"] * len(prompts)
        toks = jnp.asarray(np.asarray(rows, np.int32))
        res = _one_length(model.params, cfg, toks, L=L, S=S, rounds=rounds, T=T, variants=variants,
                          head_t=jnp.asarray(head_t), head_d=jnp.asarray(head_d), draft_signal=draft_signal,
                          draft_budget=draft_budget, sink=sink, window=window, page=page, quest_page=quest_page,
                          longspec=longspec, bar=bar)
        for rec in res:
            rec.update(L=L, prompts=len(rows), sources=sorted(set(sources)))
            records.append(rec)
            if rec["method"] != "dense":
                say(f"L={L} {rec['method']:<9} budget {rec['budget']:>5}: agreement {rec['agreement']:.4f}, NLL "
                    f"+{rec['nll_increase']:.4f} ({100 * rec['nll_increase_frac']:.2f}%), recovered "
                    f"{rec['recovered']:.3f}")
    bar.close()
    from jspec import provenance
    settings = dict(lengths=lengths, budgets=budgets, methods=methods, draft_signal=draft_signal,
                    draft_signal_note=("upper bound: the dense target's own attention at the draft rows"
                                       if draft_signal == "oracle" else "modelled self-draft reads, dense queries"
                                       if draft_signal != "longspec" else "the LongSpec drafter's cross-attention"),
                    profile=None if prof is None else dict(drafter=prof.drafter, budget=prof.budget, m=prof.m,
                                                           target_heads=[list(h) for h in prof.target_heads],
                                                           draft_heads=[list(h) for h in prof.draft_heads]),
                    m_share=m_share, sink=sink, window=window, page=page, quest_page=quest_page,
                    draft_budget=draft_budget, prompts=n_prompts if prompts is None else len(prompts),
                    rounds=rounds, gamma=gamma, texts=texts_dir, dtype=str(jax.tree.leaves(model.params)[0].dtype))
    return dict(provenance=provenance.record(allow_dirty=True), settings=settings, complete=True,
                wall_s=round(time.perf_counter() - t0, 1), records=records, summary=summarize(records))


def _one_length(params, cfg, toks, *, L, S, rounds, T, variants, head_t, head_d, draft_signal, draft_budget, sink,
                window, page, quest_page, longspec, bar):
    """Dense pass (the draft signal, ARR's reference), then every variant in one batch. Records per variant."""
    B = toks.shape[0]
    V = len(variants)
    support = "oracle" if draft_signal == "longspec" else draft_signal
    dense_probe = R.Probe(T=T, draft=longspec is None, mass=True, draft_support=support, draft_budget=draft_budget)
    n_quest = [K // quest_page if method == "quest" else 0 for method, K, _ in variants]
    var_probe = R.Probe(T=T, quest_page=quest_page, quest_max_pages=max(n_quest))
    cache = R.prefill(params, R.new_cache(cfg, B, S), toks[:, :L - T], cfg=cfg)
    prev = jnp.zeros((cfg.n_layers, B, S), jnp.float32) if support == "vegas" else None

    def dense_block(cache, s, prev):
        return R.round_step(params, cache, toks[:, s:s + T], toks[:, s + 1:s + T + 1], R.dense_reads(B, S), head_t,
                            head_d, prev, cfg=cfg, probe=dense_probe)

    out, cache = dense_block(cache, L - T, prev)                         # warm-up: the first target signal
    vcache = R.tile_cache(cache, V)
    hist = jnp.tile(out["hist"], (V, 1))
    prev = out.get("scores")
    drafts, mass, tail = [], [], []
    for r in range(rounds):
        s = L + r * T
        if longspec is not None:
            w = R.longspec_draft(longspec[0], params, toks, cache.lengths, toks[:, s:s + T], cache.k[-1], cfg=cfg,
                                 window=longspec[1])
            drafts.append(jnp.einsum("BNS,N->BS", w, head_d[0]))
        out, cache = dense_block(cache, s, prev)
        if longspec is None:
            drafts.append(out["draft"])
        mass.append(out["mass"])
        tail.append(out["tail"])
        prev = out.get("scores")
        bar.update()
    del cache
    count = cfg.n_layers * cfg.n_heads * T
    qp = jnp.repeat(jnp.asarray(n_quest, jnp.int32), B)
    top1, nll, rec, arr = [], [], [], []
    for r in range(rounds):
        s = L + r * T
        lengths = jnp.full((B,), s, jnp.int32)
        sels = []
        for v, (method, K, m) in enumerate(variants):
            hv = hist[v * B:(v + 1) * B]
            if method in ("dense", "quest"):
                sels.append(jnp.ones((B, S), bool))
            elif method == "streaming":
                z = jnp.zeros((B, S), jnp.float32)
                sels.append(selection_mask(z, z, lengths, S=S, budget=K, sink=sink, window=K - sink, m=0, page=1))
            else:
                sels.append(selection_mask(drafts[r], hv, lengths, S=S, budget=K, sink=sink, window=window, m=m,
                                           page=page))
        sel = jnp.concatenate(sels)
        out, vcache = R.round_step(params, vcache, jnp.tile(toks[:, s:s + T], (V, 1)),
                                   jnp.tile(toks[:, s + 1:s + T + 1], (V, 1)), R.Reads(sel=sel, quest_pages=qp),
                                   head_t, head_d, None, cfg=cfg, probe=var_probe)
        hist = out["hist"]
        top1.append(np.asarray(out["top1"]).reshape(V, B, T))
        nll.append(np.asarray(out["nll"], np.float64).reshape(V, B, T))
        rec.append(np.asarray(out["recovered"], np.float64).reshape(V, B))
        # ARR of the global sets against the dense reference's attention of this block
        m_ = np.asarray(sel, np.float64).reshape(V, B, S) * np.asarray(mass[r], np.float64)[None]
        arr.append((m_.sum(-1) + np.asarray(tail[r], np.float64)[None]) / count)
        bar.update()
    top1, nll = np.stack(top1, 2), np.stack(nll, 2)              # [V, B, rounds, T]
    rec, arr = np.stack(rec, 2), np.stack(arr, 2)                # [V, B, rounds]
    out = []
    dense_nll = float(nll[0].mean())
    agree = (top1 == top1[:1]).astype(np.float64)                # [V, B, rounds, T]
    for v, (method, K, m) in enumerate(variants):
        inc = float(nll[v].mean()) - dense_nll
        out.append(dict(method=method, budget=K, m=m, positions=int(top1[v].size),
                        agreement=round(float(agree[v].mean()), 6), nll_dense=round(dense_nll, 6),
                        nll_sparse=round(float(nll[v].mean()), 6), nll_increase=round(inc, 6),
                        nll_increase_frac=round(inc / dense_nll, 6) if dense_nll else None,
                        recovered=round(float(rec[v].mean()), 6),
                        arr=None if method == "quest" else round(float(arr[v].mean()), 6)))
        if method == "dustin":   # against each baseline at the same budget, on the same positions
            out[-1]["versus"] = {
                rival: dict(agreement=paired(agree[v], agree[w]), nll=paired(nll[v], nll[w]))
                for w, (rival, K2, _) in enumerate(variants) if K2 == K and rival in ("streaming", "quest")}
    return out


# t_{0.975} quantiles for 1..30 degrees of freedom (beyond 30: 2.0, which covers every df >= 60 and is within 2%
# of the exact value above 30)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def paired(a, b) -> dict:
    """The mean of a - b over paired positions [B, ...] with a 95% interval that treats each row (prompt) as one
    observation: positions of one text are not independent, rows are. Student's t over the B per-row mean
    differences (B >= 2; with one row the interval is None).
    Returns {"diff": mean, "ci95": [lo, hi] or None}."""
    d = (np.asarray(a, np.float64) - np.asarray(b, np.float64)).reshape(np.shape(a)[0], -1).mean(-1)   # [B]
    n = d.size
    if n < 2:
        return dict(diff=round(float(d.mean()), 6), ci95=None)
    half = (_T975[n - 2] if n - 1 <= len(_T975) else 2.0) * d.std(ddof=1) / np.sqrt(n)
    return dict(diff=round(float(d.mean()), 6), ci95=[round(float(d.mean() - half), 6),
                                                      round(float(d.mean() + half), 6)])


def standing(versus: dict) -> Optional[str]:
    """'ahead' when, against every rival, Dustin is significantly better on agreement or NLL (the 95% interval
    excludes 0 in its favour) and significantly worse on neither; 'behind' when it is significantly worse on
    either against any rival; 'level' otherwise; None without intervals."""
    better = worse = 0
    for v in versus.values():
        a, n = v["agreement"]["ci95"], v["nll"]["ci95"]
        if a is None or n is None:
            return None
        worse += a[1] < 0 or n[0] > 0
        better += a[0] > 0 or n[1] < 0
    return "behind" if worse else "ahead" if versus and better == len(versus) else "level"


def summarize(records: list) -> dict:
    """Per L and budget: Dustin's agreement and NLL increase share, whether it beats streaming and quest on both
    point estimates (`beats`), and whether that holds beyond the prompts' noise (`standing`: ahead, level or
    behind on paired 95% intervals over the rows)."""
    out = {}
    for r in records:
        if r["method"] != "dustin":
            continue
        L, K = r["L"], r["budget"]
        out[f"dustin_top1_agreement_L{L}_budget{K}"] = r["agreement"]
        out[f"dustin_nll_increase_frac_L{L}_budget{K}"] = r["nll_increase_frac"]
        rivals = [x for x in records if x["L"] == L and x["budget"] == K and x["method"] in ("streaming", "quest")]
        if rivals:
            out[f"dustin_beats_streaming_and_quest_L{L}_budget{K}"] = all(
                r["agreement"] >= x["agreement"] and r["nll_increase"] <= x["nll_increase"] for x in rivals)
        if r.get("versus"):
            out[f"dustin_standing_L{L}_budget{K}"] = standing(r["versus"])
    return out


def checks(cfg, *, lengths, budgets, methods, draft_signal, sink, window, page, quest_page, n_prompts, rounds,
           gamma):
    for name, v in (("--prompts", n_prompts), ("--rounds", rounds), ("--gamma", gamma), ("--quest-page", quest_page)):
        if v < 1:
            raise InputError(f"{name} {v} must be >= 1")
    if not lengths or not budgets or not methods:
        raise InputError("--lengths, --budgets and --methods must not be empty")
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        raise InputError(f"unknown method(s) {bad}: {', '.join(METHODS)}")
    if draft_signal not in DRAFT_SIGNALS:
        raise InputError(f"--draft-signal {draft_signal!r} unknown: {', '.join(DRAFT_SIGNALS)}")
    T = gamma + 1
    for L in lengths:
        if L <= T:
            raise InputError(f"--lengths {L} must exceed gamma + 1 = {T}")
    if max(lengths) + rounds * T > cfg.max_position:
        raise InputError(f"--lengths {max(lengths)} + --rounds {rounds} x (gamma + 1) = "
                         f"{max(lengths) + rounds * T} positions exceed the model's context of {cfg.max_position}; "
                         f"use lengths <= {cfg.max_position - rounds * T}")
    for K in budgets:
        try:
            _check(K, sink, window, None, page)
        except ValueError as e:
            raise InputError(f"--budgets {K}: {e}") from None
        if "quest" in methods and K < quest_page:
            raise InputError(f"--budgets {K} < --quest-page {quest_page}: quest needs one page")


# ------------------------------------------------------------------------------------------------ plot, CLI

def plot(doc: dict, path: str) -> Optional[str]:
    """Agreement and NLL increase (% of dense) against budget, one line per method, a column per L."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    recs = [r for r in doc["records"] if r["method"] != "dense"]
    Ls = sorted({r["L"] for r in recs})
    fig, axes = plt.subplots(2, len(Ls), figsize=(4.2 * len(Ls), 6.4), squeeze=False)
    for c, L in enumerate(Ls):
        for method in dict.fromkeys(r["method"] for r in recs):
            rows = sorted((r for r in recs if r["L"] == L and r["method"] == method), key=lambda r: r["budget"])
            xs = [r["budget"] for r in rows]
            kw = dict(marker="o", ms=3, label=method, lw=2 if method == "dustin" else 1)
            axes[0, c].plot(xs, [r["agreement"] for r in rows], **kw)
            axes[1, c].plot(xs, [100 * r["nll_increase_frac"] for r in rows], **kw)
        for ax in axes[:, c]:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("verify budget K")
        axes[0, c].set_title(f"L={L}", fontsize=9)
        axes[0, c].set_ylabel("top-1 agreement with dense")
        axes[1, c].set_ylabel("NLL increase, % of dense NLL")
    axes[0, 0].legend(fontsize=7)
    s = doc["settings"]
    fig.suptitle(f"Dustin teacher-forced fidelity\n{s['prompts']} prompts x {s['rounds']} blocks of {s['gamma'] + 1}; "
                 f"draft signal {s['draft_signal']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ints(text: str, flag: str) -> list:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise InputError(f"{flag} needs positive integers, got {text!r}")
    return vals


def add_arguments(ap):
    ap.add_argument("--model", default="smollm2-135m", help="known name or converted checkpoint dir")
    ap.add_argument("--lengths", default="2048,4096,8000", help="context lengths L (default 2048,4096,8000)")
    ap.add_argument("--budgets", default="128,256,512,1024", help="verify budgets K (default 128,256,512,1024)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"selection methods (default {','.join(METHODS)})")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="a `jspec profile-heads` JSON: its heads, m, sink, window, page (default: all heads, m half)")
    ap.add_argument("--draft-signal", default="oracle", choices=DRAFT_SIGNALS,
                    help="oracle (the dense target's own attention at the draft rows: an upper bound), a modelled "
                         "self-draft (vegas, quest, streaming), or longspec (the drafter's cross-attention)")
    ap.add_argument("--draft-budget", type=int, default=512, help="modelled self-draft's budget (512)")
    ap.add_argument("--drafter-dir", default=None, help="longspec: drafter directory (default: the bundled one)")
    ap.add_argument("--sink", type=int, default=4, help="protected first positions (4; a profile's wins)")
    ap.add_argument("--window", type=int, default=64, help="protected newest positions (64; a profile's wins)")
    ap.add_argument("--quest-page", type=int, default=16, help="quest baseline's page size (16)")
    ap.add_argument("--texts", default=None, metavar="DIR",
                    help="text folder (*.py code, other files prose); default: the running Python's stdlib")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per length, code and prose in turn (8)")
    ap.add_argument("--rounds", type=int, default=16, help="verification blocks per prompt (16)")
    ap.add_argument("--gamma", type=int, default=4, help="blocks of gamma + 1 positions (4)")
    ap.add_argument("--out", default="dustin-fidelity.json", help="result JSON (a .png plot is written beside it)")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="record a run from a tree that differs from its commit (marked dirty)")


def run(a) -> int:
    import json

    from jspec import checkpoints, provenance
    lengths, budgets = _ints(a.lengths, "--lengths"), _ints(a.budgets, "--budgets")
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    if a.texts is not None and not os.path.isdir(a.texts):
        raise InputError(f"--texts {a.texts!r} is not a folder")
    path = checkpoints.resolve(a.model, progress=True)
    cfg = checkpoints.load_config(path)
    prof = None if a.profile is None else read_profile(a.profile, cfg)
    sink, window, page = (a.sink, a.window, 1) if prof is None else (prof.sink, prof.window, prof.page)
    checks(cfg, lengths=lengths, budgets=budgets, methods=methods, draft_signal=a.draft_signal, sink=sink,
           window=window, page=page, quest_page=a.quest_page, n_prompts=a.prompts, rounds=a.rounds, gamma=a.gamma)
    state = provenance.source_state()
    if (state["dirty"] or not state["verified"]) and not a.allow_dirty:   # as `jspec bench`: before any work
        what = "dirty" if state["verified"] else "not tied to a commit"
        raise InputError(f"refusing to run: the source tree is {what} (commit {state['commit'][:12]}); commit "
                         f"first, pass JSPEC_COMMIT=$(python -m jspec.provenance) on a machine without .git, or "
                         f"--allow-dirty")
    import jspec
    model = jspec.load(path)
    doc = fidelity(model, lengths=lengths, budgets=budgets, methods=methods, profile=prof,
                   draft_signal=a.draft_signal, sink=sink, window=window, page=page, quest_page=a.quest_page,
                   draft_budget=a.draft_budget, drafter_dir=a.drafter_dir, texts_dir=a.texts, n_prompts=a.prompts,
                   rounds=a.rounds, gamma=a.gamma)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".part", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(a.out + ".part", a.out)
    png = plot(doc, os.path.splitext(a.out)[0] + ".png")
    print(f"wrote {a.out}" + (f" and {png}" if png else ""))
    print(f"{'L':>6} {'method':<10} {'K':>5} {'agree':>7} {'dNLL':>8} {'dNLL%':>7} {'recov':>6}")
    for r in doc["records"]:
        if r["method"] != "dense":
            print(f"{r['L']:>6} {r['method']:<10} {r['budget']:>5} {r['agreement']:>7.4f} {r['nll_increase']:>8.4f} "
                  f"{100 * r['nll_increase_frac']:>7.2f} {r['recovered']:>6.3f}"
                  + (f"  vs streaming/quest: {standing(r['versus'])}" if r.get("versus") else ""))
    return 0
