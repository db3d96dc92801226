"""Pallas GPU (Triton lowering) attention kernels for long-context speculative decoding.

Four ops, each as `op` (the dispatcher: the one way in), `op_kernel` (Pallas), `xla.op` (the production XLA
path, pallas_kernels/xla.py) and `op_reference` (pure-jnp f32, for tests), all with the same arguments:

    flash_scores(q, k, v, kv_len, *, score_rows=(), score_mode="weights")  -> out, lse, scores | None
    sparse_attention(q, k, v, idx, n_valid, kv_len, *, tail=True)         -> out, lse
    tree_attention(q, k, v, prefix_len, tree_mask)                        -> out, lse
    sparse_tree_attention(q, k, v, idx, n_valid, prefix_len, tree_mask)   -> out, lse   (a tree over selected
                                                                             prefix entries: Dustin)

and one selection op, Vegas' per-row top-k by threshold search instead of a sort (pallas_kernels/topk_select.py):

    topk_select(scores, limit, k, *, slots)                                -> idx (ascending positions), n

Dustin's own kernel (head_weights.py: the A_T probe) is called by jspec.dustin directly, with its XLA version
as the fallback and the reference.

Layouts: q [B,T,N,H]; k, v [B,S,K,H] (one layer of the cache, bf16 or f32); GQA with G = N/K query heads
per KV head (query head n reads KV head n // G); lse [B,N,T] float32 in natural log (JAX's own flash
residual is base 2). Supported everywhere: head_dim 64 or 128, any N % K == 0 (tested G = 1..8). Every
op also takes `layer=`: k, v are then the stacked [L,B,S,K,H] cache and the kernel reads that layer in
place instead of receiving a k_all[layer] copy. The layer is a runtime operand (an int or a traced int32
scalar), so the L layers of a model share one compiled kernel.

`implementation`: "pallas" runs the kernel (NotImplementedError when unsupported, e.g. on a CPU backend
without interpret=True), "xla" the XLA path of xla.py (bf16 inputs, float32 accumulation, long prefills in
chunks of query rows: what a model runs where the kernels cannot), None (default) the kernel with fallback to
the XLA path, so the library runs on every backend. The f32 references are never dispatched to: tests and
benchmarks call them by name. (topk_select and dense.dense fall back to their references, which are XLA code.)
"""
from ._common import SUPPORTED_HEAD_DIMS, BlockSizes, merge_partials
from .flash_scores import flash_scores, flash_scores_kernel
from .reference import (
    flash_scores_reference,
    masked_attention_reference,
    sparse_attention_reference,
    sparse_tree_attention_reference,
    tree_attention_reference,
    tree_full_mask,
)
from .sparse_attention import sparse_attention, sparse_attention_kernel
from .topk_select import topk_select, topk_select_kernel, topk_select_reference
from .tree_attention import sparse_tree_attention, sparse_tree_attention_kernel, tree_attention, tree_attention_kernel
from . import xla

IMPLEMENTATIONS = ("pallas", "xla")

__all__ = [
    "BlockSizes",
    "IMPLEMENTATIONS",
    "SUPPORTED_HEAD_DIMS",
    "flash_scores",
    "flash_scores_kernel",
    "flash_scores_reference",
    "masked_attention_reference",
    "merge_partials",
    "sparse_attention",
    "sparse_attention_kernel",
    "sparse_attention_reference",
    "sparse_tree_attention",
    "sparse_tree_attention_kernel",
    "sparse_tree_attention_reference",
    "topk_select",
    "topk_select_kernel",
    "topk_select_reference",
    "tree_attention",
    "tree_attention_kernel",
    "tree_attention_reference",
    "tree_full_mask",
    "xla",
]
