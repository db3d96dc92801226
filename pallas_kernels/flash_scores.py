"""Flash attention over one layer's KV cache that also emits per-position scores for chosen query rows.

Used for prefill (score_rows=()), decode (T=1) and speculative verification (T = gamma+1, Vegas'
"Collect-2-Query" with score_rows=(0, T-1)); docs/kernels.md.

Supported: head_dim in (64, 128); GQA with N % K == 0 (tested G = 1, 3, 4, 8); bf16 / f16 / f32; any
S >= 16 and T >= 1; kv_len[b] in [T, S]; cache slots >= kv_len may hold junk, even NaN (masked loads read
zeros there). One kernel serves every T: the G query heads of a KV head are
packed with the T rows into the tile's M dimension (see `_common`), the grid is
(B, K, row blocks, splits) and split-K (flash-decoding) fills the GPU when B*K*row_blocks is small.

Scores in one pass over K/V. The weight `exp(scale*q.k - lse)` needs the *final* LSE, which split-K
only knows after the combine. Instead of a second pass over K (+50% of the bytes of a memory-bound
decode), the program that owns a key block also computes the raw logits of the score rows ([R*G,
block_k]: a second small dot on the K tile already in registers) and writes them out; the exp(. - lse)
and the sum over heads and rows are one small Pallas epilogue after the combine (`score_weights`).
With 16-bit K/V the logits are stored as float16 (float32 inputs keep float32): 11 significant bits,
a relative error of at most ~|logit| * 2^-11 in a weight (1.6% at a logit of 32), which only ranks
positions for the next draft (Vegas stays lossless whatever it selects), for half the bytes: R*G*2
bytes written and read per (KV head, position), R distinct score rows, against 4*H bytes of K/V read:
~6% more at R=2, G=4, H=128 (Llama-3-8B), ~9% at R=2, G=3, H=64 (SmolLM2).
"logits" mode needs no LSE: the rows are summed in the kernel (4 bytes per position).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from . import _common as C
from . import xla

SCORE_MODES = ("weights", "logits")
F16_MAX = 65504.0


def logit_dtype(dtype):
    """Storage dtype of the score rows' raw logits in "weights" mode: float32 for float32 inputs, else
    float16 (see the module docstring)."""
    return jnp.float32 if jnp.dtype(dtype) == jnp.float32 else jnp.float16


def default_block_sizes(rows: int, head_dim: int, dtype, causal: bool = True) -> C.BlockSizes:
    """Defaults for an sm_90 GPU (228 KB SMEM/SM, 132 SMs), chosen by the packed row count rows = T*G.

    Decode/verify (rows <= 64): one row block holds every packed row, so K/V are read once per KV head;
    block_k = 128 keys keeps 2 pipeline stages of K+V tiles (2*2*128*H*2 bytes = 128 KB at H=128, bf16)
    within SMEM (halved for f32). 17-32 rows (Vegas' verification at gamma 5-10 with G=3) take 64-key tiles
    in 3 stages: with a cache of more than 2^31 elements (SmolLM2 at B=64, S=8192, 30 layers) the 2-stage
    128-key tiles made T=6 far dearer per layer than T=5, these not (docs/performance.md). Note that the tile
    size changes the online softmax's accumulation order, so 17-32-row blocks do not round like <= 16-row ones.
    Prefill: 64x64 (H=128) / 128x64 (H=64) tiles, the usual compute-bound
    FlashAttention-2 shapes for 4 warps. Non-causal many-row launches (tree prefixes) take 128-row
    blocks with 8 warps to halve the number of times the prefix is re-read.
    """
    itemsize = jnp.dtype(dtype).itemsize
    wide = head_dim * itemsize > 256
    if 16 < rows <= 32 and not wide:
        return C.BlockSizes(block_m=64, block_k=64, num_warps=4, num_stages=3)
    if rows <= 64:
        return C.BlockSizes(block_m=64, block_k=64 if wide else 128, num_warps=4, num_stages=2)
    if not causal:
        return C.BlockSizes(block_m=128, block_k=32 if wide else 64, num_warps=8, num_stages=2)
    return C.BlockSizes(block_m=64 if head_dim == 128 else 128, block_k=32 if itemsize > 2 else 64,
                        num_warps=4, num_stages=2)


def exact_block_sizes(rows: int, groups: int, head_dim: int, dtype,
                      base: C.BlockSizes | None = None) -> tuple[C.BlockSizes, int]:
    """Exact mode's schedule for a step of `rows` packed rows: (block sizes, sub-block rows).

    Everything that decides how a row is rounded is the one-token step's and depends on G, H and the dtype
    only: the key tile, warps and stages of `base` (default the T=1 `default_block_sizes(G)`), the MMA tile
    of `C.exact_sub_rows(G)` rows and (in `flash_partials`) the split-K plan of fixed key ranges
    (`C.exact_split_plan`: not the capacity's or the batch's, and not base.num_splits). A longer step only
    gets more sub-blocks, up to base.block_m rows per program (64 by default: one K/V read for all of them),
    then more programs.
    """
    base = base or default_block_sizes(groups, head_dim, dtype)
    sub = C.exact_sub_rows(groups)
    block_m = max(sub, min(base.block_m, C.next_pow2(rows)))
    return dataclasses.replace(base, block_m=block_m), sub


def _flash_kernel(layer_ref, kv_len_ref, q_ref, k_ref, v_ref, *refs, T, G, sm_scale, causal, block_k, per_split,
                  score_mode, score_end_row, n_sel, multi_row_blocks, n_sub=0):
    """One program: a block of packed query rows of one KV head against one split of the keys.

    n_sub > 0 (exact mode): the rows are n_sub sub-blocks of bm / n_sub rows, each its own MMA tile and
    online softmax against the same K/V tile load (`_common.exact_sub_rows`).

    layer_ref, kv_len_ref: [] int32; q_ref: [bm, H]; k_ref, v_ref: [L, S, H] (this batch and KV head, every
    layer; the kernel reads layer `layer_ref` in place).
    Optional qs_ref [Rp, H], st_ref [Rp] int32, sw_ref [Rp] f32: the (distinct) score rows' queries,
    their row index t and multiplicity in score_rows (0 for padding).
    Outputs: o_ref [bm, H], lse_ref [bm] (this split); sc_ref [Rp, S] logits or [S] row-summed logits.
    """
    if score_mode:
        qs_ref, st_ref, sw_ref, o_ref, lse_ref, sc_ref = refs
    else:
        o_ref, lse_ref = refs
    block_m, head_dim = q_ref.shape
    S = k_ref.shape[1]
    layer = layer_ref[()]
    m_blk, split = pl.program_id(2), pl.program_id(3)
    kv_len = kv_len_ref[()]

    # Row r = t*G + g; bottom-right causal: row t sees keys j < kv_len - T + t + 1.
    t = (m_blk * block_m + jnp.arange(block_m)) // G
    if causal:
        row_end = jnp.minimum(kv_len - T + t + 1, kv_len)  # padded rows (t >= T) stop at kv_len
        full_end = kv_len - T + (m_blk * block_m) // G + 1  # keys every row of the block sees
        end = kv_len - T + jnp.minimum(T - 1, (m_blk * block_m + block_m - 1) // G) + 1
    else:
        row_end = jnp.full((block_m,), kv_len)
        full_end = end = kv_len
    is_score_prog = m_blk == 0  # scores are written by the first row block only
    if score_mode:
        end = jnp.where(is_score_prog, jnp.maximum(end, kv_len - T + score_end_row), end)

    lo = split * per_split
    hi = jnp.minimum(lo + per_split, pl.cdiv(end, block_k))
    mid = jnp.clip(full_end // block_k, lo, hi)  # blocks [lo, mid) need no mask at all
    q = None if n_sub else q_ref[...]
    scale2 = sm_scale * C.LOG2E

    def scores(start, pos, k, masked):
        sl = C.dot_nt(qs_ref[...], k) * sm_scale  # [Rp, bk] natural-log logits
        cols = pl.ds(start, block_k)
        in_range = pos < S
        if score_mode == "weights":
            # Raw logits; exp(. - lse), causal masking and the head/row sum run after the combine.
            sel = jnp.arange(sl.shape[0]) < n_sel
            mask = sel[:, None] & in_range[None, :] if masked else jnp.broadcast_to(sel[:, None], sl.shape)
            if sc_ref.dtype != jnp.float32:   # float16 logits; keep them finite
                sl = jnp.clip(sl, -F16_MAX, F16_MAX).astype(sc_ref.dtype)
            plgpu.store(sc_ref.at[:, cols], sl, mask=mask)
        else:
            sl = sl * sw_ref[...][:, None]
            if masked:
                seen = pos[None, :] < (kv_len - T + st_ref[...] + 1)[:, None]
                sl = jnp.where(seen, sl, 0.0)
            plgpu.store(sc_ref.at[cols], jnp.sum(sl, axis=0), mask=in_range if masked else None)

    def body(masked):
        def step(i, carry):
            start = pl.multiple_of(i * block_k, block_k)
            pos = start + jnp.arange(block_k)
            if masked:  # past kv_len the cache holds junk (even NaN): read zeros instead
                ok = jnp.broadcast_to((pos < kv_len)[:, None], (block_k, head_dim))
                k = plgpu.load(k_ref.at[layer, pl.ds(start, block_k), :], mask=ok, other=0.0)
                v = plgpu.load(v_ref.at[layer, pl.ds(start, block_k), :], mask=ok, other=0.0)
            else:
                k = k_ref[layer, pl.ds(start, block_k), :]
                v = v_ref[layer, pl.ds(start, block_k), :]
            # The attention logits first, then the score rows: the other order made this loop slower on the GPU
            # (docs/performance.md, "Before and after the redesign").
            if n_sub:   # exact mode: each sub-block is the tile a one-token step computes
                s = [jnp.where(pos[None, :] < re[:, None], C.dot_nt(qi, k) * scale2, -jnp.inf)
                     if masked else C.dot_nt(qi, k) * scale2 for qi, re in zip(q_sub, end_sub)]
            else:
                s = C.dot_nt(q, k) * scale2
                if masked:
                    s = jnp.where(pos[None, :] < row_end[:, None], s, -jnp.inf)
            if score_mode:
                if multi_row_blocks:
                    pl.when(is_score_prog)(lambda: scores(start, pos, k, masked))
                else:
                    scores(start, pos, k, masked)
            if n_sub:
                return tuple(C.softmax_step(c, si, v) for c, si in zip(carry, s))
            return C.softmax_step(carry, s, v)

        return step

    if n_sub:
        sub = block_m // n_sub
        q_sub = [q_ref[pl.ds(i * sub, sub), :] for i in range(n_sub)]
        t_sub = [(m_blk * block_m + i * sub + jnp.arange(sub)) // G for i in range(n_sub)]
        end_sub = [jnp.minimum(kv_len - T + ts + 1, kv_len) if causal else jnp.full((sub,), kv_len) for ts in t_sub]
    C.run_key_blocks(lo, mid, hi, body, o_ref, lse_ref, n_sub)


def flash_partials(qp, k, v, kv_len, *, T, G, causal, sm_scale, block_sizes, interpret, out_dtype, layer=None,
                   qsel=None, sel_t=None, sel_w=None, score_mode=None, score_end_row=0, n_sel=0, sub=0):
    """Launches the kernel on packed queries qp [B,K,Mp,H] (Mp a multiple of block_m) against k, v
    [B,S,K,H] (or the stacked [L,B,S,K,H] cache and a `layer` index, traced or not).

    sub > 0 (exact mode, `exact_block_sizes`): MMA tiles of `sub` rows, and exact mode's split-K plan (fixed
    key ranges, `_common.exact_split_plan`), whatever the number of row blocks, the batch or the capacity.

    Returns o [P,B,K,Mp,H] (out_dtype, each split normalised over its own keys), lse [P,B,K,Mp] and,
    with score_mode, the raw score-row logits [B,K,Rp,S] ("weights"; `logit_dtype(qp.dtype)`) or their row
    sums [B,K,S] f32.
    """
    B, K, Mp, H = qp.shape
    S = C.layer_shape(k, layer)[1]
    bs = block_sizes
    block_m = min(bs.block_m, Mp)
    block_k = min(bs.block_k, C.prev_pow2(S))
    if block_k < 16:
        raise NotImplementedError(f"{S=} must be >= 16")
    n_m = Mp // block_m
    if sub:
        splits, per_split = C.exact_split_plan(C.cdiv(S, block_k))
    else:
        splits, per_split = C.split_plan(C.cdiv(S, block_k), B * K * n_m, bs.num_splits,
                                         resident=C.resident_programs(bs, block_k, H, k.dtype))
    if splits > 1:
        out_dtype = jnp.float32  # partials are combined in f32
    kernel = functools.partial(
        _flash_kernel, T=T, G=G, sm_scale=sm_scale, causal=causal, block_k=block_k, per_split=per_split,
        score_mode=score_mode, score_end_row=score_end_row, n_sel=n_sel, multi_row_blocks=n_m > 1,
        n_sub=block_m // sub if sub else 0)
    k, v, layer = C.as_stacked(k, v, layer)
    kv_spec = C.kv_block_spec(k)
    in_specs = [
        C.LAYER_SPEC,
        pl.BlockSpec((None,), lambda b, h, m, s: (b,)),
        pl.BlockSpec((None, None, block_m, H), lambda b, h, m, s: (b, h, m, 0)),
        kv_spec,
        kv_spec,
    ]
    out_specs = [
        pl.BlockSpec((None, None, None, block_m, H), lambda b, h, m, s: (s, b, h, m, 0)),
        pl.BlockSpec((None, None, None, block_m), lambda b, h, m, s: (s, b, h, m)),
    ]
    out_shape = [
        jax.ShapeDtypeStruct((splits, B, K, Mp, H), out_dtype),
        jax.ShapeDtypeStruct((splits, B, K, Mp), jnp.float32),
    ]
    args = [layer, kv_len.astype(jnp.int32), qp, k, v]
    if score_mode:
        Rp = qsel.shape[2]
        in_specs += [pl.BlockSpec((None, None, Rp, H), lambda b, h, m, s: (b, h, 0, 0)),
                     pl.BlockSpec((Rp,), lambda b, h, m, s: (0,)),
                     pl.BlockSpec((Rp,), lambda b, h, m, s: (0,))]
        args += [qsel, sel_t, sel_w]
        if score_mode == "weights":
            out_specs.append(pl.BlockSpec((None, None, Rp, S), lambda b, h, m, s: (b, h, 0, 0)))
            out_shape.append(jax.ShapeDtypeStruct((B, K, Rp, S), logit_dtype(qp.dtype)))
        else:
            out_specs.append(pl.BlockSpec((None, None, S), lambda b, h, m, s: (b, h, 0)))
            out_shape.append(jax.ShapeDtypeStruct((B, K, S), jnp.float32))
    return pl.pallas_call(
        kernel,
        grid=(B, K, n_m, splits),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=bs.compiler_params(),
        interpret=interpret,
        name="flash_scores",
    )(*args)


def _weights_kernel(kv_len_ref, sc_ref, lse_ref, sel_ref, st_ref, sw_ref, w_ref, *, T, R, block_s):
    """One program: positions [j*block_s, +block_s) of one sequence. sc_ref [K, Rp, S] raw logits of the score
    rows (junk where a row may not look and in padding rows; only the first R are read), lse_ref [K, Mp] the
    natural-log LSE of every packed query row, sel_ref / st_ref / sw_ref [R] each score row's packed row, row
    index t and multiplicity (0: padding). w_ref [S] <- sum over heads and rows of mult * exp(logit - lse)."""
    K = sc_ref.shape[0]
    S = sc_ref.shape[2]
    start = pl.multiple_of(pl.program_id(1) * block_s, block_s)
    pos = start + jnp.arange(block_s)
    in_range = pos < S
    mult = sw_ref[...]
    limit = kv_len_ref[()] - T + st_ref[...] + 1                     # row i sees positions < limit_i
    seen = (pos[None, :] < limit[:, None]) & (mult > 0)[:, None] & in_range[None, :]
    rows = sel_ref[...]
    acc = jnp.zeros((block_s,), jnp.float32)
    for h in range(K):   # K is small (KV heads); static unroll
        hh = jnp.int32(h)
        lse2 = lse_ref[hh, rows] * C.LOG2E                 # base 2: exp2 is one instruction, exp is not
        x = plgpu.load(sc_ref.at[hh, pl.ds(0, R), pl.ds(start, block_s)], mask=seen, other=0.0)
        w = jnp.exp2(x.astype(jnp.float32) * C.LOG2E - lse2[:, None]) * mult[:, None]
        acc += jnp.sum(jnp.where(seen, w, 0.0), axis=0)
    plgpu.store(w_ref.at[pl.ds(start, block_s)], acc, mask=in_range)


def score_weights(sc, lse, kv_len, sel, sel_t, sel_w, *, T, interpret=False, block_s=256, num_warps=1):
    """The "weights" epilogue as one Pallas pass: [B, S] = sum over KV heads k and score rows i of
    sel_w[i] * exp(sc[b, k, i, j] - lse[b, k, sel[i]]) where row i may see j (j < kv_len - T + sel_t[i] + 1).

    sc [B, K, Rp, S] raw logits from the flash kernel (f32 or f16), row i that of packed query row sel[i];
    lse [B, K, Mp] f32 the final LSE of every packed row (gathered here: no extra launch); sel, sel_t, sel_w
    [R] int32 / int32 / f32 with R <= Rp a power of two, padding rows weighted 0. Only the R rows are read
    (the kernel's Rp >= 16 is Triton's dot minimum, not the number of score rows). Each valid logit is read
    once; exp runs as exp2 on pre-scaled inputs. The pass is latency-bound, not compute- or bandwidth-bound
    (exp2 and reading fewer rows changed nothing), so it runs as small one-warp programs over 256 positions,
    the fastest launch of a sweep (docs/performance.md, "Split-K by waves and the weights epilogue").
    """
    B, K, Rp, S = sc.shape
    R = sel.shape[0]
    if R > Rp or R & (R - 1):
        raise ValueError(f"{R=} score rows must be a power of two <= {Rp=}")
    block_s = min(block_s, C.prev_pow2(S))
    Mp = lse.shape[2]
    kernel = functools.partial(_weights_kernel, T=T, R=R, block_s=block_s)
    vec = pl.BlockSpec((R,), lambda b, j: (0,))
    return pl.pallas_call(
        kernel,
        grid=(B, C.cdiv(S, block_s)),
        in_specs=[pl.BlockSpec((None,), lambda b, j: (b,)),
                  pl.BlockSpec((None, K, Rp, S), lambda b, j: (b, 0, 0, 0)),
                  pl.BlockSpec((None, K, Mp), lambda b, j: (b, 0, 0)),
                  vec, vec, vec],
        out_specs=pl.BlockSpec((None, S), lambda b, j: (b, 0)),
        out_shape=jax.ShapeDtypeStruct((B, S), jnp.float32),
        compiler_params=C.BlockSizes(num_warps=num_warps, num_stages=1).compiler_params(),
        interpret=interpret,
        name="score_weights",
    )(kv_len.astype(jnp.int32), sc, lse.astype(jnp.float32), sel.astype(jnp.int32), sel_t.astype(jnp.int32),
      sel_w.astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("score_rows", "score_mode", "sm_scale", "block_sizes", "interpret",
                                             "exact"))
def flash_scores_kernel(q, k, v, kv_len, *, score_rows=(), score_mode="weights", sm_scale=None,
                        block_sizes=None, interpret=False, layer=None, exact=False):
    """Pallas implementation of `flash_scores` (same arguments); raises NotImplementedError if unsupported."""
    K, G = C.check_attention_shapes(q, k, v, layer)
    C.check_platform(interpret)
    if score_mode not in SCORE_MODES:
        raise ValueError(f"{score_mode=} must be one of {SCORE_MODES}")
    B, T, N, H = q.shape
    S = C.layer_shape(k, layer)[1]
    rows = tuple(int(r) % T for r in score_rows)
    if any(not -T <= r < T for r in score_rows):
        raise ValueError(f"{score_rows=} must index the {T=} query rows")
    sm_scale = 1.0 / float(np.sqrt(H)) if sm_scale is None else float(sm_scale)
    sub = 0
    if exact:
        bs, sub = exact_block_sizes(T * G, G, H, q.dtype, block_sizes)
        block_m = bs.block_m
    else:
        bs = block_sizes or default_block_sizes(T * G, H, q.dtype)
        block_m = C.row_block(T * G, bs.block_m)
    qp = C.pack_queries(q, K, block_m)
    kw = dict(T=T, G=G, causal=True, sm_scale=sm_scale, block_sizes=bs, interpret=interpret, out_dtype=q.dtype,
              layer=layer, sub=sub)
    if rows:
        # Distinct score rows packed like the queries: entry i = (row uniq[i // G], head g = i % G); a
        # row listed twice (e.g. (0, T-1) at T=1) is stored once and weighted by its multiplicity.
        uniq = sorted(set(rows))
        sel = np.array([r * G + g for r in uniq for g in range(G)], np.int32)
        n_sel = len(sel)
        Rp = max(16, C.next_pow2(n_sel))
        qsel = jnp.pad(qp[:, :, sel], ((0, 0), (0, 0), (0, Rp - n_sel), (0, 0)))
        sel_t = jnp.asarray(np.pad(sel // G, (0, Rp - n_sel)), jnp.int32)
        mult = np.array([rows.count(r) for r in uniq for _ in range(G)], np.float32)
        sel_w = jnp.asarray(np.pad(mult, (0, Rp - n_sel)))
        o, lse, sc = flash_partials(qp, k, v, kv_len, qsel=qsel, sel_t=sel_t, sel_w=sel_w, score_mode=score_mode,
                                    score_end_row=max(rows) + 1, n_sel=n_sel, **kw)
    else:
        o, lse = flash_partials(qp, k, v, kv_len, **kw)
    if exact:   # [B,K,Mp,H] q.dtype, [B,K,Mp]
        o, lse = C.combine_splits_exact(o, lse, out_dtype=q.dtype, interpret=interpret)
    else:
        o, lse = C.combine_splits(o, lse)  # [B,K,Mp,H] f32, [B,K,Mp]
    scores = None
    if rows:
        j = jnp.arange(S)
        if score_mode == "weights":
            R = C.next_pow2(n_sel)   # the epilogue reads these rows only (Rp >= 16 is for the kernel's dot)
            scores = score_weights(sc, lse, kv_len, jnp.asarray(np.pad(sel, (0, R - n_sel)), jnp.int32),
                                   sel_t[:R], sel_w[:R], T=T, interpret=interpret)
        else:
            scores = jnp.where(j[None, :] < (kv_len - T + max(rows) + 1)[:, None], sc.sum(axis=1), 0.0)
    return C.unpack_out(o, T, N).astype(q.dtype), C.unpack_lse(lse, T, N), scores


def flash_scores(q, k, v, kv_len, *, score_rows=(), score_mode="weights", sm_scale=None, block_sizes=None,
                 interpret=False, layer=None, exact=False, implementation=None):
    """Causal attention of T new tokens over a KV cache, plus per-position scores for chosen rows.

    Args:
      q: [B,T,N,H] queries of the T newest tokens.
      k, v: [B,S,K,H] one layer's cache (bf16 or f32); query head n reads KV head n // (N/K). Or, with
        `layer`, the stacked [L,B,S,K,H] cache, read in place (no k_all[layer] copy).
      kv_len: int32[B] valid positions including the T new tokens, which sit at kv_len-T .. kv_len-1;
        query t sees key j iff j <= kv_len - T + t. Positions >= kv_len are never read.
      score_rows: static tuple of query-row indices (negative ones count from T) whose scores are summed
        into `scores`; a row listed twice counts twice (Collect-2-Query's (0, T-1) at T=1).
      score_mode: "weights" sums exp(scale*q.k - lse), "logits" sums scale*q.k.
      sm_scale: softmax scale, default 1/sqrt(H).
      block_sizes: `BlockSizes` override; interpret: run the Pallas kernel in interpret mode.
      layer: layer index into a stacked cache (an int or a traced int32 scalar: a runtime operand of the
        kernel, so every layer shares one compiled kernel), or None when k, v are one layer.
      exact: exact mode (`exact_block_sizes`): each output row is rounded exactly as in a one-token step
        at its position (same key tiles, MMA tile, split-K plan and merge), whatever T is. `block_sizes`
        then gives the one-token schedule (its block_m: the most rows per program).
      implementation: "pallas" (the kernel), "xla" (the XLA path, `xla.flash_scores`) or None (the kernel,
        falling back to the XLA path where it raises NotImplementedError: an unsupported shape, a CPU).
    Returns:
      out [B,T,N,H] q.dtype; lse [B,N,T] f32 (natural log); scores [B,S] f32 summed over the N query
      heads and the score rows (0 where no score row may look), or None when score_rows is empty.
    """
    return C.dispatch(implementation, flash_scores_kernel, xla.flash_scores, q, k, v, kv_len,
                      score_rows=tuple(score_rows), score_mode=score_mode, sm_scale=sm_scale,
                      block_sizes=block_sizes, interpret=interpret, layer=layer, exact=exact)
