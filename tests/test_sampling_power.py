"""Sampling tests with stated power: the JOINT law of the first emitted tokens against the exact target law, and
executed negative controls (deliberately broken rules that the same test must reject).

Why joint and why these lengths: a round that accepts every draft ends with a bonus token drawn from p at
depth + 1. A test of single-position marginals over the first 3 tokens never sees that bonus when the depth is
3 or more. Here every round has depth 2 (two chain drafts; a tree of depth 2; one draft + one lookup token), so
the first round's all-accepted outcome is (d1, d2, bonus) = the first 3 tokens, and their joint law over all
V^3 cells is compared with the exact target law p0(a) p1(b|a) p2(c|a,b) (computed by enumeration from the
target's own distributions, never from the sampler under test). Each positive test asserts that all-accepted
rounds happened, so it cannot silently lose its power.

Two levels:
- acceptance functions (`sampling.verify_chain`, `tree.grow` + `tree.accept_sampled`) on hand-built logit
  tables (V = 8), 200,000 rows in one jitted call, a round completed to 3 tokens by exact sampling from p (what
  the next rounds do). Broken rules are the library's own source with one mutation (`mutant`: the source is
  edited and re-executed, and the edit must match the current code exactly, so a refactor cannot turn a control
  into a no-op);
- whole engine rounds on a tiny model (tests/test_sampling_engine.py).

Power. The statistic is Pearson's chi-square over the cells (those expected below 5 pooled into one). For any
alternative law whose total-variation distance from the target (on the pooled cells) is at least eps, the
noncentrality is N * chi2(alt || target) >= 4 eps^2 N (since TV <= sqrt(chi2) / 2), so the power at level alpha
is at least P(ncx2(df, 4 eps^2 N) > chi2.isf(alpha, df)). `power` computes it and the tests assert it: here a
5% TV distortion is detected (p < 1e-4, the failure threshold of the positive tests) with probability > 0.999.
"""
import functools
import inspect
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jspec import sampling
from jspec.config import SamplingConfig
from jspec.speculative import tree as tree_lib

V = 8
N = 200_000
PASS = 1e-4      # a correct rule passes when p > PASS (fixed seeds: this is a deterministic check)
REJECT = 1e-6    # a broken rule must give p < REJECT
# Temperature, top-k and top-p all active, so a mismatch in any of them between drafting and q is visible.
SAMP = SamplingConfig(temperature=0.8, top_k=4, top_p=0.9)
MISMATCH = {"temperature": SamplingConfig(temperature=1.0, top_k=4, top_p=0.9),
            "top_k": SamplingConfig(temperature=0.8, top_p=0.9),
            "top_p": SamplingConfig(temperature=0.8, top_k=4)}


# ------------------------------------------------------------------------------------------ statistics

def power(df: int, n: int, eps: float = 0.05, alpha: float = PASS) -> float:
    """Lower bound on the chi-square test's power at level alpha against any law at TV distance >= eps."""
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, df), df, 4 * eps ** 2 * n))


def chisquare_cells(counts, want):
    """Pearson chi-square of integer `counts` against probabilities `want` (same flat shape); cells expected
    below 5 are pooled. Returns (pvalue, df, count in cells the target forbids)."""
    n = counts.sum()
    keep = want * n >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(want[keep], want[~keep].sum()) * n
    obs, exp = obs[exp > 0], exp[exp > 0]
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue, len(obs) - 1, int(counts[want == 0].sum())


def joint_counts(seq, v):
    """[N, k] token sequences -> counts of the v^k cells (row-major)."""
    flat = np.zeros(len(seq), np.int64)
    for j in range(seq.shape[1]):
        flat = flat * v + seq[:, j]
    return np.bincount(flat, minlength=v ** seq.shape[1])


def mutant(fn, old: str, new: str, **extra_globals):
    """`fn` (a jspec function, jitted or not) re-built from its own source with `old` replaced by `new`, in a
    copy of its module's globals (plus `extra_globals`): the library's rule with exactly one deliberate bug.
    The module itself is not modified."""
    base = inspect.unwrap(fn)
    src = textwrap.dedent(inspect.getsource(base))
    assert src.count(old) == 1, f"mutation target not found exactly once in {base.__name__}: {old!r}"
    ns = dict(base.__globals__, **extra_globals)
    exec(compile(src.replace(old, new), f"<mutant of {base.__name__}>", "exec"), ns)
    return ns[base.__name__]


# --------------------------------------------------------------------------------------- hand-built model

LOGIT_SCALE, NOISE = 1.2, 0.6


def _tables(seed=0):
    """Target logits p0 [V], p1 [V, V], p2 [V, V, V] and draft logits q0, q1 = target + noise (so drafts are
    accepted often and all-accepted rounds are common, yet q != p)."""
    rng = np.random.default_rng(seed)
    p = dict(p0=LOGIT_SCALE * rng.standard_normal(V), p1=LOGIT_SCALE * rng.standard_normal((V, V)),
             p2=LOGIT_SCALE * rng.standard_normal((V, V, V)))
    q = dict(q0=p["p0"] + NOISE * rng.standard_normal(V), q1=p["p1"] + NOISE * rng.standard_normal((V, V)))
    return {k: jnp.asarray(x, jnp.float32) for k, x in {**p, **q}.items()}


def _target_law(t):
    """Exact joint law of the first 3 tokens, flat [V^3], from the processed target tables."""
    pr = lambda x: np.asarray(sampling.process_logits(x, SAMP), np.float64)
    return (pr(t["p0"])[:, None, None] * pr(t["p1"])[:, :, None] * pr(t["p2"])).reshape(-1)


def _sample(key, logits):
    """Exact sampling from process_logits(logits, SAMP) (the reference: jax.random.categorical on log p)."""
    p = sampling.process_logits(logits, SAMP)
    return jax.random.categorical(key, jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), -jnp.inf), axis=-1)


def _complete(t, key, emitted, n_emitted):
    """Rows that emitted fewer than 3 tokens continue by exact sampling from p (what later rounds must do)."""
    k1, k2 = jax.random.split(key)
    x0 = emitted[:, 0]
    x1 = jnp.where(n_emitted >= 2, emitted[:, 1], _sample(k1, t["p1"][x0]))
    x2 = jnp.where(n_emitted >= 3, emitted[:, 2], _sample(k2, t["p2"][x0, x1]))
    return jnp.stack([x0, x1, x2], axis=1)


def _emit(path_tokens, n_acc, nxt):
    """The round's emitted tokens [N, depth + 1]: path[:n], then nxt (later entries junk)."""
    n = n_acc[:, None]
    i = jnp.arange(path_tokens.shape[1] + 1)[None]
    padded = jnp.concatenate([path_tokens, jnp.zeros_like(path_tokens[:, :1])], axis=1)
    return jnp.where(i < n, padded, jnp.where(i == n, nxt[:, None], 0))


# ------------------------------------------------------------------------------------------- chain rounds

@functools.partial(jax.jit, static_argnames=("verify", "draft_samp", "lookup_q"))
def _chain_round(t, key, verify, draft_samp, lookup_q=None):
    """One round of depth 2 for N rows. lookup_q None: two drafts sampled from process_logits(q, draft_samp),
    verified against q processed with SAMP. Else one draft, then a lookup token (fixed by the prefix and the draft:
    the target's most likely next token at the draft, as a repetitive text would propose), whose q is the point
    mass ("point", what engine.extend passes) or, for the negative control, the draft model's q ("model")."""
    kd1, kd2, kv, kc = jax.random.split(key, 4)
    proc = lambda x, s=SAMP: sampling.process_logits(x, s)
    d1 = sampling.draw(jnp.broadcast_to(proc(t["q0"], draft_samp), (N, V)), kd1)
    q_1 = proc(t["q1"][d1])
    if lookup_q is None:
        d2 = sampling.draw(proc(t["q1"][d1], draft_samp), kd2)
    else:
        d2 = jnp.argmax(t["p1"][d1], axis=-1).astype(jnp.int32)
        if lookup_q == "point":
            q_1 = jax.nn.one_hot(d2, V, dtype=jnp.float32)
    drafts = jnp.stack([d1, d2], axis=1)
    q = jnp.stack([jnp.broadcast_to(proc(t["q0"]), (N, V)), q_1], axis=1)
    p = jnp.stack([jnp.broadcast_to(proc(t["p0"]), (N, V)), proc(t["p1"][d1]), proc(t["p2"][d1, d2])], axis=1)
    n_acc, nxt = verify(drafts, q, p, kv, SAMP)
    return _complete(t, kc, _emit(drafts, n_acc, nxt), n_acc + 1), n_acc


# -------------------------------------------------------------------------------------------- tree rounds

WIDTHS = (2, 2)   # 2 i.i.d. root children, 2 grandchildren (both under the best child): depth 2


def _table_run_level(t):
    def run_level(state, lvl, idx, tree):
        if lvl == 0:
            return jnp.broadcast_to(t["q0"], (N, 1, V)), state
        return t["q1"][tree.tokens[:, idx]], state
    return run_level


@functools.partial(jax.jit, static_argnames=("grow", "accept", "chain"))
def _tree_round(t, key, grow, accept, chain=0):
    """One tree round for N rows: `grow` (tree.grow or a mutant) on the table drafter, target logits by path,
    `accept` (tree.accept_sampled or a mutant). chain=1: plus a root chain of one lookup token, a point-mass
    draft tried after the sampled root children: the token the draft most under-weights (argmax p0 - q0), so
    it keeps mass in the residual left by rejected children and is both accepted and rejected often."""
    kg, ka, kc = jax.random.split(key, 3)
    tr, q, _ = grow(WIDTHS, SAMP, kg, jnp.zeros((N,), jnp.int32), _table_run_level(t), None)
    if chain:
        proc = lambda x: sampling.process_logits(x, SAMP)
        x = jnp.argmax(proc(t["p0"]) - proc(t["q0"]))
        tr = tree_lib.add_chain(tr, jnp.full((N, chain), x, jnp.int32))
    dep = jnp.asarray(tree_lib.node_depths(WIDTHS, chain))
    par_tok = jnp.take_along_axis(tr.tokens, jnp.maximum(tr.parent, 0), axis=1)
    tl = jnp.where((dep == 0)[None, :, None], t["p0"][None, None],
                   jnp.where((dep == 1)[None, :, None], t["p1"][tr.tokens], t["p2"][par_tok, tr.tokens]))
    best, n_acc, nxt = accept(WIDTHS, tr, q, tl, SAMP, ka, chain=chain)
    path_tokens = jnp.take_along_axis(tr.tokens, tree_lib.path(WIDTHS, tr, best, chain=chain), axis=1)
    return _complete(t, kc, _emit(path_tokens, n_acc, nxt), n_acc + 1), n_acc


# ------------------------------------------------------------------------------------------------ mutants

def bonus_from_residual_chain():
    """m1, chain: the all-accepted bonus drawn from norm(max(p_g - q_{g-1}, 0)) instead of p_g."""
    return mutant(sampling.verify_chain, "q_n = jnp.where((n_accepted < g)[:, None], q_n, 0.0)", "pass")


def bonus_from_residual_tree():
    """m1, tree: the bonus at a leaf drawn from norm(max(p_leaf - q_parent, 0)) instead of p_leaf."""
    return mutant(tree_lib.accept_sampled, "final = jnp.where(alive[:, None], r, final)",
                  "final = jnp.where(alive[:, None], renorm(jnp.maximum(r - qc, 0.0), r), final)")


def point_mass_kept_tree():
    """m4: a rejected lookup (point-mass) token is not removed from the residual."""
    return mutant(tree_lib.accept_sampled,
                  "r = jnp.where((child & ~ok)[:, None], renorm(r.at[rows, x].set(0.0), r), r)", "pass")


def grow_drafting_with(draft_samp):
    """m2/m3 (tree): children drawn from the draft logits processed with `draft_samp`, q kept at SAMP."""
    return mutant(tree_lib.grow, "_sampled_children(q, score[:, idx], w_next, sub)",
                  "_sampled_children(sampling.process_logits(logits, DRAFT_SAMP), score[:, idx], w_next, sub)",
                  DRAFT_SAMP=draft_samp)


# ------------------------------------------------------------------------------------------------- checks

def _check(seq, n_acc, depth, t):
    seq, n_acc = np.asarray(seq), np.asarray(n_acc)
    hist = np.bincount(n_acc, minlength=depth + 1)
    pvalue, df, forbidden = chisquare_cells(joint_counts(seq, V), _target_law(t))
    return pvalue, df, forbidden, hist


CHAIN_CASES = {"drafts": dict(lookup_q=None), "lookup": dict(lookup_q="point")}


@pytest.mark.parametrize("case", list(CHAIN_CASES))
def test_chain_rule_joint_law_of_three_tokens(case):
    """verify_chain, depth 2 (two sampled drafts, or a draft + a lookup token): the first 3 tokens' joint law is
    the target's. All-accepted rounds (whose 3rd token is the bonus) are >= 20% of the rows."""
    t = _tables()
    seq, n_acc = _chain_round(t, jax.random.key(1), sampling.verify_chain, SAMP, **CHAIN_CASES[case])
    pvalue, df, forbidden, hist = _check(seq, n_acc, 2, t)
    assert hist[2] > 0.2 * N and hist[0] > 0.05 * N and hist[1] > 0.05 * N, hist
    assert forbidden == 0
    assert power(df, N) > 0.999, (df, power(df, N))
    assert pvalue > PASS, pvalue


@pytest.mark.parametrize("chain", [0, 1])
def test_tree_rule_joint_law_of_three_tokens(chain):
    """tree.grow + accept_sampled, widths (2, 2) (chain=1: + a lookup token beside the root's children): the
    first 3 tokens' joint law is the target's; all-accepted rounds (bonus = 3rd token) are >= 20%."""
    t = _tables()
    seq, n_acc = _tree_round(t, jax.random.key(2), tree_lib.grow, tree_lib.accept_sampled, chain)
    pvalue, df, forbidden, hist = _check(seq, n_acc, 2, t)
    assert hist[2] > 0.2 * N and hist[0] > 0.02 * N and hist[1] > 0.05 * N, hist
    assert forbidden == 0
    assert power(df, N) > 0.999, (df, power(df, N))
    assert pvalue > PASS, pvalue


NEGATIVE = {
    # (family, how the round is built)
    "m1-chain-bonus-from-residual": ("chain", lambda: dict(verify=bonus_from_residual_chain(), draft_samp=SAMP)),
    "m1-tree-bonus-from-residual": ("tree", lambda: dict(grow=tree_lib.grow, accept=bonus_from_residual_tree())),
    "m2-chain-draft-temperature": ("chain", lambda: dict(verify=sampling.verify_chain,
                                                         draft_samp=MISMATCH["temperature"])),
    "m3-chain-draft-top-k": ("chain", lambda: dict(verify=sampling.verify_chain, draft_samp=MISMATCH["top_k"])),
    "chain-draft-top-p": ("chain", lambda: dict(verify=sampling.verify_chain, draft_samp=MISMATCH["top_p"])),
    "m2-tree-draft-temperature": ("tree", lambda: dict(grow=grow_drafting_with(MISMATCH["temperature"]),
                                                       accept=tree_lib.accept_sampled)),
    "m3-tree-draft-top-k": ("tree", lambda: dict(grow=grow_drafting_with(MISMATCH["top_k"]),
                                                 accept=tree_lib.accept_sampled)),
    "tree-draft-top-p": ("tree", lambda: dict(grow=grow_drafting_with(MISMATCH["top_p"]),
                                              accept=tree_lib.accept_sampled)),
    "m4-tree-lookup-point-mass-kept": ("tree", lambda: dict(grow=tree_lib.grow, accept=point_mass_kept_tree(),
                                                            chain=1)),
    "chain-lookup-with-model-q": ("chain", lambda: dict(verify=sampling.verify_chain, draft_samp=SAMP,
                                                        lookup_q="model")),
}


@pytest.mark.parametrize("name", list(NEGATIVE))
def test_negative_control_is_rejected(name):
    """Each broken rule, through the same round and the same test as the positive tests: p < 1e-6."""
    family, build = NEGATIVE[name]
    t = _tables()
    round_fn = _chain_round if family == "chain" else _tree_round
    seq, n_acc = round_fn(t, jax.random.key(1 if family == "chain" else 2), **build())
    pvalue, _, _, hist = _check(seq, n_acc, 2, t)
    assert pvalue < REJECT, (name, pvalue, hist)
