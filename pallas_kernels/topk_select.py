"""Per-row top-k positions by threshold search instead of a sort (Vegas' selection step).

For each row r of scores [R, S]: entries j < limit[r] compete; the n = min(k[r], limit[r], M) entries with
the largest scores are selected (ties: lower position first, as lax.top_k) and written to idx[r, :n] in
ascending position order; idx[r, n:] = 0. The set is exactly lax.top_k's; only the order differs, which
no consumer of a KV selection needs (attention is permutation invariant; ascending positions even make
the gathers more local).

Why: XLA lowers lax.top_k(k=512) over [30 x 64, 8064] to a sort, which made selection the dearest piece of a
Vegas round after the draft steps and the verification (docs/performance.md). One program per row here:

    1. the n-th largest key t by bisection on the order-preserving int32 image of the f32 scores: the sign
       first, then bits 30..0, each step one count of keys >= candidate over the row (32 passes over a
       row of <= 33 KB, which stays in L1/L2);
    2. one pass that keeps keys > t and the first n - count(> t) keys == t, and scatters their positions
       to consecutive slots (a running offset plus an in-block prefix sum).

Scores must not be NaN. -0.0 ranks just below +0.0 (lax.top_k treats them as equal); Vegas' softmax
weights are never negative and its logits mode does not produce signed zeros in practice.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from . import _common as C

INT_MIN = -(2 ** 31)
INT_MAX = 2 ** 31 - 1


def order_key(x):
    """f32 -> int32 whose signed order is x's order (negative floats: flip the magnitude bits)."""
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    return jnp.where(bits < 0, bits ^ jnp.int32(INT_MAX), bits)


def _select_kernel(lim_ref, n_ref, x_ref, idx_ref, *, block, M):
    """lim_ref, n_ref: [] int32 (entries j < lim compete; n to keep, already <= lim and <= M);
    x_ref: [S] f32 scores of this row; idx_ref: [M] int32 output."""
    lim, n = lim_ref[()], n_ref[()]
    n_blocks = pl.cdiv(lim, block)
    lane = jnp.arange(block)

    def keys(c):
        pos = c * block + lane
        ok = pos < lim
        x = plgpu.load(x_ref.at[pl.ds(c * block, block)], mask=ok, other=0.0)
        return pos, ok, order_key(x)

    def count(t, strict):
        def body(c, acc):
            _, ok, key = keys(c)
            hit = (key > t) if strict else (key >= t)
            return acc + jnp.sum((ok & hit).astype(jnp.int32))
        return lax.fori_loop(0, n_blocks, body, jnp.int32(0))

    # 1. t = max{t : count(key >= t) >= n}: sign half first, then bits 30..0 from the top.
    base = jnp.where(count(jnp.int32(0), False) >= n, jnp.int32(0), jnp.int32(INT_MIN))

    def bit(i, base):
        cand = base | jnp.left_shift(jnp.int32(1), 30 - i)
        return jnp.where(count(cand, False) >= n, cand, base)

    t = lax.fori_loop(0, 31, bit, base)
    need = n - count(t, True)            # ties at t to take, lowest positions first

    # Unselected slots read 0.
    for c in range(C.cdiv(M, block)):
        slot = c * block + lane
        plgpu.store(idx_ref.at[pl.ds(c * block, block)], jnp.zeros((block,), jnp.int32), mask=slot < M)

    # 2. Compact the selected positions, in order, into idx[:n].
    def compact(c, carry):
        off, ties = carry
        pos, ok, key = keys(c)
        eq = (ok & (key == t)).astype(jnp.int32)
        take = (ok & (key > t)) | ((eq == 1) & (ties + jnp.cumsum(eq) <= need))
        takei = take.astype(jnp.int32)
        dest = jnp.where(take, off + jnp.cumsum(takei) - 1, M)   # masked lanes: out of range, never stored
        plgpu.store(idx_ref.at[dest], pos.astype(jnp.int32), mask=take)
        return off + jnp.sum(takei), ties + jnp.sum(eq)

    lax.fori_loop(0, n_blocks, compact, (jnp.int32(0), jnp.int32(0)))


@functools.partial(jax.jit, static_argnames=("slots", "block", "num_warps", "interpret"))
def topk_select_kernel(scores, limit, k, *, slots: int, block: int = 1024, num_warps: int = 4,
                       interpret: bool = False):
    """Pallas implementation of `topk_select` (same arguments)."""
    C.check_platform(interpret)
    scores, limit, k, n, lead = _prepare(scores, limit, k, slots)
    R, S = scores.shape
    if block < 16 or block & (block - 1):
        raise ValueError(f"{block=} must be a power of two >= 16")
    kernel = functools.partial(_select_kernel, block=block, M=slots)
    idx = pl.pallas_call(
        kernel,
        grid=(R,),
        in_specs=[pl.BlockSpec((None,), lambda r: (r,)),
                  pl.BlockSpec((None,), lambda r: (r,)),
                  pl.BlockSpec((None, S), lambda r: (r, 0))],
        out_specs=pl.BlockSpec((None, slots), lambda r: (r, 0)),
        out_shape=jax.ShapeDtypeStruct((R, slots), jnp.int32),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="topk_select",
    )(limit, n, scores)
    return idx.reshape(*lead, slots), n.reshape(lead)


def topk_select_reference(scores, limit, k, *, slots: int, **_):
    """lax.top_k on the competing entries, re-ordered by position (the kernel's exact output)."""
    scores, limit, k, n, lead = _prepare(scores, limit, k, slots)
    R, S = scores.shape
    m = min(slots, S)
    pos = jnp.arange(S, dtype=jnp.int32)
    s = jnp.where(pos[None] < limit[:, None], scores.astype(jnp.float32), -jnp.inf)
    _, top = lax.top_k(s, m)                                            # by score, ties: lower position
    c = jnp.arange(m, dtype=jnp.int32)
    top = jnp.where(c[None] < n[:, None], top.astype(jnp.int32), S)     # drop the ones past n ...
    top = jnp.sort(top, axis=1)                                         # ... and order by position
    top = jnp.where(c[None] < n[:, None], top, 0)
    if m < slots:
        top = jnp.pad(top, ((0, 0), (0, slots - m)))
    return top.reshape(*lead, slots), n.reshape(lead)


def _prepare(scores, limit, k, slots):
    """Flatten the leading axes to rows; broadcast limit / k to them; n = min(k, limit, slots)."""
    *lead, S = scores.shape
    lead = tuple(lead)
    if slots < 1:
        raise ValueError(f"{slots=} must be >= 1")
    limit = jnp.clip(jnp.broadcast_to(jnp.asarray(limit, jnp.int32), lead), 0, S).reshape(-1)
    k = jnp.broadcast_to(jnp.asarray(k, jnp.int32), lead).reshape(-1)
    n = jnp.clip(jnp.minimum(k, limit), 0, min(slots, S))
    return scores.reshape(-1, S), limit, k, n, lead


def topk_select(scores, limit, k, *, slots: int, block: int = 1024, interpret: bool = False,
                implementation=None):
    """Top-k positions per row among the first `limit` entries, in ascending position order.

    Args:
      scores: f32[..., S] (no NaN).
      limit: int32 broadcastable to the leading axes: entries j < limit compete.
      k: int32 broadcastable to the leading axes: how many to keep.
      slots: static output width M (>= the largest k you need).
      block, interpret: kernel tunables / CPU interpretation.
      implementation: "pallas", "xla" (the reference: lax.top_k + a sort of the kept positions) or None
        (the kernel, falling back to the reference where it cannot run, e.g. on CPU).
    Returns:
      idx int32[..., M] (the selected positions ascending, then zeros), n int32[...] = min(k, limit, M, S).
    """
    return C.dispatch(implementation, topk_select_kernel, topk_select_reference, scores, limit, k, slots=slots,
                      block=block, interpret=interpret)
