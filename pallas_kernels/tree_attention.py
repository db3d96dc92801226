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
from .flash_scores import flash_partials
from .reference import sparse_tree_attention_reference, tree_attention_reference
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


@functools.partial(jax.jit, static_argnames=("sm_scale", "block_sizes", "interpret"))
def tree_attention_kernel(q, k, v, prefix_len, tree_mask, *, sm_scale=None, block_sizes=None, interpret=False,
                          layer=None):
    """Pallas implementation of `tree_attention` (same arguments)."""
    K, G = C.check_attention_shapes(q, k, v, layer)
    C.check_platform(interpret)
    B, n, N, H = q.shape
    S = C.layer_shape(k, layer)[1]
    if tree_mask.shape != (B, n, n):
        raise ValueError(f"{tree_mask.shape=} must be {(B, n, n)}")
    if S < 16:
        raise NotImplementedError(f"{S=} must be >= 16")
    sm_scale = 1.0 / float(np.sqrt(H)) if sm_scale is None else float(sm_scale)
    bs = block_sizes or default_block_sizes(n * G, H, q.dtype)
    block_m = C.row_block(n * G, bs.block_m)
    qp = C.pack_queries(q, K, block_m)
    prefix_len = prefix_len.astype(jnp.int32)

    # Prefix: the flash kernel, non-causal, with kv_len := prefix_len (so tree slots are never read).
    o_p, lse_p = flash_partials(qp, k, v, prefix_len, T=n, G=G, causal=False, sm_scale=sm_scale,
                                block_sizes=bs, interpret=interpret, out_dtype=jnp.float32, layer=layer)
    o_p, lse_p = C.combine_splits(o_p, lse_p)
    block_k = min(bs.block_k, max(16, C.next_pow2(n)), C.prev_pow2(S))
    o_t, lse_t = _tree_part(qp, k, v, prefix_len, tree_mask, n=n, G=G, sm_scale=sm_scale, block_m=block_m,
                            block_k=block_k, bs=bs, interpret=interpret, layer=layer)
    o, lse = C.merge_partials(o_p, lse_p, o_t, lse_t)
    return C.unpack_out(o, n, N).astype(q.dtype), C.unpack_lse(lse, n, N)


def tree_attention(q, k, v, prefix_len, tree_mask, *, sm_scale=None, block_sizes=None, interpret=False,
                   layer=None, implementation=None):
    """Attention of n tree-draft tokens over a shared prefix plus their tree (ancestor) mask.

    Args:
      q: [B,n,N,H] queries of the n tree tokens.
      k, v: [B,S,K,H] one layer's cache (or the stacked [L,B,S,K,H] cache with a `layer` index); the
        tree tokens' keys/values are at prefix_len[b] + i, i < n.
      prefix_len: int32[B] number of committed prefix positions.
      tree_mask: bool[B,n,n], tree_mask[b,i,j] iff node j is node i or one of its ancestors.
      sm_scale, block_sizes, interpret, layer, implementation: as in `flash_scores`.
    Returns:
      out [B,n,N,H] q.dtype, lse [B,N,n] f32 (natural log).
    """
    return C.dispatch(implementation, tree_attention_kernel, tree_attention_reference, q, k, v, prefix_len,
                      tree_mask, sm_scale=sm_scale, block_sizes=block_sizes, interpret=interpret, layer=layer)


@functools.partial(jax.jit, static_argnames=("sm_scale", "block_sizes", "interpret"))
def sparse_tree_attention_kernel(q, k, v, idx, n_valid, prefix_len, tree_mask, *, sm_scale=None, block_sizes=None,
                                 interpret=False, layer=None):
    """Pallas implementation of `sparse_tree_attention` (same arguments): the sparse kernel over the selected
    prefix entries (no tail, float32 partial), the tree pass over the n tree slots, merged through their LSEs."""
    K, G = C.check_attention_shapes(q, k, v, layer)
    C.check_platform(interpret)
    B, n, N, H = q.shape
    S = C.layer_shape(k, layer)[1]
    if tree_mask.shape != (B, n, n):
        raise ValueError(f"{tree_mask.shape=} must be {(B, n, n)}")
    if S < 16:
        raise NotImplementedError(f"{S=} must be >= 16")
    sm_scale = 1.0 / float(np.sqrt(H)) if sm_scale is None else float(sm_scale)
    prefix_len = prefix_len.astype(jnp.int32)
    o_p, lse_p = sparse_attention_kernel(q, k, v, idx, n_valid, prefix_len + n, tail=False, sm_scale=sm_scale,
                                         interpret=interpret, layer=layer, out_f32=True)
    bs = block_sizes or default_block_sizes(n * G, H, q.dtype)
    block_m = C.row_block(n * G, bs.block_m)
    qp = C.pack_queries(q, K, block_m)
    block_k = min(bs.block_k, max(16, C.next_pow2(n)), C.prev_pow2(S))
    o_t, lse_t = _tree_part(qp, k, v, prefix_len, tree_mask, n=n, G=G, sm_scale=sm_scale, block_m=block_m,
                            block_k=block_k, bs=bs, interpret=interpret, layer=layer)
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
    return C.dispatch(implementation, sparse_tree_attention_kernel, sparse_tree_attention_reference, q, k, v, idx,
                      n_valid, prefix_len, tree_mask, sm_scale=sm_scale, block_sizes=block_sizes,
                      interpret=interpret, layer=layer)
