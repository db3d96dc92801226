"""Tree verification attention in one flash pass (DESIGN.md section 3.3, LongSpec's hybrid tree attention).

The n tree tokens' keys/values already sit in the cache at prefix_len[b] + i. Query i sees every prefix
position < prefix_len[b] and tree slot j iff tree_mask[b, i, j] (diagonal included). The flash kernel runs
over kv_len = prefix_len + n keys: the prefix's key blocks unmasked (every row sees the same keys), and only
the block(s) holding the tree slots apply the tree mask, passed as each row's mask bits in 32-bit words
(`flash_partials(..., tree_mask=)`, `flash_scores.tree_bits`). Split-K partials merge through their LSEs as
for any decode, so the result equals dense attention under the full [n, S] mask without ever building it.
(Two kernels before, prefix and tree merged by `merge_partials`: one pass saves a launch and the merge per
layer. A first one-pass version gathered the [n, n] mask inside the key loop and ran 3x slower on the H200.)

Supported: head_dim in (64, 128); GQA with N % K == 0 (tested G = 1, 3, 4, 8); bf16 / f16 / f32; S >= 16;
prefix_len[b] + n <= S. prefix_len = 0 is allowed (the tree part alone).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import _common as C
from .flash_scores import default_block_sizes as flash_block_sizes
from .flash_scores import flash_partials
from .reference import tree_attention_reference


def default_block_sizes(rows: int, head_dim: int, dtype) -> C.BlockSizes:
    """The non-causal flash defaults: 128-row blocks so that a 64-node tree with G=4 re-reads the prefix
    twice rather than four times."""
    return flash_block_sizes(rows, head_dim, dtype, causal=False)


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

    # One flash pass over prefix + tree slots (kv_len = prefix_len + n): unmasked key blocks for the prefix,
    # the tree mask applied in the last block(s) only; split-K partials merge through their LSEs as usual.
    o, lse = flash_partials(qp, k, v, prefix_len + n, T=n, G=G, causal=False, sm_scale=sm_scale, block_sizes=bs,
                            interpret=interpret, out_dtype=jnp.float32, layer=layer, tree_mask=tree_mask)
    o, lse = C.combine_splits(o, lse)
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
