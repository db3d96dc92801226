"""Attention weights of a few query heads over the whole cache, summed over heads and rows: Dustin's A_T probe
(`jspec.dustin.head_weights` is the XLA version and the reference of this kernel; docs/kernels.md).

    w[b, s] = sum over the chosen q-heads n and rows r of softmax_s(q[b, r, n] . k[b, s, n // G] / sqrt(H))
              over the valid positions s < lengths[b]; 0 at s >= lengths[b]

The XLA version slices each chosen head's KV group out of the cache ([B, S, H] with a stride of K*H between
positions) before its GEMM. Here one pass reads only those groups' keys, in place: grid (B, chosen groups,
splits of the keys); a program holds its group's query rows (the chosen heads of that group x the R rows,
packed and padded to a 16-row tile), writes the raw logits of its key blocks and keeps each row's running max
and sum of exponentials. A small XLA epilogue merges the splits into each row's log-sum-exp and sums
exp(logit - lse) over the rows that are real. Writes: the logits of the rows that can be real (the most any group
has, rounded up to a power of two; the dot's tile is 16 rows), [B, groups, Ro, S] float32: 1/32 of the keys'
bytes at head_dim 128, one head per group and 2 rows (the whole 16-row tile was 1/4).

Supported: head_dim 64 or 128, bf16 / f16 / f32 (q is cast to the cache's dtype; logits accumulate in f32),
S a multiple of 16. Elsewhere NotImplementedError (the caller falls back to the XLA version).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from . import _common as C


def kv_groups(heads, N: int, K: int) -> tuple:
    """((kv group, (q heads reading it, in the given order)), ...) by ascending group, for static q-head indices
    (GQA: head n reads KV head n // (N // K))."""
    G = N // K
    out = {}
    for n in heads:
        out.setdefault(n // G, []).append(n)
    return tuple((g, tuple(ns)) for g, ns in sorted(out.items()))


def _probe_kernel(layer_ref, kv_len_ref, group_ref, q_ref, k_ref, s_ref, m_ref, l_ref, *, block_k, per_split,
                  sm_scale):
    """layer_ref, kv_len_ref, group_ref: [] int32 (the KV group this program reads); q_ref [Rp, H];
    k_ref [L, S, K, H] (one sequence, every group, read at layer_ref and group_ref in place);
    outputs s_ref [Ro, S] the logits of the first Ro (<= Rp) query rows, those that can be real (this split's
    key blocks only), m_ref / l_ref [Rp] this split's running max and sum of exp(logit - max)."""
    rows = q_ref.shape[0]
    out_rows = s_ref.shape[0]
    rid = jnp.arange(rows)[:, None]
    S = k_ref.shape[1]
    layer, kv_len, g = layer_ref[()], kv_len_ref[()], group_ref[()]
    split = pl.program_id(2)
    lo = split * per_split
    hi = jnp.minimum(lo + per_split, pl.cdiv(jnp.minimum(kv_len, S), block_k))
    q = q_ref[...]

    def step(i, carry):
        m_prev, l_prev = carry
        start = pl.multiple_of(i * block_k, block_k)
        k = k_ref[layer, pl.ds(start, block_k), g, :]
        s = C.dot_nt(q, k) * sm_scale
        s = jnp.where((start + jnp.arange(block_k) < kv_len)[None, :], s, -jnp.inf)
        if out_rows == rows:
            s_ref[:, pl.ds(start, block_k)] = s
        else:   # only the rows that can be real: the dot's 16-row tile is mostly padding (one head, 2 rows)
            for j in range(out_rows):
                s_ref[j, pl.ds(start, block_k)] = jnp.max(jnp.where(rid == j, s, -jnp.inf), axis=0)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
        l_new = l_prev * jnp.exp(m_prev - m_new) + jnp.sum(jnp.exp(s - m_new[:, None]), axis=1)
        return m_new, l_new

    m, l = jax.lax.fori_loop(lo, jnp.maximum(lo, hi), step,
                             (jnp.full((rows,), C.M_INIT, jnp.float32), jnp.zeros((rows,), jnp.float32)))
    m_ref[...] = m
    l_ref[...] = l


@functools.partial(jax.jit, static_argnames=("heads", "block_k", "num_splits", "interpret"))
def head_weights_kernel(q, k, lengths, heads, *, layer=None, block_k=128, num_splits=None, interpret=False):
    """Pallas version of `jspec.dustin.head_weights`: q [B, R, N, H] rows, k [B, S, K, H] one layer's keys (or
    the stacked [L, B, S, K, H] cache with `layer`), lengths int32[B], heads a static tuple of q-head indices.
    Returns f32[B, S] (0 at positions >= lengths; all 0 where lengths == 0)."""
    C.check_platform(interpret)
    B, R, N, H = q.shape
    S, K = C.layer_shape(k, layer)[1], C.layer_shape(k, layer)[2]
    if H not in C.SUPPORTED_HEAD_DIMS or k.dtype not in C.SUPPORTED_DTYPES or N % K or S % 16:
        raise NotImplementedError(f"head_weights kernel: {H=}, {k.dtype=}, {N=} % {K=}, {S=} % 16")
    groups = kv_groups(heads, N, K)
    if not groups:
        return jnp.zeros((B, S), jnp.float32)
    block_k = min(block_k, C.prev_pow2(S))
    while S % block_k:
        block_k //= 2
    rows = max(16, C.next_pow2(R * max(len(ns) for _, ns in groups)))
    out_rows = C.next_pow2(R * max(len(ns) for _, ns in groups))   # logits written for these rows only
    # [B, groups, rows, H]: group gi's rows are (row r, head j) at r * n_gi + j, then zero padding
    qp = jnp.stack([jnp.pad(q[:, :, jnp.asarray(ns)].reshape(B, R * len(ns), H),
                            ((0, 0), (0, rows - R * len(ns)), (0, 0))) for _, ns in groups], axis=1).astype(k.dtype)
    n_real = np.array([R * len(ns) for _, ns in groups], np.int32)
    nG = len(groups)
    splits, per_split = C.split_plan(S // block_k, B * nG, num_splits, min_blocks=4)
    k_st = k[None] if layer is None else k
    layer_op = jnp.reshape(jnp.asarray(0 if layer is None else layer, jnp.int32), (1,))
    L = k_st.shape[0]
    kernel = functools.partial(_probe_kernel, block_k=block_k, per_split=per_split, sm_scale=H ** -0.5)
    s, m, l = pl.pallas_call(
        kernel,
        grid=(B, nG, splits),
        in_specs=[
            C.LAYER_SPEC,
            pl.BlockSpec((None,), lambda b, g, p: (b,)),
            pl.BlockSpec((None,), lambda b, g, p: (g,)),
            pl.BlockSpec((None, None, rows, H), lambda b, g, p: (b, g, 0, 0)),
            pl.BlockSpec((L, None, S, K, H), lambda b, g, p: (0, b, 0, 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, out_rows, S), lambda b, g, p: (b, g, 0, 0)),
            pl.BlockSpec((None, None, None, rows), lambda b, g, p: (b, g, p, 0)),
            pl.BlockSpec((None, None, None, rows), lambda b, g, p: (b, g, p, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((B, nG, out_rows, S), jnp.float32),
            jax.ShapeDtypeStruct((B, nG, splits, rows), jnp.float32),
            jax.ShapeDtypeStruct((B, nG, splits, rows), jnp.float32),
        ],
        compiler_params=C.BlockSizes(block_k=block_k).compiler_params(),
        interpret=interpret,
        name="head_weights",
    )(layer_op, jnp.asarray(lengths, jnp.int32), jnp.asarray([g for g, _ in groups], jnp.int32), qp, k_st)
    # Each row's log-sum-exp over the splits; a split that saw no key has l = 0 (log -> -inf, weight 0).
    mx = jnp.max(m, axis=2, keepdims=True)
    lse = mx[:, :, 0] + jnp.log(jnp.sum(l * jnp.exp(m - mx), axis=2))                         # [B, nG, rows]
    lse = lse[:, :, :out_rows]
    real = jnp.arange(out_rows)[None, :] < jnp.asarray(n_real)[:, None]                          # [nG, Ro]
    valid = jnp.arange(S)[None, :] < jnp.asarray(lengths, jnp.int32)[:, None]                    # [B, S]
    keep = real[None, :, :, None] & valid[:, None, None, :] & jnp.isfinite(lse)[..., None]
    return jnp.where(keep, jnp.exp(s - lse[..., None]), 0.0).sum(axis=(1, 2))
