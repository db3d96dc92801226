"""The production XLA implementations of the attention ops: what every op's dispatcher falls back to where
its kernel cannot run (a CPU backend, an unsupported shape) and what `implementation="xla"` selects.

Same arguments and return conventions as the ops (`flash_scores`, `sparse_attention`, `tree_attention`,
`sparse_tree_attention`); the Pallas-only ones (block_sizes, interpret, exact) are accepted and ignored.
Unlike the float32 references (reference.py, ground truth for the tests), they compute as a model runs:
inputs in their own dtype (bf16), dots accumulating in float32, the softmax in float32, the output rounded
to q.dtype; and their memory is bounded at any prompt length: a long causal prefill is processed in chunks
of query rows (`_XLA_LOGITS_BUDGET`).

Outputs a caller does not use (e.g. lse) are left to jit's dead-code elimination.

`sparse_scores` is the XLA-only helper behind the scores of a sparse verification (the kernels emit none).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# Largest f32 logits tensor [B, K, G, Tc, S] the XLA path materialises at once; longer queries (prefill)
# are processed in chunks of Tc rows so memory stays bounded at any prompt length.
_XLA_LOGITS_BUDGET = 1 << 30
SCORE_MODES = ("weights", "logits")


def _one_layer(k, v, layer):
    return (k, v) if layer is None else (k[layer], v[layer])


def _scale(sm_scale, H):
    return H ** -0.5 if sm_scale is None else sm_scale


def _check_mode(score_mode):
    if score_mode not in SCORE_MODES:
        raise ValueError(f"{score_mode=} must be one of {SCORE_MODES}")


def flash_scores(q, k, v, kv_len, *, score_rows=(), score_mode="weights", sm_scale=None, block_sizes=None,
                 interpret=False, layer=None, exact=False):
    """XLA `flash_scores`: causal attention of T new tokens over the cache plus the score rows' per-key scores.

    Returns out [B,T,N,H] q.dtype, lse f32[B,N,T], scores f32[B,S] (None when score_rows is empty)."""
    del block_sizes, interpret, exact
    _check_mode(score_mode)
    k, v = _one_layer(k, v, layer)
    return _full(q, k, v, kv_len, None, tuple(score_rows), score_mode, _scale(sm_scale, q.shape[3]))


def tree_attention(q, k, v, prefix_len, tree_mask, *, sm_scale=None, block_sizes=None, interpret=False,
                   layer=None, exact=False):
    """XLA `tree_attention`: n tree tokens over the prefix < prefix_len plus their tree slots (tree_mask).

    Returns out [B,n,N,H] q.dtype, lse f32[B,N,n]."""
    out, lse, _ = tree_attention_scores(q, k, v, prefix_len, tree_mask, sm_scale=sm_scale, layer=layer)
    return out, lse


def tree_attention_scores(q, k, v, prefix_len, tree_mask, *, score_rows=(), score_mode="weights", sm_scale=None,
                          layer=None):
    """`tree_attention` plus `flash_scores`' per-key scores of the rows `score_rows` (XLA only: the tree kernel
    emits no scores). Returns out, lse, scores f32[B,S] (None when score_rows is empty)."""
    _check_mode(score_mode)
    k, v = _one_layer(k, v, layer)
    return _full(q, k, v, None, tree_mask, tuple(score_rows), score_mode, _scale(sm_scale, q.shape[3]),
                 first=prefix_len)


def _full(q, k, v, kv_len, tree_mask, score_rows, score_mode, scale, first=None):
    """Chain (tree_mask None: row t sees j <= kv_len - T + t) or tree attention over one layer's k, v [B,S,K,H]."""
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    chunk = max(1, min(T, _XLA_LOGITS_BUDGET // (4 * B * N * S)))
    if score_rows or tree_mask is not None or chunk >= T:
        return _attend_chunk(q, k, v, kv_len, jnp.int32(0), T, tree_mask, score_rows, score_mode, scale, first)
    # Prefill: bounded memory by mapping over query chunks (padding T up to a multiple of the chunk).
    n_chunks = -(-T // chunk)
    qp = jnp.pad(q, ((0, 0), (0, n_chunks * chunk - T), (0, 0), (0, 0)))
    qc = qp.reshape(B, n_chunks, chunk, N, H).swapaxes(0, 1)

    def one(args):
        qi, start = args
        return _attend_chunk(qi, k, v, kv_len, start, T, None, (), score_mode, scale)[:2]

    outs, lses = jax.lax.map(one, (qc, jnp.arange(n_chunks, dtype=jnp.int32) * chunk))
    lse = lses.transpose(1, 2, 0, 3).reshape(B, N, n_chunks * chunk)[:, :, :T]
    return outs.swapaxes(0, 1).reshape(B, n_chunks * chunk, N, H)[:, :T], lse, None


def _attend_chunk(q, k, v, kv_len, start, T_total, tree_mask, score_rows, score_mode, scale, first=None):
    """Rows start .. start+Tc-1 of a T_total-query block; einsum letters as in docs/kernels.md (G = N / K).

    The block's row 0 sits at slot `first` (default kv_len - T_total). Returns out [B,Tc,N,H] q.dtype,
    lse f32[B,N,Tc], scores f32[B,S] or None."""
    B, Tc, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    qg = q.reshape(B, Tc, K, G, H)
    s = jnp.einsum("BTKGH,BSKH->BKGTS", qg, k, preferred_element_type=jnp.float32) * scale
    t = start + jnp.arange(Tc, dtype=jnp.int32)                          # row index within the block
    j = jnp.arange(S, dtype=jnp.int32)
    first = (kv_len - T_total if first is None else first)[:, None, None]   # slot of query row 0
    if tree_mask is None:
        visible = j[None, None, :] <= first + t[None, :, None]           # [B, Tc, S]
    else:
        rel = j[None, None, :] - first                                   # tree slot index of key j
        in_tree = (rel >= 0) & (rel < T_total)
        tm = _tree_lookup(tree_mask, rel, Tc)
        visible = (rel < 0) | (in_tree & tm)
    s = jnp.where(visible[:, None, None], s, -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1, keepdims=True)                    # [B, K, G, Tc, 1]
    p = jnp.exp(s - lse)
    out = jnp.einsum("BKGTS,BSKH->BTKGH", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    out = out.reshape(B, Tc, N, H).astype(q.dtype)
    scores = None
    if score_rows:
        rows = jnp.asarray(score_rows, jnp.int32)
        src = p if score_mode == "weights" else jnp.where(visible[:, None, None], s, 0.0)
        scores = jnp.sum(src[:, :, :, rows, :], axis=(1, 2, 3))          # [B, S]
    return out, lse.reshape(B, N, Tc), scores


def _tree_lookup(tree_mask, rel, Tc):
    """tree_mask[b, t, rel[b, 0, j]] for every row t and key j (False outside the tree)."""
    T = tree_mask.shape[-1]
    idx = jnp.clip(rel, 0, T - 1)                                         # [B, 1, S]
    idx = jnp.broadcast_to(idx, (idx.shape[0], Tc, idx.shape[-1]))
    return jnp.take_along_axis(tree_mask, idx, axis=2)


def sparse_attention(q, k, v, idx, n_valid, kv_len, *, tail=True, sm_scale=None, block_sizes=None,
                     interpret=False, layer=None):
    """XLA `sparse_attention`: attention over the gathered entries idx[b, :n_valid[b]] plus (tail) the T newest
    tokens, causally. idx may be every layer's int32[L,B,M] (n_valid int32[L,B]) with the stacked cache.

    Returns out [B,T,N,H] q.dtype, lse f32[B,N,T]."""
    del block_sizes, interpret
    if idx.ndim == 3:
        idx, n_valid = idx[layer], n_valid[layer]
    k, v = _one_layer(k, v, layer)
    return _sparse(q, k, v, kv_len, idx, n_valid, None, _scale(sm_scale, q.shape[3]), tail=tail)


def sparse_tree_attention(q, k, v, idx, n_valid, prefix_len, tree_mask, *, sm_scale=None, block_sizes=None,
                          interpret=False, layer=None):
    """XLA `sparse_tree_attention`: n tree tokens over the gathered entries idx[b, :n_valid[b]] plus their tree
    slots at prefix_len + i (tree_mask). Returns out [B,n,N,H] q.dtype, lse f32[B,N,n]."""
    del block_sizes, interpret
    if idx.ndim == 3:
        idx, n_valid = idx[layer], n_valid[layer]
    k, v = _one_layer(k, v, layer)
    return _sparse(q, k, v, None, idx, n_valid, tree_mask, _scale(sm_scale, q.shape[3]), first=prefix_len)


def _sparse(q, k, v, kv_len, idx, n_valid, tree_mask, scale, first=None, tail=True):
    B, T, N, H = q.shape
    s, _, vg = _sparse_logits(q, k, kv_len, idx, n_valid, tree_mask, scale, v, first=first, tail=tail)
    p = jax.nn.softmax(s, axis=-1)
    if not tail:   # a row may see nothing (n_valid = 0): out 0, lse -inf, as the kernel gives
        p = jnp.where(jnp.isfinite(s).any(axis=-1, keepdims=True), p, 0.0)
    out = jnp.einsum("BKGTS,BSKH->BTKGH", p.astype(vg.dtype), vg, preferred_element_type=jnp.float32)
    lse = jax.nn.logsumexp(s, axis=-1)                                   # [B, K, G, T]
    return out.reshape(B, T, N, H).astype(q.dtype), lse.reshape(B, N, T)


def _sparse_logits(q, k, kv_len, idx, n_valid, tree_mask, scale, v=None, first=None, tail=True):
    """Scaled logits [B, K, G, T, M + T] over the gathered entries (selection, then the T new tokens, whose
    first sits at slot `first`, default kv_len - T), -inf where not visible, the gathered positions [B, M + T]
    and (given v) the gathered values. tail=False: the selection alone ([.., M] and [B, M])."""
    B, T, N, H = q.shape
    K = k.shape[2]
    G, M = N // K, idx.shape[1]
    if tail:
        first = kv_len - T if first is None else first
        new = first[:, None] + jnp.arange(T, dtype=jnp.int32)[None]       # [B, T] slots of the new tokens
        pos = jnp.concatenate([idx, new], axis=1)                        # [B, M + T]
    else:
        pos = idx
    kg = jnp.take_along_axis(k, pos[:, :, None, None], axis=1)
    vg = None if v is None else jnp.take_along_axis(v, pos[:, :, None, None], axis=1)
    qg = q.reshape(B, T, K, G, H)
    s = jnp.einsum("BTKGH,BSKH->BKGTS", qg, kg, preferred_element_type=jnp.float32) * scale
    W = pos.shape[1]
    c = jnp.arange(W, dtype=jnp.int32)
    t = jnp.arange(T, dtype=jnp.int32)
    sel_ok = (c[None, None, :] < n_valid[:, None, None]) & (c[None, None, :] < M)
    if not tail:
        ok = jnp.broadcast_to(sel_ok, (B, T, W))
    elif tree_mask is None:
        ok = sel_ok | ((c[None, None, :] >= M) & (c[None, None, :] - M <= t[None, :, None]))
    else:
        ok = sel_ok | jnp.concatenate([jnp.zeros((B, T, M), bool), tree_mask], axis=2)
    return jnp.where(ok[:, None, None], s, -jnp.inf), pos, vg


def sparse_scores(q, k, idx, n_valid, kv_len, *, score_rows, score_mode="weights", tree_mask=None, layer=None,
                  sm_scale=None):
    """`flash_scores`' per-position scores for a sparse attention (Vegas' selection under Dustin's sparse
    verification): the rows' attention over the entries `sparse_attention` (or, with tree_mask,
    `sparse_tree_attention` at prefix_len = kv_len - T) reads, summed over heads and rows, 0 at every slot not read.

    From a second gather of the selected keys: softmax weights over the selection and the visible new tokens
    ("weights") or the raw scale * q.k ("logits").
    Args: as `sparse_attention`'s (k only, no v); score_rows: static tuple of query rows.
    Returns:
      f32[B, S].
    """
    _check_mode(score_mode)
    if idx.ndim == 3:
        idx, n_valid = idx[layer], n_valid[layer]
    k = k if layer is None else k[layer]
    s, pos, _ = _sparse_logits(q, k, kv_len, idx, n_valid, tree_mask, _scale(sm_scale, q.shape[3]))
    s = s[:, :, :, jnp.asarray(score_rows, jnp.int32)]   # every row: masks are per block row
    if score_mode == "weights":
        src = jnp.exp(s - jax.nn.logsumexp(s, axis=-1, keepdims=True))
    else:
        src = jnp.where(jnp.isfinite(s), s, 0.0)
    per_pos = jnp.where(jnp.arange(pos.shape[1]) < idx.shape[1], src.sum(axis=(1, 2, 3)), 0.0)   # [B, M + T]
    B, S = q.shape[0], k.shape[1]
    return jnp.zeros((B, S), jnp.float32).at[jnp.arange(B)[:, None], pos].add(per_pos)
