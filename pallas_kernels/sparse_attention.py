"""Attention over a per-sequence list of selected cache positions (page size 1) plus a causal tail.

Used by the sparse drafts (Vegas, MagicDec streaming/quest) and by Dustin's sparse verification;
docs/kernels.md. One index set per (batch, layer) is shared by all heads of the layer.

Supported: head_dim in (64, 128); GQA with N % K == 0 (tested G = 1, 3, 4, 8); bf16 / f16 / f32; S >= 16;
any M (index capacity) and small T (the packed T*G rows share one tile up to block_m rows).

How: the kernel reads one flat list of `n_valid + T` entries: idx[:n_valid], then the tail positions
kv_len-T .. kv_len-1, every position clamped into [0, S) so each gathered address is in bounds. The list is
formed block by block inside the kernel from idx, n_valid and kv_len (building it in XLA cost one more
launch per layer and draft step, in a step that is launch-bound). Entry e >= n_valid is tail token
u = e - n_valid, visible to row t iff u <= t; entries before n_valid are visible to every row. The grid is (B, K, row blocks, splits): split-K
over the list so a batch of one still fills the GPU, partial (out, lse) merged exactly afterwards.
K/V rows are gathered with integer-array ref indexing (`k_ref[idx, :]`): each row is H contiguous
elements, so a gather of block_k rows is block_k coalesced 128/256-byte reads.

Fused heads (`fuse_heads=True`, when K*T*G query rows fit one row block, e.g. a SmolLM2 draft step's 9): one
program per (sequence, row block, split) instead of one per KV head. The cache is viewed as [L, B, S*K, H]
(a free reshape), so one position's K heads are adjacent rows and a selected position costs one contiguous
K*H*itemsize read (384 bytes for SmolLM2) instead of K separate 128-byte reads in K programs; each step
gathers block_k/hp entries x hp lanes (hp = K rounded up to a power of two for Triton's shapes; the extra lane
repeats the last head and is masked), and a query row's scores keep only its own head's lanes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from . import _common as C
from . import xla


def default_block_sizes(rows: int, head_dim: int, dtype) -> C.BlockSizes:
    """Defaults (chosen on an sm_90 GPU): all packed rows in one tile (each gathered row is read once per KV head) and
    128 gathered entries per step (64 when a K+V tile pair would not fit 2 stages in SMEM). Split-K is
    chosen automatically (`_common.split_plan`: ~4 programs per SM without a badly filled last wave, at least
    2 blocks per split: a 5% budget of 128K is only ~50 blocks, which a batch of one must still spread over
    the SMs)."""
    wide = head_dim * jnp.dtype(dtype).itemsize > 256
    return C.BlockSizes(block_m=64, block_k=64 if wide else 128, num_warps=4, num_stages=2)


def _sparse_kernel(layer_ref, n_valid_ref, kv_len_ref, idx_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, G, T, n_tail,
                   sm_scale, block_k, per_split, per_layer, heads):
    """layer_ref, kv_len_ref: [] int32; n_valid_ref [Li] int32, idx_ref: [Li, M] int32 selected positions (junk
    past n_valid), read at row `layer` when per_layer (one selection per layer) else row 0; q_ref: [bm,H];
    k_ref, v_ref: [L,S*heads,H] (read at layer `layer_ref`); outputs o_ref [bm,H], lse_ref [bm] for this split.

    heads > 1 (fused heads): the program holds the packed query rows of all `heads` KV heads (row r belongs to
    head r // (T*G)) and the cache rows of one position's heads are adjacent (position p, head j at row
    p*heads + j): each step gathers block_k entries x hp (heads rounded up to a power of two, the extra lanes
    repeat the last head and are masked) rows, and a query row only sees the keys of its own head."""
    block_m, head_dim = q_ref.shape
    M, S = idx_ref.shape[1], k_ref.shape[1] // heads
    m_blk, split = pl.program_id(2), pl.program_id(3)
    layer, kv_len = layer_ref[()], kv_len_ref[()]
    li = layer if per_layer else 0
    n_valid = jnp.clip(n_valid_ref[li], 0, M)
    n_total = n_valid + n_tail
    r = m_blk * block_m + jnp.arange(block_m)
    t = (r % (T * G)) // G
    hp = C.next_pow2(heads)
    lo = split * per_split
    hi = jnp.minimum(lo + per_split, pl.cdiv(n_total, block_k))
    mid = jnp.clip(n_valid // block_k, lo, hi)  # blocks of selected entries only: no mask needed
    q = q_ref[...]
    scale2 = sm_scale * C.LOG2E

    def body(masked):
        def step(i, carry):
            start = pl.multiple_of(i * block_k, block_k)
            lane = jnp.arange(block_k * hp)            # entry lane // hp, head lane % hp
            e = start + lane // hp
            idx = idx_ref[li, jnp.minimum(e, M - 1)]   # a gather: in bounds for any M, no padding needed
            if masked:   # the list's end: selected entries, then the tail, then nothing
                tail_pos = jnp.where(e < n_total, kv_len - T + (e - n_valid), 0)   # past the list: a finite slot
                idx = jnp.where(e < n_valid, idx, tail_pos)
            idx = jnp.clip(idx, 0, S - 1)
            if heads > 1:
                idx = idx * heads + jnp.minimum(lane % hp, heads - 1)
            k = k_ref[layer, idx, :]
            v = v_ref[layer, idx, :]
            s = C.dot_nt(q, k) * scale2
            seen = None
            if heads > 1:
                seen = (r // (T * G))[:, None] == (lane % hp)[None, :]
            if masked:
                rel = (e - n_valid)[None, :]  # >= 0: tail token number
                ok = (rel < 0) | ((rel <= t[:, None]) & (rel < n_tail))
                seen = ok if seen is None else seen & ok
            if seen is not None:
                s = jnp.where(seen, s, -jnp.inf)
            return C.softmax_step(carry, s, v)

        return step

    C.run_key_blocks(lo, mid, hi, body, o_ref, lse_ref)


# Fused heads (module docstring) when all heads' packed query rows fit one row block (decode-sized steps).
# Off: it measured no faster in whole decode loops (docs/performance.md).
FUSE_HEADS = False


@functools.partial(jax.jit, static_argnames=("tail", "sm_scale", "block_sizes", "interpret", "fuse_heads", "out_f32"))
def sparse_attention_kernel(q, k, v, idx, n_valid, kv_len, *, tail=True, sm_scale=None, block_sizes=None,
                            interpret=False, layer=None, fuse_heads=None, out_f32=False):
    """Pallas implementation of `sparse_attention` (same arguments; fuse_heads: None = FUSE_HEADS). out_f32: return
    the output in float32, unrounded (a partial that `sparse_tree_attention` merges with the tree part)."""
    K, G = C.check_attention_shapes(q, k, v, layer)
    C.check_platform(interpret)
    B, T, N, H = q.shape
    S, M = C.layer_shape(k, layer)[1], idx.shape[-1]
    per_layer = idx.ndim == 3
    if per_layer and (layer is None or idx.shape[0] != k.shape[0] or n_valid.shape != idx.shape[:2]):
        raise ValueError(f"per-layer selections idx [L,B,M] need the stacked cache and a layer; got {idx.shape=} "
                         f"{n_valid.shape=} {k.shape=} {layer=}")
    sm_scale = 1.0 / float(np.sqrt(H)) if sm_scale is None else float(sm_scale)
    bs = block_sizes or default_block_sizes(T * G, H, q.dtype)
    fuse = (FUSE_HEADS if fuse_heads is None else fuse_heads) and K > 1 and K * T * G <= bs.block_m
    heads = K if fuse else 1
    block_m = C.row_block(heads * T * G, bs.block_m)
    hp = C.next_pow2(heads)   # gathered rows per entry (fused heads): block_k entries are block_k * hp rows
    block_k = min(max(1, bs.block_k // hp), C.prev_pow2(S))
    if S < 16 or block_k * hp < 16:
        raise NotImplementedError(f"{S=} must be >= 16")
    qp = C.pack_queries(q, K, 1 if fuse else block_m)
    if fuse:   # [B, K, T*G, H] -> one row block of all heads [B, 1, K*T*G (padded), H]
        qp = qp.reshape(B, 1, K * T * G, H)
        qp = jnp.pad(qp, ((0, 0), (0, 0), (0, block_m - K * T * G), (0, 0)))
    n_m = qp.shape[2] // block_m
    n_tail = T if tail else 0
    splits, per_split = C.split_plan(C.cdiv(M + n_tail, block_k), B * (K // heads) * n_m, bs.num_splits,
                                     min_blocks=2, resident=C.resident_programs(bs, block_k * heads, H, k.dtype))
    kernel = functools.partial(_sparse_kernel, G=G, T=T, n_tail=n_tail, sm_scale=sm_scale, block_k=block_k,
                               per_split=per_split, per_layer=per_layer, heads=heads)
    if not per_layer:
        idx, n_valid = idx[None], n_valid[None]
    Li = idx.shape[0]
    scalar = pl.BlockSpec((None,), lambda b, h, m, s: (b,))
    k, v, layer = C.as_stacked(k, v, layer)
    if fuse:   # [L,B,S,K,H] -> [L,B,S*K,1,H]: position p's heads are adjacent rows (a free reshape)
        L_ = k.shape[0]
        k, v = k.reshape(L_, B, S * K, 1, H), v.reshape(L_, B, S * K, 1, H)
    kv_spec = C.kv_block_spec(k)
    out_dtype = jnp.float32 if splits > 1 or out_f32 else q.dtype
    o, lse = pl.pallas_call(
        kernel,
        grid=(B, K // heads, n_m, splits),
        in_specs=[
            C.LAYER_SPEC,
            pl.BlockSpec((Li, None), lambda b, h, m, s: (0, b)),
            scalar,
            pl.BlockSpec((Li, None, M), lambda b, h, m, s: (0, b, 0)),
            pl.BlockSpec((None, None, block_m, H), lambda b, h, m, s: (b, h, m, 0)),
            kv_spec,
            kv_spec,
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, block_m, H), lambda b, h, m, s: (s, b, h, m, 0)),
            pl.BlockSpec((None, None, None, block_m), lambda b, h, m, s: (s, b, h, m)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((splits, B, K // heads, qp.shape[2], H), out_dtype),
            jax.ShapeDtypeStruct((splits, B, K // heads, qp.shape[2]), jnp.float32),
        ],
        compiler_params=bs.compiler_params(),
        interpret=interpret,
        name="sparse_attention",
    )(layer, n_valid.astype(jnp.int32), kv_len.astype(jnp.int32), idx.astype(jnp.int32), qp, k, v)
    o, lse = C.combine_splits(o, lse)
    if fuse:   # back to [B, K, T*G, ...] per head
        o = o[:, 0, : K * T * G].reshape(B, K, T * G, H)
        lse = lse[:, 0, : K * T * G].reshape(B, K, T * G)
    return C.unpack_out(o, T, N).astype(jnp.float32 if out_f32 else q.dtype), C.unpack_lse(lse, T, N)


def sparse_attention(q, k, v, idx, n_valid, kv_len, *, tail=True, sm_scale=None, block_sizes=None,
                     interpret=False, layer=None, implementation=None):
    """Attention over selected cache positions idx[b, :n_valid[b]] plus (tail) the T newest tokens.

    Args:
      q: [B,T,N,H] queries of the T newest tokens.
      k, v: [B,S,K,H] one layer's full cache, or the stacked [L,B,S,K,H] cache with a `layer` index (int or traced).
      idx: int32[B,M] selected positions, each < kv_len[b] - T, no duplicates, any order; entries
        idx[b, n_valid[b]:] are junk and ignored. Or, with the stacked cache, every layer's selections
        int32[L,B,M] (and n_valid int32[L,B]), read at `layer` inside the kernel: no per-layer slice.
      n_valid: int32[B] number of real entries per sequence (0 allowed when tail=True).
      kv_len: int32[B] valid cache length including the T new tokens (at kv_len-T .. kv_len-1).
      tail: also attend causally over the T newest tokens (row t sees tail tokens 0..t).
      sm_scale, block_sizes, interpret, layer, implementation: as in `flash_scores`.
    Returns:
      out [B,T,N,H] q.dtype, lse [B,N,T] f32 (natural log).
    """
    return C.dispatch(implementation, sparse_attention_kernel, xla.sparse_attention, q, k, v, idx,
                      n_valid, kv_len, tail=tail, sm_scale=sm_scale, block_sizes=block_sizes,
                      interpret=interpret, layer=layer)
