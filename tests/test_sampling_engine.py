"""Whole engine rounds under sampling (the real code path: `speculative.init` + `speculative.run`, and
`serving.serve` with refills): the JOINT law of the 3 tokens after the prefill's token equals the exact
target law, for a chain method (vegas), the tree method (longspec, a zero-block drafter), prompt-lookup tokens
(both families) and served requests with refills. The prefill's token t0 is checked against p(t0) as well.

Every round has depth 2 (vegas: gamma = 2, or gamma = 1 + one lookup token; longspec: widths (2, 2)) and each
row generates 4 tokens: t0 comes from the prefill, so a first round that accepts everything emits exactly
(t1, t2, t3) with t3 its bonus token, and `rounds == 1` marks those rows. Each test asserts that such rows are
common, so the bonus token is observed (tests/test_sampling_power.py's docstring says why marginals of longer
rounds never see it). The target is damped (the next token depends mostly on the current one), so sparse
self-drafts and a zero-block drafter are close to it but not equal (rejections happen too).

Reference: the target's processed distributions p(t0 | prompt) .. p(t3 | prompt, t0, t1, t2) from one forward
over all V^3 continuations (no sampler involved); the law of (t1, t2, t3) sums t0 out. Statistic and power:
tests/test_sampling_power.py (`chisquare_cells`, `power`); each test asserts its stated power.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import damped
from jspec import kv_cache, model, sampling, speculative
from jspec.config import ModelConfig, SamplingConfig
from jspec.drafter import init_drafter_params
from jspec.speculative import SpecConfig
from jspec.speculative import serving as sv
from test_sampling_power import chisquare_cells, joint_counts, power

V = 8
P = 12
NEW = 4
SAMP = SamplingConfig(temperature=0.9, top_k=6, top_p=0.95)
PASS = 1e-4
EPS = 0.05        # total-variation distortion of the joint law the tests are powered against
N_ENGINE = 16_000
N_SERVE, SERVE_BATCH, SERVE_REFILL = 16_000, 256, 32   # insert unrolls `refill` rows: a small refill compiles fast
SPECS = {"vegas": SpecConfig("vegas", gamma=2, budget=4),
         "vegas-lookup": SpecConfig("vegas", gamma=1, budget=4, lookup=1),
         "longspec": SpecConfig("longspec", tree_widths=(2, 2), window=8),
         "longspec-lookup": SpecConfig("longspec", tree_widths=(2, 2), window=8, lookup=1)}


def tiny():
    return ModelConfig(arch="llama", vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                       ffn_dim=48, rope_theta=10000.0, dtype="float32", max_position=64)


# The target's own greedy text from token 0 (so lookup proposals are likely; the lookup cases assert that
# all-accepted rounds are common, which is all the tests need from it).
PROMPT = np.array([0, 6, 4, 6, 5, 5, 5, 5, 5, 5, 5, 5], np.int32)


@functools.lru_cache(maxsize=None)
def setup():
    """Damped target, zero-block drafter, the prompt, the exact law of t0 and of (t1, t2, t3) (flat [V^3])."""
    cfg = tiny()
    params = damped(model.init_params(cfg, jax.random.key(3), scale=0.2), 0.2)
    drafter = init_drafter_params(cfg, jax.random.key(4), target_params=params, scale=0.0)
    prompt = PROMPT

    grid = np.stack(np.meshgrid(*[np.arange(V)] * 3, indexing="ij"), -1).reshape(-1, 3)     # (t0, t1, t2)
    seqs = np.concatenate([np.tile(prompt, (len(grid), 1)), grid], 1)
    cache = kv_cache.init(cfg, batch=len(grid), capacity=seqs.shape[1])
    lg = jax.jit(model.forward, static_argnums=1)(params, cfg, jnp.asarray(seqs, jnp.int32), cache)[0]
    p = np.asarray(sampling.process_logits(lg[:, P - 1:], SAMP), np.float64)                # [V^3, 4, V]
    p = p.reshape(V, V, V, 4, V)
    joint = (p[0, 0, 0, 0][:, None, None, None] * p[:, 0, 0, 1][:, :, None, None]
             * p[:, :, 0, 2][:, :, :, None] * p[:, :, :, 3])                                 # [t0, t1, t2, t3]
    return cfg, params, drafter, prompt, p[0, 0, 0, 0], joint.sum(0).reshape(-1)


def _check(first4, rounds, n):
    """Chi-square of the (t1, t2, t3) joint counts, and of t0's (the prefill's token: a first token drawn with
    a wrong key or distribution would only show in (t1, t2, t3) through t0, diluted); all-accepted first rounds
    must be >= 20% of the rows. Returns the smaller p-value."""
    p0, law = setup()[-2:]
    assert (np.asarray(rounds) == 1).mean() > 0.2, np.bincount(rounds)
    pvalue, df, forbidden = chisquare_cells(joint_counts(first4[:, 1:], V), law)
    assert forbidden == 0
    assert power(df, n, EPS, PASS) > 0.9, (df, power(df, n, EPS, PASS))
    p_first, _, forbidden = chisquare_cells(np.bincount(first4[:, 0], minlength=V), p0)
    assert forbidden == 0
    return min(pvalue, p_first)


def engine_rows(name, n, key):
    cfg, params, drafter, prompt, _, _ = setup()
    spec = SPECS[name]
    drafter = drafter if spec.method == "longspec" else None
    tokens = jnp.asarray(np.tile(prompt, (n, 1)))
    state = speculative.init(params, cfg, spec, tokens, jnp.full((n,), P, jnp.int32),
                             P + NEW + spec.capacity_margin(), drafter=drafter)
    out, n_out, st = speculative.run(params, cfg, spec, SAMP, state, jax.random.key(key), NEW, drafter=drafter)
    assert (np.asarray(n_out) == NEW).all()
    return np.asarray(out), np.asarray(st.rounds)


def served_rows(n, key, batch, refill, staged):
    cfg, params, _, prompt, _, _ = setup()
    spec = SPECS["vegas"]
    outs, st = sv.serve(params, cfg, spec, SAMP, [prompt] * n, batch=batch, capacity=P + NEW + spec.capacity_margin(),
                        max_new_tokens=NEW, refill=refill, staged=staged, seed=key)
    assert all(len(o) == NEW for o in outs) and st.segments > n // batch
    return np.stack(outs), np.asarray(st.rounds)


@pytest.mark.parametrize("name", list(SPECS))
def test_engine_rounds_joint_law(name):
    """vegas (chain of 2 sampled drafts), vegas-lookup (1 draft + 1 prompt-lookup token, a point-mass draft),
    longspec (tree (2, 2) drafted by a zero-block drafter) and longspec-lookup (+ a lookup chain of 1 beside the
    tree): 16,000 rows of one prompt through speculative.run. Power: asserted > 0.9 (about 0.999 here: df ~142)
    against any TV-0.05 distortion of the (t1, t2, t3) law (`power`). Checked to fail (p < 1e-6) with: the
    chain bonus from the residual (m1), drafts at T=1.0 or without top-k while q has them (m2, m3), lookup
    tokens with a uniform q instead of the point mass, the tree's leaf bonus from the residual, tree children
    drawn at T=1.0, the rejected lookup point mass kept in the tree's residual (m4)."""
    first4, rounds = engine_rows(name, N_ENGINE, 11)
    pvalue = _check(first4, rounds, N_ENGINE)
    assert (rounds > 1).mean() > 0.1, np.bincount(rounds)      # rejections in the first round too
    assert pvalue > PASS, pvalue


def test_served_requests_joint_law():
    """The same law for 16,000 requests served through `serving.serve` (vegas, 256 slots refilled 32 at a
    time while the others decode: each refill prefills new rows, draws their first token with a fresh key and
    inserts them). Same power as above. Checked to fail with m1 and with every refill drawing its first tokens
    with one fixed key (the t0 check)."""
    first4, rounds = served_rows(N_SERVE, 3, batch=SERVE_BATCH, refill=SERVE_REFILL, staged=False)
    assert (rounds > 1).mean() > 0.05, np.bincount(rounds)
    assert _check(first4, rounds, N_SERVE) > PASS


def test_engine_negative_control_drafts_at_another_temperature(monkeypatch):
    """Executed negative control at engine level (m2): engine.draft samples its drafts at T=1.0 while q (what
    verification divides by) stays at SAMP's T=0.9. The same check must reject it (measured p ~ 1e-21).
    Another row count than the positive tests' forces a fresh trace (jit caches by shape), and the mutant's
    programs are dropped afterwards."""
    from jspec.speculative import engine
    from test_sampling_power import mutant

    hot = SamplingConfig(temperature=1.0, top_k=SAMP.top_k, top_p=SAMP.top_p)
    monkeypatch.setattr(engine, "draft", mutant(engine.draft, "d = sampling.draw(q, sub)",
                                                "d = sampling.draw(sampling.process_logits(logits, HOT), sub)",
                                                HOT=hot))
    try:
        first4, rounds = engine_rows("vegas", N_ENGINE - 1, 11)
        assert _check(first4, rounds, N_ENGINE - 1) < 1e-6
    finally:
        jax.clear_caches()
