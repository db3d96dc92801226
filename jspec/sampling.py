"""Logits -> probabilities -> tokens, and the lossless verification rule of speculative decoding.

Three layers, kept apart so that draft and target share exactly one definition of "the distribution":

    process_logits(logits, cfg) -> probs    temperature, top-k, top-p: the distribution both models sample from
    draw(probs, key) / greedy(logits)       one token per row
    verify_chain / verify_greedy            accept a prefix of a drafted chain, plus one corrected/bonus token

Everything is pure, shape-static and free of host syncs, so it runs inside the speculative `lax.while_loop`.
`SamplingConfig` is a static argument: its fields choose code paths at trace time. Greedy (temperature 0) is
its own branch (argmax and exact match), never a tiny temperature.

Losslessness (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", Thm. 1 and
App. A.1; Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling", Thm. 1): if x ~ q is accepted
with probability min(1, p(x)/q(x)) and, on rejection, a token is drawn from norm(max(p - q, 0)), the emitted
token is distributed exactly as p:
    P(x) = q(x)·min(1, p(x)/q(x)) + (1 - Σ_y min(p(y), q(y))) · max(p(x) - q(x), 0) / Σ_y max(p(y) - q(y), 0)
         = min(p(x), q(x)) + max(p(x) - q(x), 0) = p(x),
because Σ_y max(p - q, 0) = 1 - Σ_y min(p, q). Applied position by position along a chain, where p_i and q_i
are conditioned on the accepted prefix, the emitted sequence follows the target's autoregressive distribution.
This requires the draft tokens to be *sampled* from q (not argmax'd) and p, q to be the *processed*
distributions (`process_logits` with the same cfg on both sides).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jspec.config import SamplingConfig

__all__ = ["process_logits", "greedy", "draw", "next_token", "verify_chain", "verify_greedy"]


@functools.partial(jax.jit, static_argnames=("cfg",))
def process_logits(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Turns logits into the distribution tokens are sampled from: temperature, then top-k, then top-p.

    Top-k keeps the k largest logits; among equal logits at the boundary the lower token ids win (the
    documented tie order of `lax.top_k`), so the result is deterministic. Top-p (nucleus) is then applied to
    the renormalised top-k distribution: keep the smallest set of most probable tokens whose mass is >= top_p
    (the top-1 token is always kept). Removed tokens get probability exactly 0.

    For a greedy cfg (temperature 0) this returns the one-hot of the argmax (first index among ties), so
    verification code can treat both branches uniformly; greedy callers should use `greedy` directly.

    Args:
      logits: [..., V] float (computed in float32).
      cfg: static SamplingConfig.
    Returns:
      probs: [..., V] float32, each row sums to 1.
    """
    logits = jnp.asarray(logits, jnp.float32)
    V = logits.shape[-1]
    if cfg.greedy:
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), V, dtype=jnp.float32)
    x = logits / jnp.float32(cfg.temperature)
    # Canonicalise -0.0 to +0.0: the sort's total order tells them apart, `==` below does not.
    x = jnp.where(x == 0, jnp.float32(0), x)
    k = min(cfg.top_k, V) if cfg.top_k else V
    if k == V and cfg.top_p >= 1.0:
        return jax.nn.softmax(x, axis=-1)

    # The kept set is always a prefix of the descending order (top-p is taken inside the top-k), so one
    # top_k call of width k (a full sort when only top-p is on) gives everything needed.
    vals, idx = lax.top_k(x, k)                                  # [..., k], equal values: lower index first
    if cfg.top_p < 1.0:
        p_sorted = jax.nn.softmax(vals, axis=-1)                 # the top-k distribution, renormalised
        cum = jnp.cumsum(p_sorted, axis=-1)
        mass_before = jnp.concatenate([jnp.zeros_like(cum[..., :1]), cum[..., :-1]], axis=-1)
        # Token j of the order is needed iff the tokens before it hold < top_p. Counting (rather than using
        # the mask itself) keeps the kept set a prefix even if a parallel cumsum is off by an ulp; >= 1
        # because mass_before[0] = 0 < top_p.
        n_keep = jnp.sum(mass_before < cfg.top_p, axis=-1, keepdims=True)
    else:
        n_keep = jnp.full(x.shape[:-1] + (1,), k, jnp.int32)
    # The last kept entry (value c, token id i_c) defines the set without a scatter: everything strictly above
    # c, plus the tokens equal to c up to id i_c (ties were ordered by id).
    c = jnp.take_along_axis(vals, n_keep - 1, axis=-1)           # [..., 1]
    i_c = jnp.take_along_axis(idx, n_keep - 1, axis=-1)          # [..., 1]
    ids = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    keep = (x > c) | ((x == c) & (ids <= i_c))
    return jax.nn.softmax(jnp.where(keep, x, -jnp.inf), axis=-1)


@jax.jit
def greedy(logits: jax.Array) -> jax.Array:
    """Argmax token (first index among ties). logits [..., V] -> int32 [...]."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


@jax.jit
def draw(probs: jax.Array, key: jax.Array) -> jax.Array:
    """Samples one token per row of `probs`.

    Args:
      probs: [..., V] non-negative weights (normalised or not; only ratios matter).
      key: PRNG key.
    Returns:
      int32 [...]. A token with probability <= 0 is never returned: its log-weight is -inf, and the Gumbel
      noise `categorical` adds is finite.
    """
    probs = jnp.asarray(probs, jnp.float32)
    logp = jnp.where(probs > 0, jnp.log(jnp.where(probs > 0, probs, 1.0)), -jnp.inf)
    return jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)


def next_token(logits: jax.Array, cfg: SamplingConfig, key: jax.Array) -> jax.Array:
    """One token per row of plain decoding: `greedy` for a greedy cfg (key unused), else `process_logits` then
    `draw`. logits [..., V] -> int32 [...]. Plain decoding and the engine's "ar" rounds both draw with it, one
    key per step, so their sampled streams are the same for the same seed."""
    if cfg.greedy:
        return greedy(logits)
    return draw(process_logits(logits, cfg), key)


@jax.jit
def verify_greedy(draft_tokens: jax.Array, target_logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Greedy verification: accept the longest prefix where the draft equals the target's argmax.

    Every accepted token is the target's argmax given the (accepted) prefix, and the next token is the argmax
    at the first mismatch, or the bonus position g when all g drafts match: the output is plain greedy
    decoding's whenever `target_logits` have the argmaxes a one-token step would compute. In exact arithmetic
    (float32 at HIGHEST matmul precision) they do, and in bf16 exact mode (AttnImpl(exact=True)); in default
    bf16 a (g+1)-token forward can round a near-tie the other way (docs/methods.md, "Lossless").

    Args:
      draft_tokens: int32 [B, g].
      target_logits: [B, g+1, V] target logits after the prefix and each draft token (or anything with the
        same argmax, e.g. the one-hot probs `process_logits` returns for a greedy cfg).
    Returns:
      n_accepted: int32 [B] in [0, g].
      next_token: int32 [B], the target's argmax at position n_accepted.
    """
    g = draft_tokens.shape[-1]
    target_tokens = greedy(target_logits)                                         # [B, g+1]
    match = (draft_tokens.astype(jnp.int32) == target_tokens[:, :g]).astype(jnp.int32)
    n_accepted = jnp.sum(jnp.cumprod(match, axis=-1), axis=-1).astype(jnp.int32)  # first mismatch stops
    next_token = jnp.take_along_axis(target_tokens, n_accepted[:, None], axis=-1)[:, 0]
    return n_accepted, next_token


@functools.partial(jax.jit, static_argnames=("cfg",))
def verify_chain(draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array, key: jax.Array,
                 cfg: SamplingConfig) -> tuple[jax.Array, jax.Array]:
    """Lossless verification of a chain of g drafted tokens per sequence (speculative sampling).

    Sequence b emits draft_tokens[b, :n_accepted[b]] followed by next_token[b] (n_accepted + 1 tokens), and
    that sequence is distributed exactly as sampling the target one token at a time (module docstring). Each
    sequence of the batch accepts its own number of tokens; nothing leaves the device.

    Args:
      draft_tokens: int32 [B, g], draft_tokens[:, i] sampled from draft_probs[:, i].
      draft_probs: [B, g, V] processed draft distributions q_i (`process_logits`, same cfg as the target).
      target_probs: [B, g+1, V] processed target distributions p_i, p_i conditioned on the prefix plus
        draft_tokens[:, :i]; p_g is the bonus position.
      key: PRNG key.
      cfg: static SamplingConfig. For a greedy cfg this is `verify_greedy(draft_tokens, target_probs)`
        (draft_probs and key are unused).
    Returns:
      n_accepted: int32 [B] in [0, g].
      next_token: int32 [B]: drawn from norm(max(p_n - q_n, 0)) after a rejection at n < g (from p_n if that
        residual is numerically all zero), or from p_g when all g drafts were accepted.
    """
    if cfg.greedy:
        return verify_greedy(draft_tokens, target_probs)
    B, g = draft_tokens.shape
    target_probs = jnp.asarray(target_probs, jnp.float32)
    key_accept, key_next = jax.random.split(key)
    if g == 0:
        return jnp.zeros((B,), jnp.int32), draw(target_probs[:, 0], key_next)
    draft_probs = jnp.asarray(draft_probs, jnp.float32)
    draft_tokens = draft_tokens.astype(jnp.int32)

    q_x = jnp.take_along_axis(draft_probs, draft_tokens[..., None], axis=-1)[..., 0]          # [B, g]
    p_x = jnp.take_along_axis(target_probs[:, :g], draft_tokens[..., None], axis=-1)[..., 0]  # [B, g]
    # Accept x_i with probability min(1, p_i(x)/q_i(x)) (Leviathan et al. Alg. 1): u < p/q written without the
    # division, so q(x) = 0 cannot produce inf/NaN and p(x) = 0 is never accepted (u·q < 0 is false).
    u = jax.random.uniform(key_accept, (B, g), jnp.float32)
    accept = (u * q_x < p_x).astype(jnp.int32)
    # Sequential semantics: the first rejection ends the chain, later accepts do not count.
    n_accepted = jnp.sum(jnp.cumprod(accept, axis=-1), axis=-1).astype(jnp.int32)            # [B]

    # One gather per row at position n instead of a loop: p_n always; q_n only when n < g. At n = g (all
    # accepted) q is taken as 0, so the "residual" below is p_g itself: the bonus token is a plain sample.
    p_n = jnp.take_along_axis(target_probs, n_accepted[:, None, None], axis=1)[:, 0]            # [B, V]
    q_n = jnp.take_along_axis(draft_probs, jnp.minimum(n_accepted, g - 1)[:, None, None], axis=1)[:, 0]
    q_n = jnp.where((n_accepted < g)[:, None], q_n, 0.0)
    # After a rejection the emitted token must come from norm(max(p - q, 0)): this adds back exactly the mass
    # min(p, q) under-represents (Chen et al. Thm. 1). Its support lies inside supp(p), so a token the target
    # forbids can never be emitted. If rounding makes it all zero (p ≈ q), fall back to p.
    residual = jnp.maximum(p_n - q_n, 0.0)
    mass = jnp.sum(residual, axis=-1, keepdims=True)
    residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_n)
    next_token = draw(residual, key_next)
    return n_accepted, next_token
