"""Tree verification attention: an unmasked flash pass over the prefix plus a small masked pass over the
tree tokens, merged exactly through their LSEs (docs/kernels.md; LongSpec's hybrid tree attention).

The n tree tokens' keys/values already sit in the cache at prefix_len[b] + i. Query i sees every prefix
position < prefix_len[b] and tree slot j iff tree_mask[b, i, j] (diagonal included). Then

    (out_p, lse_p) = flash over the prefix (no mask: every row sees the same keys)
    (out_t, lse_t) = dense masked attention over the n tree slots
    w = sigmoid(lse_p - lse_t);  out = w*out_p + (1-w)*out_t;  lse = logaddexp(lse_p, lse_t)

which equals dense attention with the full [n, S] mask, but never builds that mask, reads the prefix
with the plain flash kernel (split-K when B*K is small) and only touches an n x n mask.

Supported: head_dim in (64, 128); GQA with N % K == 0 (tested G = 1, 3, 4, 8); bf16 / f16 / f32; S >= 16;
prefix_len[b] + n <= S. prefix_len = 0 is allowed (the tree part alone).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from . import _common as C
from .flash_scores import default_block_sizes as flash_block_sizes
from .flash_scores import exact_block_sizes as flash_exact_block_sizes
from .flash_scores import flash_partials
from . import xla
from .sparse_attention import sparse_attention_kernel


def default_block_sizes(rows: int, head_dim: int, dtype) -> C.BlockSizes:
    """Block sizes of the prefix pass (the tree pass reuses block_m and num_warps, with block_k capped
    by the tree size): the non-causal flash defaults, 128-row blocks so that a 64-node tree with G=4
    re-reads the prefix twice rather than four times."""
    return flash_block_sizes(rows, head_dim, dtype, causal=False)


def _tree_kernel(layer_ref, prefix_len_ref, mask_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, n, G, sm_scale, block_k):
    """layer_ref, prefix_len_ref: [] int32; mask_ref: [n, n] int8; q_ref: [bm, H]; k_ref, v_ref: [L, S, H];
    outputs o_ref [bm, H] f32, lse_ref [bm]: attention over the n tree slots only."""
    block_m, head_dim = q_ref.shape
    layer, prefix_len = layer_ref[()], prefix_len_ref[()]
    t = (pl.program_id(2) * block_m + jnp.arange(block_m)) // G  # tree node of each packed row
    row_ok = t < n
    t_safe = jnp.minimum(t, n - 1)
    q = q_ref[...]
    scale2 = sm_scale * C.LOG2E

    def step(i, carry):
        j = i * block_k + jnp.arange(block_k)  # tree slot
        in_tree = j < n
        ok = jnp.broadcast_to(in_tree[:, None], (block_k, head_dim))
        rows = pl.ds(prefix_len + i * block_k, block_k)
        k = plgpu.load(k_ref.at[layer, rows, :], mask=ok, other=0.0)
        v = plgpu.load(v_ref.at[layer, rows, :], mask=ok, other=0.0)
        valid = row_ok[:, None] & in_tree[None, :]
        seen = plgpu.load(mask_ref.at[t_safe[:, None], jnp.minimum(j, n - 1)[None, :]], mask=valid, other=0)
        s = jnp.where(valid & (seen != 0), C.dot_nt(q, k) * scale2, -jnp.inf)
        return C.softmax_step(carry, s, v)

    carry = lax.fori_loop(0, C.cdiv(n, block_k), step, C.init_carry(block_m, head_dim))
    o, lse = C.finalize(carry)
    o_ref[...] = o
    lse_ref[...] = lse


def _tree_part(qp, k, v, prefix_len, tree_mask, *, n, G, sm_scale, block_m, block_k, bs, interpret, layer):
    B, K, Mp, H = qp.shape
    kernel = functools.partial(_tree_kernel, n=n, G=G, sm_scale=sm_scale, block_k=block_k)
    k, v, layer = C.as_stacked(k, v, layer)
    kv_spec = C.kv_block_spec(k)
    return pl.pallas_call(
        kernel,
        grid=(B, K, Mp // block_m),
        in_specs=[
            C.LAYER_SPEC,
            pl.BlockSpec((None,), lambda b, h, m: (b,)),
            pl.BlockSpec((None, n, n), lambda b, h, m: (b, 0, 0)),
            pl.BlockSpec((None, None, block_m, H), lambda b, h, m: (b, h, m, 0)),
            kv_spec,
            kv_spec,
        ],
        out_specs=[
            pl.BlockSpec((None, None, block_m, H), lambda b, h, m: (b, h, m, 0)),
            pl.BlockSpec((None, None, block_m), lambda b, h, m: (b, h, m)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((B, K, Mp, H), jnp.float32),
            jax.ShapeDtypeStruct((B, K, Mp), jnp.float32),
        ],
        compiler_params=bs.compiler_params(),
        interpret=interpret,
        name="tree_attention",
    )(layer, prefix_len, tree_mask.astype(jnp.int8), qp, k, v)


# ----------------------------------------------------------------------------------------------
# Exact mode: each node rounded as the one-token step at its position rounds (docs/kernels.md).

# Packed rows per program of the exact tree kernel: a 69-node tree at G=3 reads the prefix twice.
EXACT_TREE_ROWS = 128
# Below this many (batch, KV head, split) programs the exact tree kernel gives each sub-block its own program
# (the prefix is read once per sub-block, mostly from L2) instead of walking them one after another. H200, L=8K,
# 30 layers (probe on the stop-45 commit e6250fc, docs/performance.md): B=16 (432 programs), 15 nodes: 2.22 ms
# against 2.82 ms packed; 23 nodes (lookup 8): 2.99 against 4.06. B=64 (1,728), 6 nodes: 5.26 against 4.93.
EXACT_TREE_SPREAD = 1024


def _exact_tree_kernel(layer_ref, prefix_len_ref, tail_end_ref, depth_ref, anc_ref, q_ref, k_ref, v_ref, o_ref,
                       lse_ref, *, G, n, npb, n_sub, live, sm_scale, block_k, per_split):
    """One program: n_sub sub-blocks of packed rows (npb nodes of G rows each, then padding) of one KV head
    against one split of the keys, walked as a one-token flash step walks them.

    layer_ref, prefix_len_ref (the root's slot), tail_end_ref (prefix_len + the deepest node's depth + 1):
    [] int32; depth_ref [nP] int32 each packed node's depth (-1: padding); anc_ref [nP, n] int32, anc[u, d]
    = the tree slot of node u's ancestor at depth d; q_ref [bm, H]; k_ref, v_ref [L, S, H];
    outputs o_ref [bm, H], lse_ref [bm] of this split.

    Node u (depth d) sits at position p = prefix_len + d, and a one-token step there sees slots 0 .. p with
    key j in column j % block_k of tile j // block_k. Tiles below the root's tile hold prefix keys only,
    which every node sees: they are loaded once and run for every sub-block, as in the flash kernel. From
    the root's tile on, node u's keys are its own: column j holds slot j below the root and, from the root
    on, the K/V of u's ancestor at depth j - prefix_len (gathered), so every node sees its keys in the
    columns, tiles and order of its one-token step; the other rows of the sub-block are masked out of that
    update, which leaves their running max, sum and output bitwise unchanged. Only the first `live`
    sub-blocks hold nodes in every program (a one-program launch pads to a power of two): the others keep
    their initial carry and are sliced off after the launch.
    """
    block_m, head_dim = q_ref.shape
    sub = block_m // n_sub
    layer, base, tail_end = layer_ref[()], prefix_len_ref[()], tail_end_ref[()]
    m_blk, split = pl.program_id(2), pl.program_id(3)
    scale2 = sm_scale * C.LOG2E
    lo = split * per_split
    root_tile = base // block_k
    pre_hi = jnp.minimum(lo + per_split, root_tile)
    tail_lo, tail_hi = jnp.maximum(lo, root_tile), jnp.minimum(lo + per_split, pl.cdiv(tail_end, block_k))
    q_sub = [q_ref[pl.ds(i * sub, sub), :] for i in range(live)]
    node_of_row = jnp.where(jnp.arange(sub) < npb * G, jnp.arange(sub) // G, -1)   # node within the sub-block

    def prefix_step(i, carry):
        start = pl.multiple_of(i * block_k, block_k)
        k = k_ref[layer, pl.ds(start, block_k), :]
        v = v_ref[layer, pl.ds(start, block_k), :]
        return tuple(C.softmax_step(c, C.dot_nt(qi, k) * scale2, v) for c, qi in zip(carry, q_sub))

    def tail_step(i, carry):
        pos = i * block_k + jnp.arange(block_k)
        rel = pos - base                                                   # depth of a path column
        carry = list(carry)
        for sb in range(live):
            def node_step(j, c, sb=sb):
                u = (m_blk * n_sub + sb) * npb + j
                seen = (rel < 0) | (rel <= depth_ref[u])
                slot = jnp.where(rel < 0, pos, base + anc_ref[u, jnp.clip(rel, 0, n - 1)])
                slot = jnp.where(seen, slot, base)                          # hidden: the root (finite)
                k = k_ref[layer, slot, :]
                v = v_ref[layer, slot, :]
                s = C.dot_nt(q_sub[sb], k) * scale2
                s = jnp.where((node_of_row == j)[:, None] & seen[None, :], s, -jnp.inf)
                return C.softmax_step(c, s, v)
            carry[sb] = lax.fori_loop(0, npb, node_step, carry[sb])
        return tuple(carry)

    carry = tuple(C.init_carry(sub, head_dim) for _ in range(live))
    carry = lax.fori_loop(lo, pre_hi, prefix_step, carry)
    carry = lax.fori_loop(tail_lo, tail_hi, tail_step, carry)
    C.store_sub_blocks(carry + tuple(C.init_carry(sub, head_dim) for _ in range(n_sub - live)), o_ref, lse_ref)


def _exact_tree(q, k, v, prefix_len, tree_mask, *, K, G, sm_scale, block_sizes, interpret, layer,
                rows_per_program=None):
    """Exact-mode tree attention: the packing, the kernel launch and the split merge of a one-token step.
    rows_per_program: packed rows a program walks (default: by the grid's size, see EXACT_TREE_SPREAD); it does
    not change any row's bits."""
    B, n, N, H = q.shape
    S = C.layer_shape(k, layer)[1]
    bs, sub = flash_exact_block_sizes(G, G, H, q.dtype, block_sizes)   # the one-token step's schedule
    block_k = min(bs.block_k, C.prev_pow2(S))
    npb = max(1, sub // G)                       # whole nodes per sub-block (G > sub: one node, several)
    if G > sub:
        raise NotImplementedError(f"exact tree attention needs G={G} <= {sub} rows per sub-block")
    subs = C.cdiv(n, npb)
    splits, per_split = C.exact_split_plan(C.cdiv(S, block_k))
    if rows_per_program is None:
        rows_per_program = sub if B * K * splits < EXACT_TREE_SPREAD else EXACT_TREE_ROWS
    n_sub = min(C.next_pow2(subs), max(1, rows_per_program // sub))
    n_m = C.cdiv(subs, n_sub)
    live = subs if n_m == 1 else n_sub           # sub-blocks that hold nodes in every program
    nP = n_m * n_sub * npb                        # packed node slots
    block_m = n_sub * sub
    # Ancestors by depth from the ancestor-or-self mask: node j's depth is its row's count minus one, and a
    # node's ancestors have distinct depths, so sorting its row's ancestors by depth lists its path.
    depth = tree_mask.sum(axis=-1).astype(jnp.int32) - 1                                   # [B, n]
    key = jnp.where(tree_mask, depth[:, None, :], n)                                       # non-ancestors last
    anc = jnp.argsort(key, axis=-1, stable=True).astype(jnp.int32)                         # [B, n, n]
    anc = jnp.pad(anc, ((0, 0), (0, nP - n), (0, 0)))
    depth_p = jnp.pad(depth, ((0, 0), (0, nP - n)), constant_values=-1)
    tail_end = prefix_len + depth.max(axis=1) + 1
    # Pack: node u, head g -> row (u % npb) * G + g of sub-block u // npb.
    qp = q.reshape(B, n, K, G, H).transpose(0, 2, 1, 3, 4)
    qp = jnp.pad(qp, ((0, 0), (0, 0), (0, nP - n), (0, 0), (0, 0))).reshape(B, K, nP // npb, npb * G, H)
    qp = jnp.pad(qp, ((0, 0), (0, 0), (0, 0), (0, sub - npb * G), (0, 0))).reshape(B, K, n_m * block_m, H)
    out_dtype = jnp.float32 if splits > 1 else q.dtype
    kernel = functools.partial(_exact_tree_kernel, G=G, n=n, npb=npb, n_sub=n_sub, live=live, sm_scale=sm_scale,
                               block_k=block_k, per_split=per_split)
    k, v, layer = C.as_stacked(k, v, layer)
    kv_spec = C.kv_block_spec(k)
    scalar = pl.BlockSpec((None,), lambda b, h, m, s: (b,))
    o, lse = pl.pallas_call(
        kernel,
        grid=(B, K, n_m, splits),
        in_specs=[C.LAYER_SPEC, scalar, scalar,
                  pl.BlockSpec((None, nP), lambda b, h, m, s: (b, 0)),
                  pl.BlockSpec((None, nP, n), lambda b, h, m, s: (b, 0, 0)),
                  pl.BlockSpec((None, None, block_m, H), lambda b, h, m, s: (b, h, m, 0)),
                  kv_spec, kv_spec],
        out_specs=[pl.BlockSpec((None, None, None, block_m, H), lambda b, h, m, s: (s, b, h, m, 0)),
                   pl.BlockSpec((None, None, None, block_m), lambda b, h, m, s: (s, b, h, m))],
        out_shape=[jax.ShapeDtypeStruct((splits, B, K, n_m * block_m, H), out_dtype),
                   jax.ShapeDtypeStruct((splits, B, K, n_m * block_m), jnp.float32)],
        compiler_params=bs.compiler_params(),
        interpret=interpret,
        name="tree_attention_exact",
    )(layer, prefix_len, tail_end.astype(jnp.int32), depth_p, anc, qp, k, v)
    o, lse = C.combine_splits_exact(o, lse, out_dtype=q.dtype, interpret=interpret)
    # Unpack: [B, K, nP/npb, sub, ...] -> the first npb*G rows of each sub-block -> [B, n, N, H], [B, N, n].
    o = o.reshape(B, K, nP // npb, sub, H)[:, :, :, :npb * G].reshape(B, K, nP, G, H)[:, :, :n]
    lse = lse.reshape(B, K, nP // npb, sub)[:, :, :, :npb * G].reshape(B, K, nP, G)[:, :, :n]
    return o.transpose(0, 2, 1, 3, 4).reshape(B, n, N, H), lse.transpose(0, 1, 3, 2).reshape(B, N, n)


def _check_tree_args(q, k, v, tree_mask, sm_scale, interpret, layer):
    """The checks both tree kernels make -> (K, G, S, sm_scale): GQA shapes, the platform, an [B, n, n] mask,
    a cache of at least 16 slots, the default scale 1/sqrt(H)."""
    K, G = C.check_attention_shapes(q, k, v, layer)
    C.check_platform(interpret)
    B, n, _, H = q.shape
    S = C.layer_shape(k, layer)[1]
    if tree_mask.shape != (B, n, n):
        raise ValueError(f"{tree_mask.shape=} must be {(B, n, n)}")
    if S < 16:
        raise NotImplementedError(f"{S=} must be >= 16")
    return K, G, S, 1.0 / float(np.sqrt(H)) if sm_scale is None else float(sm_scale)


def _tree_pass(qp, k, v, prefix_len, tree_mask, *, n, G, S, sm_scale, bs, interpret, layer):
    """`_tree_part` over the n tree slots, qp packed with `C.row_block(n * G, bs.block_m)` rows per program, in
    key blocks that cover the tree (at least 16 slots, at most the cache)."""
    block_m = C.row_block(n * G, bs.block_m)
    block_k = min(bs.block_k, max(16, C.next_pow2(n)), C.prev_pow2(S))
    return _tree_part(qp, k, v, prefix_len, tree_mask, n=n, G=G, sm_scale=sm_scale, block_m=block_m,
                      block_k=block_k, bs=bs, interpret=interpret, layer=layer)


@functools.partial(jax.jit, static_argnames=("sm_scale", "block_sizes", "interpret", "exact"))
def tree_attention_kernel(q, k, v, prefix_len, tree_mask, *, sm_scale=None, block_sizes=None, interpret=False,
                          layer=None, exact=False):
    """Pallas implementation of `tree_attention` (same arguments)."""
    K, G, S, sm_scale = _check_tree_args(q, k, v, tree_mask, sm_scale, interpret, layer)
    B, n, N, H = q.shape
    prefix_len = prefix_len.astype(jnp.int32)
    if exact:
        return _exact_tree(q, k, v, prefix_len, tree_mask, K=K, G=G, sm_scale=sm_scale, block_sizes=block_sizes,
                           interpret=interpret, layer=layer)
    bs = block_sizes or default_block_sizes(n * G, H, q.dtype)
    qp = C.pack_queries(q, K, C.row_block(n * G, bs.block_m))
    # Prefix: the flash kernel, non-causal, with kv_len := prefix_len (so tree slots are never read).
    o_p, lse_p = flash_partials(qp, k, v, prefix_len, T=n, G=G, causal=False, sm_scale=sm_scale,
                                block_sizes=bs, interpret=interpret, out_dtype=jnp.float32, layer=layer)
    o_p, lse_p = C.combine_splits(o_p, lse_p)
    o_t, lse_t = _tree_pass(qp, k, v, prefix_len, tree_mask, n=n, G=G, S=S, sm_scale=sm_scale, bs=bs,
                            interpret=interpret, layer=layer)
    o, lse = C.merge_partials(o_p, lse_p, o_t, lse_t)
    return C.unpack_out(o, n, N).astype(q.dtype), C.unpack_lse(lse, n, N)


def tree_attention(q, k, v, prefix_len, tree_mask, *, sm_scale=None, block_sizes=None, interpret=False,
                   layer=None, exact=False, implementation=None):
    """Attention of n tree-draft tokens over a shared prefix plus their tree (ancestor) mask.

    Args:
      q: [B,n,N,H] queries of the n tree tokens.
      k, v: [B,S,K,H] one layer's cache (or the stacked [L,B,S,K,H] cache with a `layer` index); the
        tree tokens' keys/values are at prefix_len[b] + i, i < n.
      prefix_len: int32[B] number of committed prefix positions.
      tree_mask: bool[B,n,n], tree_mask[b,i,j] iff node j is node i or one of its ancestors.
      sm_scale, block_sizes, interpret, layer, implementation: as in `flash_scores`.
      exact: exact mode: node t at depth d is rounded exactly as `flash_scores(exact=True)` rounds a
        one-token step at position prefix_len + d whose cache holds t's ancestors at slots prefix_len ..
        prefix_len + d (the slots compaction moves an accepted path to). Needs tree_mask to be an
        ancestor-or-self mask whose nodes sit at depth = (ancestors - 1), as model.Tree lays them out.
    Returns:
      out [B,n,N,H] q.dtype, lse [B,N,n] f32 (natural log).
    """
    return C.dispatch(implementation, tree_attention_kernel, xla.tree_attention, q, k, v, prefix_len,
                      tree_mask, sm_scale=sm_scale, block_sizes=block_sizes, interpret=interpret, layer=layer,
                      exact=exact)


@functools.partial(jax.jit, static_argnames=("sm_scale", "block_sizes", "interpret"))
def sparse_tree_attention_kernel(q, k, v, idx, n_valid, prefix_len, tree_mask, *, sm_scale=None, block_sizes=None,
                                 interpret=False, layer=None):
    """Pallas implementation of `sparse_tree_attention` (same arguments): the sparse kernel over the selected
    prefix entries (no tail, float32 partial), the tree pass over the n tree slots, merged through their LSEs."""
    K, G, S, sm_scale = _check_tree_args(q, k, v, tree_mask, sm_scale, interpret, layer)
    B, n, N, H = q.shape
    prefix_len = prefix_len.astype(jnp.int32)
    o_p, lse_p = sparse_attention_kernel(q, k, v, idx, n_valid, prefix_len + n, tail=False, sm_scale=sm_scale,
                                         interpret=interpret, layer=layer, out_f32=True)
    bs = block_sizes or default_block_sizes(n * G, H, q.dtype)
    qp = C.pack_queries(q, K, C.row_block(n * G, bs.block_m))
    o_t, lse_t = _tree_pass(qp, k, v, prefix_len, tree_mask, n=n, G=G, S=S, sm_scale=sm_scale, bs=bs,
                            interpret=interpret, layer=layer)
    o_t, lse_t = C.unpack_out(o_t, n, N), C.unpack_lse(lse_t, n, N)          # [B, n, N, H], [B, N, n]
    # An empty selection (n_valid = 0) gives lse -inf and weight 0; its (finite) output is zeroed anyway.
    o_p = jnp.where(jnp.isfinite(lse_p).transpose(0, 2, 1)[..., None], o_p, 0.0)
    o, lse = C.merge_partials(o_p, lse_p.transpose(0, 2, 1), o_t, lse_t.transpose(0, 2, 1))
    return o.astype(q.dtype), lse.transpose(0, 2, 1)


def sparse_tree_attention(q, k, v, idx, n_valid, prefix_len, tree_mask, *, sm_scale=None, block_sizes=None,
                          interpret=False, layer=None, implementation=None):
    """Attention of n tree-draft tokens over selected prefix positions plus their tree (ancestor) mask: Dustin's
    sparse verification of a draft tree (`sparse_attention`'s selection, `tree_attention`'s tree part).

    Args:
      q: [B,n,N,H] queries of the n tree tokens.
      k, v: [B,S,K,H] one layer's cache, or the stacked [L,B,S,K,H] cache with a `layer` index; the tree tokens'
        keys/values are at prefix_len[b] + i, i < n.
      idx: int32[B,M] selected prefix positions, each < prefix_len[b], distinct; entries past n_valid are junk.
        Or, with the stacked cache, every layer's int32[L,B,M] (and n_valid int32[L,B]).
      n_valid: int32[B] real entries per sequence.
      prefix_len: int32[B] committed prefix positions; tree_mask: bool[B,n,n] ancestor-or-self.
      sm_scale, block_sizes (the tree pass's), interpret, layer, implementation: as in `tree_attention`.
    Returns:
      out [B,n,N,H] q.dtype, lse [B,N,n] f32 (natural log).
    """
    return C.dispatch(implementation, sparse_tree_attention_kernel, xla.sparse_tree_attention, q, k, v, idx,
                      n_valid, prefix_len, tree_mask, sm_scale=sm_scale, block_sizes=block_sizes,
                      interpret=interpret, layer=layer)
