"""Tests for jspec.sampling.

- process_logits against a float64 NumPy brute force (ties included);
- draw and verify_chain by chi-square goodness of fit, every statistical test a single vectorised call with
  fixed seeds (so the outcome is deterministic) and significance ALPHA;
- a negative control showing the same statistic at the same budget rejects broken acceptance rules;
- greedy verification against a brute-force loop.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import pytest
from scipy import stats

from jspec.config import SamplingConfig
from jspec.sampling import draw, greedy, process_logits, verify_chain, verify_greedy

ALPHA = 1e-3          # reject "follows the target distribution" below this p-value
N_TRIALS = 40_000     # batch size of every statistical verify test (one call per round)
SAMPLED = SamplingConfig(temperature=1.0)
GREEDY = SamplingConfig()


# ----------------------------------------------------------------------------------------------- helpers

def _process_logits_np(logits, temperature, top_k, top_p):
    """Brute-force float64 reference: one row at a time, explicit sort, explicit nucleus."""
    logits = np.asarray(logits, np.float32)
    flat = logits.reshape(-1, logits.shape[-1])
    out = np.zeros(flat.shape, np.float64)
    for r, row in enumerate(flat):
        if temperature == 0:
            out[r, np.argmax(row)] = 1.0
            continue
        z = row.astype(np.float64) / temperature
        order = np.argsort(-z, kind="stable")          # descending, ties: lower token id first
        kept = order[:top_k] if top_k else order
        p = np.exp(z[kept] - z[kept].max())
        p /= p.sum()
        if top_p < 1.0:
            mass_before = np.concatenate([[0.0], np.cumsum(p)[:-1]])
            kept = kept[mass_before < top_p]          # smallest prefix whose mass reaches top_p
        e = np.exp(z[kept] - z[kept].max())
        out[r, kept] = e / e.sum()
    return out.reshape(logits.shape)


def _chi2_pvalue(samples, probs):
    """Chi-square goodness-of-fit p-value of integer `samples` against `probs` (flat, float64).

    Outcomes of probability 0 must never occur (asserted). Cells with expected count < 5 are pooled so the
    chi-square approximation holds.
    """
    probs = np.asarray(probs, np.float64)
    counts = np.bincount(np.asarray(samples).ravel(), minlength=probs.size)
    assert counts.size == probs.size
    assert counts[probs == 0].sum() == 0, f"zero-probability outcomes drawn: {np.nonzero(counts * (probs == 0))}"
    expected = probs * counts.sum()
    big, small = (probs > 0) & (expected >= 5), (probs > 0) & (expected < 5)
    obs, exp = list(counts[big]), list(expected[big])
    if small.any():
        obs.append(counts[small].sum())
        exp.append(expected[small].sum())
    obs, exp = np.array(obs, np.float64), np.array(exp, np.float64)
    if obs.size == 1:                                    # a point mass: nothing left to test
        return 1.0
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def _sample_np(rng, probs):
    """Inverse-CDF sampling per row of probs [..., V] (float64); never returns a zero-probability token."""
    cdf = np.cumsum(probs, axis=-1)
    cdf /= cdf[..., -1:]                                 # trailing zero-prob tokens sit exactly at 1.0
    u = rng.random(probs.shape[:-1])
    return (u[..., None] >= cdf).sum(-1).astype(np.int32)


# -------------------------------------------------------------------------------------- process_logits

COMBOS = [  # (temperature, top_k, top_p)
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (0.5, 1, 1.0), (1.3, 0, 0.9), (0.8, 10, 0.5),
    (1.0, 40, 1.0), (1.0, 100, 0.95), (2.0, 0, 0.3), (0.6, 7, 0.999), (1.0, 0, 1e-6), (0.8, 3, 0.7),
]


@pytest.mark.parametrize("temperature,top_k,top_p", COMBOS)
def test_process_logits_matches_reference(temperature, top_k, top_p):
    rng = np.random.default_rng([int(temperature * 100), top_k, int(top_p * 1e6)])
    logits = rng.normal(size=(2, 6, 40)).astype(np.float32) * 2
    # Batch row 1 has many equal logits, so the top-k / top-p boundaries regularly fall inside a tie.
    logits[1] = np.round(logits[1] * 2) / 2
    cfg = SamplingConfig(temperature, top_k, top_p)
    probs = np.asarray(process_logits(jnp.asarray(logits), cfg))
    ref = _process_logits_np(logits, temperature, top_k, top_p)
    assert probs.shape == logits.shape and probs.dtype == np.float32
    np.testing.assert_array_equal(probs > 0, ref > 0)            # same kept set, removed tokens exactly 0
    np.testing.assert_allclose(probs, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    # The top-1 token always survives; the support never exceeds top_k.
    assert np.all(np.take_along_axis(probs, logits.argmax(-1)[..., None], -1) > 0)
    if top_k:
        assert (probs > 0).sum(-1).max() <= top_k


def test_process_logits_greedy_is_one_hot_of_first_argmax():
    logits = jnp.asarray([[0.0, 3.0, 3.0, -1.0], [5.0, 5.0, 5.0, 5.0], [-2.0, -1.0, -3.0, -1.5]])
    probs = np.asarray(process_logits(logits, GREEDY))
    np.testing.assert_array_equal(probs, np.eye(4, dtype=np.float32)[[1, 0, 1]])
    np.testing.assert_array_equal(np.asarray(greedy(logits)), [1, 0, 1])
    assert greedy(logits).dtype == jnp.int32


def test_process_logits_handles_minus_inf_and_signed_zero():
    # -inf logits (e.g. padded vocabulary) stay at 0; -0.0 and +0.0 are one tie broken by token id.
    logits = jnp.asarray([[-jnp.inf, -0.0, 0.0, -1.0, -jnp.inf, -0.0]])
    probs = np.asarray(process_logits(logits, SamplingConfig(1.0, 2, 1.0)))
    np.testing.assert_allclose(probs, [[0, 0.5, 0.5, 0, 0, 0]])
    probs = np.asarray(process_logits(logits, SamplingConfig(1.0, 0, 0.99)))
    assert probs[0, 0] == 0 and probs[0, 4] == 0 and abs(probs.sum() - 1) < 1e-6


# ------------------------------------------------------------------------------------------------ draw

DRAW_SHAPE = (100, 200)   # 20 000 draws with leading dims; both draw tests share one compile


def test_draw_chi_square_and_zero_probability_tokens():
    p = np.array([0.3, 0.2, 0.0, 0.15, 0.1, 0.0, 0.2, 0.05])
    tokens = draw(jnp.broadcast_to(jnp.asarray(p, jnp.float32), DRAW_SHAPE + (8,)), jax.random.key(0))
    assert tokens.shape == DRAW_SHAPE and tokens.dtype == jnp.int32
    assert _chi2_pvalue(tokens, p) > ALPHA                         # also asserts tokens 2 and 5 never drawn


def test_draw_never_picks_zero_next_to_tiny_weights():
    p = jnp.asarray([0.0, 1e-30, 0.0, 1.0, 0.0, 0.0, 1e-38, 0.0], jnp.float32)
    tokens = np.asarray(draw(jnp.broadcast_to(p, DRAW_SHAPE + (8,)), jax.random.key(1)))
    assert set(np.unique(tokens)) <= {1, 3, 6}


# ------------------------------------------------------------------- verify_chain: independent positions

def _chain_tables(case, g, V=5):
    """Per-absolute-position target P [2g+2, V] and draft Q [2g+2, V], positions independent of the prefix."""
    rng = np.random.default_rng({"generic": 0, "q_misses": 1, "p_forbids": 2, "equal": 3, "disjoint": 4}[case])
    A = 2 * g + 2
    P = rng.dirichlet(np.full(V, 2.0), size=A)
    Q = rng.dirichlet(np.full(V, 2.0), size=A)
    if case == "q_misses":      # draft never proposes some tokens the target likes: the residual must add them
        Q[0::2, [0, 1]] = 0
        Q[1::2, 3] = 0
    elif case == "p_forbids":   # draft proposes tokens the target forbids: those must never be emitted
        P[0::2, [2, 4]] = 0
        P[1::2, 0] = 0
    elif case == "equal":       # q == p (with zeros): everything is accepted
        P[:, 1] = 0
        Q = P
    elif case == "disjoint":    # disjoint supports: everything is rejected at position 0
        P[:, :2] = 0
        Q[:, 2:] = 0
    P /= P.sum(-1, keepdims=True)
    Q /= Q.sum(-1, keepdims=True)
    return P, Q


def _round(verify_fn, P, Q, start, g, rng, key):
    """One speculative round per trial, trial b starting at absolute position start[b]; drafts sampled from Q."""
    pos = start[:, None] + np.arange(g + 1)                                       # [N, g+1]
    draft_tokens = _sample_np(rng, Q[pos[:, :g]])                                 # [N, g]  x_i ~ q_i
    n, nxt = verify_fn(jnp.asarray(draft_tokens), jnp.asarray(Q[pos[:, :g]], jnp.float32),
                       jnp.asarray(P[pos], jnp.float32), key)
    return draft_tokens, np.asarray(n), np.asarray(nxt)


def _first_two_emitted(verify_fn, P, Q, g, seed):
    """Runs two rounds for N_TRIALS trials; returns (round-1 accept counts, first and second emitted tokens).

    Round 2 is only needed by trials that emitted one token in round 1; it starts at absolute position
    n1 + 1, so its p/q tables differ per trial.
    """
    rng = np.random.default_rng(seed)
    k1, k2 = jax.random.split(jax.random.key(seed))
    d1, n1, x1 = _round(verify_fn, P, Q, np.zeros(N_TRIALS, np.int64), g, rng, k1)
    d2, n2, x2 = _round(verify_fn, P, Q, n1.astype(np.int64) + 1, g, rng, k2)
    emitted1 = np.concatenate([d1, np.zeros_like(d1[:, :1])], 1)
    emitted1[np.arange(N_TRIALS), n1] = x1                                        # tokens [:n1+1] are valid
    first2 = np.where(n2 >= 1, d2[:, 0], x2)
    second = np.where(n1 >= 1, emitted1[:, 1], first2)
    return n1, emitted1[:, 0], second


def _verify_sampled(draft_tokens, draft_probs, target_probs, key):
    return verify_chain(draft_tokens, draft_probs, target_probs, key, SAMPLED)


def _accept_count_probs(P, Q, g):
    """P(n_accepted = k) for independent positions: β_i = Σ min(p_i, q_i) is the acceptance rate at i."""
    beta = np.minimum(P[:g], Q[:g]).sum(-1)
    reach = np.concatenate([[1.0], np.cumprod(beta)])                             # P(n >= k), k = 0..g
    return np.append(reach[:g] * (1 - beta), reach[g])


@pytest.mark.parametrize("g", [1, 3])
@pytest.mark.parametrize("case", ["generic", "q_misses", "p_forbids", "equal", "disjoint"])
def test_verify_chain_is_lossless_independent_positions(case, g):
    P, Q = _chain_tables(case, g)
    n1, first, second = _first_two_emitted(_verify_sampled, P, Q, g, seed=10 * g + len(case))
    assert n1.min() >= 0 and n1.max() <= g
    if case == "equal":
        assert np.all(n1 == g)
    if case == "disjoint":
        assert np.all(n1 == 0)
    # Speculative sampling theorem: the emitted stream is distributed as the target's.
    assert _chi2_pvalue(first, P[0]) > ALPHA
    assert _chi2_pvalue(first * P.shape[1] + second, np.outer(P[0], P[1]).ravel()) > ALPHA
    # ... and the acceptance counts have the rates Σ min(p, q) that τ depends on.
    assert _chi2_pvalue(n1, _accept_count_probs(P, Q, g)) > ALPHA


def _broken_verify(draft_tokens, draft_probs, target_probs, key, rule):
    """verify_chain with a deliberate bug, for the negative control."""
    B, g = draft_tokens.shape
    ka, kn = jax.random.split(key)
    q_x = jnp.take_along_axis(draft_probs, draft_tokens[..., None], -1)[..., 0]
    p_x = jnp.take_along_axis(target_probs[:, :g], draft_tokens[..., None], -1)[..., 0]
    u = jax.random.uniform(ka, (B, g))
    accept = u * p_x < q_x if rule == "q_over_p" else u * q_x < p_x   # min(1, q/p) instead of min(1, p/q)
    n = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), -1), -1)
    p_n = jnp.take_along_axis(target_probs, n[:, None, None], 1)[:, 0]
    q_n = jnp.take_along_axis(draft_probs, jnp.minimum(n, g - 1)[:, None, None], 1)[:, 0]
    q_n = jnp.where((n < g)[:, None], q_n, 0.0)
    resid = p_n if rule == "resample_from_p" else jnp.maximum(p_n - q_n, 0.0)  # plain p instead of the residual
    return n, jax.random.categorical(kn, jnp.log(resid), -1)


@pytest.mark.parametrize("rule", ["q_over_p", "resample_from_p"])
def test_negative_control_chi_square_catches_broken_samplers(rule):
    """The same statistic at the same budget must reject a wrong acceptance rule: the tests have power."""
    g = 3
    P, Q = _chain_tables("generic", g)
    broken = jax.jit(functools.partial(_broken_verify, rule=rule))
    _, first, second = _first_two_emitted(broken, P, Q, g, seed=10 * g + len("generic"))
    assert _chi2_pvalue(first, P[0]) < ALPHA
    assert _chi2_pvalue(first * P.shape[1] + second, np.outer(P[0], P[1]).ravel()) < ALPHA


# ------------------------------------------------------------------ verify_chain: a tiny bigram "model"

V_BIGRAM, G_BIGRAM = 16, 3


def _bigram_tables():
    rng = np.random.default_rng(7)
    target = rng.normal(size=(V_BIGRAM, V_BIGRAM)).astype(np.float32) * 2
    draft = (0.5 * target + rng.normal(size=target.shape)).astype(np.float32)  # related, but different
    return target, draft


@functools.partial(jax.jit, static_argnames=("cfg", "g"))
def _bigram_spec_step(ctx, key, target_table, draft_table, cfg, g):
    """One speculative step of a bigram model: the draft samples g tokens, the target verifies them.

    Returns (n_accepted [B], emitted [B, g+1]); emitted[:, :n_accepted+1] is what this step outputs.
    """
    def draft_one(last, key):                  # the draft model samples its own chain autoregressively
        probs = process_logits(draft_table[last], cfg)                           # [B, V]
        token = greedy(probs) if cfg.greedy else draw(probs, key)
        return token, (token, probs)

    key_draft, key_verify = jax.random.split(key)
    _, (tokens, q) = lax.scan(draft_one, ctx, jax.random.split(key_draft, g))   # [g, B], [g, B, V]
    draft_tokens = tokens.T                                                      # [B, g]
    target_ctx = jnp.concatenate([ctx[:, None], draft_tokens], 1)                # [B, g+1]
    target_probs = process_logits(target_table[target_ctx], cfg)                 # same cfg on both sides
    n, nxt = verify_chain(draft_tokens, q.transpose(1, 0, 2), target_probs, key_verify, cfg)
    emitted = jnp.concatenate([draft_tokens, draft_tokens[:, :1]], 1)
    emitted = emitted.at[jnp.arange(ctx.shape[0]), n].set(nxt)
    return n, emitted


def test_speculative_step_bigram_is_lossless():
    temperature, top_k, top_p = 0.8, 0, 0.9
    cfg = SamplingConfig(temperature, top_k, top_p)
    target, draft = _bigram_tables()
    t, d = jnp.asarray(target), jnp.asarray(draft)
    ctx = 3
    k1, k2 = jax.random.split(jax.random.key(11))
    n1, e1 = _bigram_spec_step(jnp.full((N_TRIALS,), ctx, jnp.int32), k1, t, d, cfg, G_BIGRAM)
    n1, e1 = np.asarray(n1), np.asarray(e1)
    # Round 2 continues every trial from its last emitted token; only trials with n1 = 0 need it.
    n2, e2 = _bigram_spec_step(jnp.asarray(e1[np.arange(N_TRIALS), n1]), k2, t, d, cfg, G_BIGRAM)
    second = np.where(n1 >= 1, e1[:, 1], np.asarray(e2)[:, 0])

    p = _process_logits_np(target, temperature, top_k, top_p)                    # [V, V] p(next | last)
    assert 0 < n1.mean() < G_BIGRAM and np.unique(n1).size == G_BIGRAM + 1       # a mixed batch
    assert _chi2_pvalue(e1[:, 0], p[ctx]) > ALPHA
    assert _chi2_pvalue(e1[:, 0] * V_BIGRAM + second, (p[ctx][:, None] * p).ravel()) > ALPHA


def test_speculative_step_bigram_greedy_matches_greedy_decoding():
    target, draft = _bigram_tables()
    ctx = np.arange(V_BIGRAM, dtype=np.int32)
    n, emitted = _bigram_spec_step(jnp.asarray(ctx), jax.random.key(0), jnp.asarray(target),
                                   jnp.asarray(draft), GREEDY, G_BIGRAM)
    n, emitted = np.asarray(n), np.asarray(emitted)
    for b, c in enumerate(ctx):
        want, last = [], c
        for _ in range(n[b] + 1):
            last = int(np.argmax(target[last]))
            want.append(last)
        assert emitted[b, :n[b] + 1].tolist() == want


# -------------------------------------------------------------------------- verify_chain: deterministic

def test_verify_chain_forced_rejection_positions():
    """Target one-hots force row b to reject exactly at position b (row g accepts all and takes the bonus).

    The g+1 patterns are tiled over N_TRIALS rows (same shapes as the statistical tests: no new compile).
    """
    g, V = 3, 5
    rng = np.random.default_rng(0)
    draft_tokens = rng.integers(0, V, size=(g + 1, g)).astype(np.int32)
    draft_probs = np.full((g + 1, g, V), 1.0 / V, np.float32)
    target_probs = np.full((g + 1, g + 1, V), 1.0 / V, np.float32)
    want_next = np.zeros(g + 1, np.int32)
    for b in range(g + 1):
        for i in range(b):
            target_probs[b, i] = np.eye(V)[draft_tokens[b, i]]        # p(x) = 1 >= q(x): always accepted
        # At b < g, p(x) = 0: always rejected, and max(p - q, 0) is a point mass on want_next[b].
        want_next[b] = (draft_tokens[b, b] + 1) % V if b < g else 2
        target_probs[b, b] = np.eye(V)[want_next[b]]
    rows = np.arange(N_TRIALS) % (g + 1)
    n, nxt = verify_chain(jnp.asarray(draft_tokens[rows]), jnp.asarray(draft_probs[rows]),
                          jnp.asarray(target_probs[rows]), jax.random.key(0), SAMPLED)
    assert n.dtype == jnp.int32 and nxt.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(n), rows)                # a batch with every count 0..g
    np.testing.assert_array_equal(np.asarray(nxt), want_next[rows])


def test_verify_chain_zero_residual_falls_back_to_p():
    # p = q / 2 (unnormalised, as rounding can leave it): half the drafts are rejected, but max(p - q, 0) is
    # all zero, so the next token must come from p and stay inside its support {1, 3}.
    B, g, V = N_TRIALS, 3, 5
    q = np.array([0.0, 0.3, 0.0, 0.7, 0.0], np.float32)
    draft_tokens = np.where(np.random.default_rng(0).random((B, g)) < 0.3, 1, 3).astype(np.int32)
    n, nxt = verify_chain(jnp.asarray(draft_tokens), jnp.broadcast_to(q, (B, g, V)),
                          jnp.broadcast_to(q / 2, (B, g + 1, V)), jax.random.key(0), SAMPLED)
    n, nxt = np.asarray(n), np.asarray(nxt)
    assert 0 < (n == 0).mean() < 1
    assert set(np.unique(nxt)) <= {1, 3}


def test_verify_chain_shapes_static_at_full_size():
    B, g, V = 64, 8, 152_064
    spec = jax.ShapeDtypeStruct
    out = jax.eval_shape(functools.partial(verify_chain, cfg=SamplingConfig(0.7, 50, 0.9)),
                         spec((B, g), jnp.int32), spec((B, g, V), jnp.float32), spec((B, g + 1, V), jnp.float32),
                         jax.random.key(0))
    assert [(o.shape, o.dtype) for o in out] == [((B,), jnp.int32)] * 2
    probs = jax.eval_shape(functools.partial(process_logits, cfg=SamplingConfig(0.7, 0, 0.9)),
                           spec((B, g + 1, V), jnp.bfloat16))
    assert probs.shape == (B, g + 1, V) and probs.dtype == jnp.float32


# -------------------------------------------------------------------------------------------- greedy

def _verify_greedy_loop(draft_tokens, target_logits):
    n_out, next_out = [], []
    for d, logits in zip(draft_tokens, target_logits):
        n = 0
        while n < len(d) and d[n] == np.argmax(logits[n]):
            n += 1
        n_out.append(n)
        next_out.append(np.argmax(logits[n]))
    return np.array(n_out), np.array(next_out)


@pytest.mark.parametrize("g", [1, 5])
def test_verify_greedy_matches_brute_force(g):
    B, V = 300, 4
    rng = np.random.default_rng(g)
    target_logits = np.round(rng.normal(size=(B, g + 1, V)), 1).astype(np.float32)   # some argmax ties
    right = target_logits[:, :g].argmax(-1)
    draft_tokens = np.where(rng.random((B, g)) < 0.8, right, rng.integers(0, V, (B, g))).astype(np.int32)
    want_n, want_next = _verify_greedy_loop(draft_tokens, target_logits)
    assert len(np.unique(want_n)) == g + 1                                         # every count occurs

    n, nxt = verify_greedy(jnp.asarray(draft_tokens), jnp.asarray(target_logits))
    np.testing.assert_array_equal(np.asarray(n), want_n)
    np.testing.assert_array_equal(np.asarray(nxt), want_next)
    # verify_chain with a greedy cfg on the processed (one-hot) target: same answer, key and q irrelevant.
    target_probs = process_logits(jnp.asarray(target_logits), GREEDY)
    junk_q = jnp.full((B, g, V), 1.0 / V)
    for seed in range(2):
        n, nxt = verify_chain(jnp.asarray(draft_tokens), junk_q, target_probs, jax.random.key(seed), GREEDY)
        np.testing.assert_array_equal(np.asarray(n), want_n)
        np.testing.assert_array_equal(np.asarray(nxt), want_next)
