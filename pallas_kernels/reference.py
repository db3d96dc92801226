"""Pure-jnp float32 references (HIGHEST precision) with the same signatures as the kernels.

They are the ground truth in tests and the "XLA reference" baselines in the benchmarks; no dispatcher
falls back to them (the fallback, also on CPU, is the production XLA path of xla.py). Every one reduces to `masked_attention_reference` with an explicit
per-sequence mask [B,T,S] shared by all heads, so they materialise [B,N,T,S] logits: fine for tests and
moderate sizes, not meant for 128K prefill.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST


def _scale(sm_scale, head_dim):
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale


def _one_layer(k, v, layer):
    return (k, v) if layer is None else (k[layer], v[layer])


def _attend(q, k, v, mask, sm_scale):
    """q [B,T,N,H], k/v [B,S,K,H], mask bool [B,T,S] -> (out f32 [B,T,N,H], lse [B,N,T], logits, mask5).

    logits [B,K,G,T,S] are scaled (natural-log units); mask5 broadcasts the mask to them.
    """
    B, T, N, H = q.shape
    K = k.shape[2]
    G = N // K
    qf = q.astype(jnp.float32).reshape(B, T, K, G, H)
    logits = jnp.einsum("btkgh,bskh->bkgts", qf, k.astype(jnp.float32), precision=_HI)
    logits = logits * _scale(sm_scale, H)
    mask5 = mask[:, None, None]
    lse = jax.nn.logsumexp(jnp.where(mask5, logits, -jnp.inf), axis=-1)  # [B,K,G,T]
    p = jnp.where(mask5, jnp.exp(logits - lse[..., None]), 0.0)
    # Cache slots nobody may read can hold junk (even NaN): 0 * NaN would leak through the einsum.
    read = mask.any(axis=1)[:, :, None, None]
    vf = jnp.where(read, v.astype(jnp.float32), 0.0)
    out = jnp.einsum("bkgts,bskh->btkgh", p, vf, precision=_HI).reshape(B, T, N, H)
    return out, lse.reshape(B, N, T), logits, mask5


@functools.partial(jax.jit, static_argnames=("sm_scale",))
def masked_attention_reference(q, k, v, mask, *, sm_scale=None):
    """Dense attention with an explicit mask shared by all heads.

    Args:
      q: [B,T,N,H]; k, v: [B,S,K,H] (GQA: query head n reads KV head n // (N/K)).
      mask: bool [B,T,S], True where query row t may read cache position s.
    Returns:
      out [B,T,N,H] in q.dtype, lse [B,N,T] float32 (natural log).
    """
    out, lse, _, _ = _attend(q, k, v, mask, sm_scale)
    return out.astype(q.dtype), lse


def causal_mask(kv_len, T: int, S: int):
    """Bottom-right aligned causal mask [B,T,S]: row t sees j <= kv_len - T + t (and j < kv_len)."""
    j = jnp.arange(S)[None, None, :]
    t = jnp.arange(T)[None, :, None]
    return j <= (kv_len[:, None, None] - T + t)


@functools.partial(jax.jit, static_argnames=("score_rows", "score_mode", "sm_scale", "block_sizes", "interpret"))
def flash_scores_reference(q, k, v, kv_len, *, score_rows=(), score_mode="weights", sm_scale=None,
                           block_sizes=None, interpret=False, layer=None, exact=False):
    """Reference for `flash_scores` (block_sizes, interpret and exact are accepted and ignored)."""
    del block_sizes, interpret, exact
    k, v = _one_layer(k, v, layer)
    B, T, _, _ = q.shape
    S = k.shape[1]
    mask = causal_mask(kv_len, T, S)
    out, lse, logits, mask5 = _attend(q, k, v, mask, sm_scale)
    scores = None
    if score_rows:
        rows = [r % T for r in score_rows]
        if score_mode == "weights":
            lse5 = lse.reshape(logits.shape[:4])[..., None]
            vals = jnp.where(mask5, jnp.exp(logits - lse5), 0.0)
        elif score_mode == "logits":
            vals = jnp.where(mask5, logits, 0.0)
        else:
            raise ValueError(f"{score_mode=} must be 'weights' or 'logits'")
        scores = sum(vals[:, :, :, r].sum(axis=(1, 2)) for r in rows)
    return out.astype(q.dtype), lse, scores


def sparse_mask_and_positions(idx, n_valid, kv_len, T: int, tail: bool):
    """Positions [B, M(+T)] to gather and the visibility mask [B,T,M(+T)] of `sparse_attention`."""
    B, M = idx.shape
    e = jnp.arange(M)[None, :]
    pos = jnp.where(e < n_valid[:, None], idx, 0)
    vis = jnp.broadcast_to((e < n_valid[:, None])[:, None, :], (B, T, M))
    if tail:
        u = jnp.arange(T)
        pos = jnp.concatenate([pos, kv_len[:, None] - T + u[None, :]], axis=1)
        tail_vis = jnp.broadcast_to(u[None, None, :] <= u[None, :, None], (B, T, T))
        vis = jnp.concatenate([vis, tail_vis], axis=2)
    return pos, vis


@functools.partial(jax.jit, static_argnames=("tail", "sm_scale", "block_sizes", "interpret"))
def sparse_attention_reference(q, k, v, idx, n_valid, kv_len, *, tail=True, sm_scale=None,
                               block_sizes=None, interpret=False, layer=None):
    """Reference for `sparse_attention`: gathers idx[b, :n_valid[b]] (+ the causal tail) densely."""
    del block_sizes, interpret
    if idx.ndim == 3:   # every layer's selections: this layer's
        idx, n_valid = idx[layer], n_valid[layer]
    k, v = _one_layer(k, v, layer)
    T = q.shape[1]
    pos, vis = sparse_mask_and_positions(idx, n_valid, kv_len, T, tail)
    take = lambda x: jnp.take_along_axis(x, pos[:, :, None, None], axis=1)
    out, lse, _, _ = _attend(q, take(k), take(v), vis, sm_scale)
    return out.astype(q.dtype), lse


@functools.partial(jax.jit, static_argnames=("sm_scale", "block_sizes", "interpret"))
def sparse_tree_attention_reference(q, k, v, idx, n_valid, prefix_len, tree_mask, *, sm_scale=None,
                                    block_sizes=None, interpret=False, layer=None):
    """Reference for `sparse_tree_attention`: gathers idx[b, :n_valid[b]] and the n tree slots, tree-masked."""
    del block_sizes, interpret
    if idx.ndim == 3:
        idx, n_valid = idx[layer], n_valid[layer]
    k, v = _one_layer(k, v, layer)
    B, n = tree_mask.shape[:2]
    pos, vis = sparse_mask_and_positions(idx, n_valid, prefix_len + n, n, tail=True)
    vis = vis.at[:, :, idx.shape[1]:].set(tree_mask)   # the tail is the tree: its mask, not a causal one
    take = lambda x: jnp.take_along_axis(x, pos[:, :, None, None], axis=1)
    out, lse, _, _ = _attend(q, take(k), take(v), vis, sm_scale)
    return out.astype(q.dtype), lse


def tree_full_mask(prefix_len, tree_mask, S: int):
    """[B,n,S]: every prefix position < prefix_len, plus tree slot j (at prefix_len + j) iff tree_mask."""
    n = tree_mask.shape[1]
    j = jnp.arange(S)[None, None, :]
    rel = j - prefix_len[:, None, None]
    in_tree = (rel >= 0) & (rel < n)
    slot = jnp.take_along_axis(tree_mask, jnp.broadcast_to(jnp.clip(rel, 0, n - 1), (tree_mask.shape[0], n, S)),
                               axis=2)
    return (rel < 0) | (in_tree & slot)


@functools.partial(jax.jit, static_argnames=("sm_scale", "block_sizes", "interpret"))
def tree_attention_reference(q, k, v, prefix_len, tree_mask, *, sm_scale=None, block_sizes=None,
                             interpret=False, layer=None, exact=False):
    """Reference for `tree_attention`: dense attention over the whole cache with the full mask (block_sizes,
    interpret and exact are accepted and ignored)."""
    del block_sizes, interpret, exact
    k, v = _one_layer(k, v, layer)
    mask = tree_full_mask(prefix_len, tree_mask, k.shape[1])
    return masked_attention_reference(q, k, v, mask, sm_scale=sm_scale)
