"""Dustin's I_verify selection in one launch: protected sink and window, then two ranked tiers, per row.

`jspec.dustin.select_verify` is the XLA version and the reference (its docstring states the rule). For each
row r, over units u < n_units (slots, or pages of P slots whose scores the caller has summed):

    valid      u * P < length[r]                 (nv = ceil(length / P) units)
    protected  valid and (u < sink_pages or, with a window, u >= (length - window) // P)
    tier 1     the n1 = min(m_pages, left) best remaining units by the first signal, left = kp - protected
    tier 2     the n2 = left - n1 best remaining units by the second signal
    chosen     every valid unit when length <= budget, else protected | tier 1 | tier 2

and writes the chosen units in ascending order to idx[r, :count], zeros after. Ranking as the XLA version's:
descending score, -0.0 equal to +0.0, NaN below every number, ties to the lower unit.

Why a kernel: the XLA version runs each tier as 8 counting passes plus cumulative sums, each pass a launch of
its own, about 0.13 ms for 16 rows of 32K slots on an H100, a tenth of Dustin's whole sparse verification at
Llama-3-8B shapes (docs/performance.md). Here one program per row holds its row in L1/L2 and each tier is a
radix search for the tier's last key, `bits` bits per pass (32 / bits passes over the row, each counting the
keys at or above 2^bits candidate thresholds in one [2^bits, block] compare), then one pass for the
ties' last position and a final pass that compacts the chosen units (a running offset plus an in-block prefix
sum). A unit's tier-1 membership is recomputed from (threshold, last tie position) wherever tier 2 needs it.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from . import _common as C
from .topk_select import INT_MAX, INT_MIN, order_key


def rank_key(x):
    """f32 -> int32 ranking as the XLA selection does: topk_select's order-preserving image with -0.0 == +0.0
    and NaN at INT_MIN + 1 (below every number; INT_MIN is left for units that do not compete)."""
    return jnp.where(jnp.isnan(x), jnp.int32(INT_MIN + 1), order_key(jnp.where(x == 0, 0.0, x)))


def _tier_kernel(len_ref, d_ref, t_ref, idx_ref, n_ref, *, block, P, budget, kp, sink_pages, window, m_pages,
                 tiers, bits):
    """len_ref [] int32 slots; d_ref, t_ref [U] f32 unit scores of this row; idx_ref [kp] int32; n_ref [] int32."""
    length = len_ref[()]
    nv = (length + P - 1) // P
    dense = length <= budget
    lane = jnp.arange(block, dtype=jnp.int32)
    n_blocks = pl.cdiv(nv, block)
    win_start = jnp.maximum(length - window, 0) // P
    n_prot = jnp.minimum(sink_pages, nv)
    if window:
        n_prot += jnp.maximum(nv - jnp.maximum(win_start, sink_pages), 0)
    left = kp - n_prot
    n1 = jnp.where(dense, 0, jnp.minimum(m_pages, left)) if tiers[0] else jnp.int32(0)
    n2 = jnp.where(dense, 0, left - n1) if tiers[1] else jnp.int32(0)

    def units(c, ref):
        pos = c * block + lane
        ok = pos < nv
        x = plgpu.load(ref.at[pl.ds(c * block, block)], mask=ok, other=0.0)
        prot = pos < sink_pages
        if window:
            prot = prot | (pos >= win_start)
        return pos, ok, ok & ~prot, x

    def member(pos, key, t, last):
        """In the tier of threshold t whose ties are taken up to unit `last`."""
        return (key > t) | ((key == t) & (pos <= last))

    def search(key_of, n):
        """(t, last): the n-th largest key of the row and the unit of the last tie at t to take (-1: none)."""
        nb = jnp.where(n > 0, n_blocks, 0)          # n = 0: nothing to find (t ends all ones, no ties)

        def count_ge(thr):                          # [R] thresholds -> [R] counts of keys >= each
            def body(c, acc):
                return acc + (key_of(c)[1][None, :] >= thr[:, None]).astype(jnp.int32)
            return jnp.sum(lax.fori_loop(0, nb, body, jnp.zeros((thr.shape[0], block), jnp.int32)), axis=1)

        # The threshold's bits as an unsigned pattern u (key order = the order of key ^ INT_MIN as unsigned).
        # Digit 0 (the threshold so far) is counted too, for Triton's power-of-two shapes: its count is >= n
        # by construction (every lane of the visited blocks at first), so the digit is the hits minus one.
        digits = jnp.arange(2 ** bits, dtype=jnp.int32)
        u = jnp.int32(0)
        for shift in range(32 - bits, -1, -bits):
            cnt = count_ge((u | (digits << shift)) ^ jnp.int32(INT_MIN))
            u = u | ((jnp.sum((cnt >= n).astype(jnp.int32)) - 1) << shift)
        t = u ^ jnp.int32(INT_MIN)
        # The ties at t to take. t + 1 wraps only at t = INT_MAX, i.e. n = 0, where no block is visited.
        need = n - count_ge(jnp.full((1,), t + 1, jnp.int32))[0]

        def ties(c, carry):
            seen, last = carry
            pos, key = key_of(c)
            tie = (key == t).astype(jnp.int32)
            hit = (tie == 1) & (seen + jnp.cumsum(tie) == need)
            return seen + jnp.sum(tie), jnp.maximum(last, jnp.max(jnp.where(hit, pos, -1)))

        _, last = lax.fori_loop(0, nb, ties, (jnp.int32(0), jnp.int32(-1)))
        return t, last

    def key1(c):
        pos, _, cand, d = units(c, d_ref)
        return pos, jnp.where(cand, rank_key(d), jnp.int32(INT_MIN))

    t1, last1 = search(key1, n1) if tiers[0] else (jnp.int32(INT_MAX), jnp.int32(-1))

    def key2_of(c, pos, k1):
        """Tier 2's keys of block c: the candidates that tier 1 (keys k1) did not take."""
        _, _, cand, t = units(c, t_ref)
        return jnp.where(cand & ~member(pos, k1, t1, last1), rank_key(t), jnp.int32(INT_MIN))

    def key2(c):
        pos, k1 = key1(c)
        return pos, key2_of(c, pos, k1)

    t2, last2 = search(key2, n2) if tiers[1] else (jnp.int32(INT_MAX), jnp.int32(-1))

    for c in range(C.cdiv(kp, block)):              # unchosen slots read 0
        slot = c * block + lane
        plgpu.store(idx_ref.at[jnp.where(slot < kp, slot, kp)], jnp.zeros((block,), jnp.int32), mask=slot < kp)

    def compact(c, off):
        pos, ok, cand, d = units(c, d_ref)
        k1 = jnp.where(cand, rank_key(d), jnp.int32(INT_MIN))
        k2 = key2_of(c, pos, k1)
        take = ok & (dense | ~cand | member(pos, k1, t1, last1) | member(pos, k2, t2, last2))
        ti = take.astype(jnp.int32)
        dest = jnp.where(take, off + jnp.cumsum(ti) - 1, kp)     # masked lanes: out of range, never stored
        plgpu.store(idx_ref.at[dest], pos, mask=take)
        return off + jnp.sum(ti)

    n_ref[()] = lax.fori_loop(0, n_blocks, compact, jnp.int32(0))


@functools.partial(jax.jit, static_argnames=("page", "budget", "window", "kp", "sink_pages", "m_pages", "tiers",
                                             "block", "bits", "num_warps", "interpret"))
def tier_select_kernel(draft, target, lengths, *, page: int, budget: int, window: int, kp: int, sink_pages: int,
                       m_pages: int, tiers: tuple = (True, True), block: int = 1024, bits: int = 2,
                       num_warps: int = 8, interpret: bool = False):
    """draft, target: f32[B, U] unit scores (slots, or page sums at page > 1); lengths int32[B] in slots
    (<= U * page). The sizes are `jspec.dustin._check`'s: kp = budget // page units in all, sink_pages,
    m_pages tier-1 units; tiers: static (run tier 1, run tier 2), False where the caller knows a tier is empty.
    Returns (idx int32[B, kp]: the chosen units ascending, then zeros; count int32[B])."""
    C.check_platform(interpret)
    if bits not in (1, 2, 4) or block < 16 or block & (block - 1):
        raise ValueError(f"{bits=} must be 1, 2 or 4 and {block=} a power of two >= 16")
    B, U = draft.shape
    block = min(block, C.next_pow2(U))
    kernel = functools.partial(_tier_kernel, block=block, P=page, budget=budget, kp=kp, sink_pages=sink_pages,
                               window=window, m_pages=m_pages, tiers=tiers, bits=bits)
    row = pl.BlockSpec((None, U), lambda r: (r, 0))
    return pl.pallas_call(
        kernel,
        grid=(B,),
        in_specs=[pl.BlockSpec((None,), lambda r: (r,)), row, row],
        out_specs=[pl.BlockSpec((None, kp), lambda r: (r, 0)), pl.BlockSpec((None,), lambda r: (r,))],
        out_shape=[jax.ShapeDtypeStruct((B, kp), jnp.int32), jax.ShapeDtypeStruct((B,), jnp.int32)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="tier_select",
    )(jnp.asarray(lengths, jnp.int32), draft.astype(jnp.float32), target.astype(jnp.float32))
