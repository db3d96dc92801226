"""Attention over the fixed-capacity cache: one entry point per use (`full`, `sparse`, `sparse_scores`), each
going through the kernels' one dispatcher (`pallas_kernels`: the Pallas kernel where it runs, else the
production XLA path of pallas_kernels/xla.py, which is also what runs on CPU). What is jspec's here: how a
model asks for attention (`AttnImpl`, and `Read`: what one layer's queries read, for `attend`) and tensor
parallelism around the ops (`_per_shard`).

Convention shared with the kernels: the T query tokens of a call have already been written into the cache
at slots `kv_len - T .. kv_len - 1` (bottom-right aligned), so query t of row b sees key j iff
`j <= kv_len[b] - T + t` (chain) or, for a tree, `j < kv_len[b] - T` plus the tree slots its mask allows.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import pallas_kernels as pk
from jspec.sharding import tp_axis

# Exact mode covers steps of at most this many tokens per sequence: decode, chain and tree verification.
# Longer steps (prefills) keep the default path; a static batch's prefill is one and the same call for
# every method, and exact attention's fixed split-K plan would hold [splits, T*G, H] partials per head there.
EXACT_MAX_TOKENS = 128


@dataclasses.dataclass(frozen=True)
class AttnImpl:
    """How attention runs. `backend`: the ops' `implementation` (pallas_kernels): None = the Pallas kernel where
    it runs, else the XLA path; "xla"; "pallas" (NotImplementedError where the kernel cannot run).

    `mesh`: the tensor-parallel mesh when params and cache are head-sharded (jspec/sharding.py). The Pallas
    kernels are custom calls XLA cannot partition, so the ops then run per shard under `shard_map` (queries
    split over N, the cache over K, each device its own heads), the XLA fallback included.

    `exact` (bf16 exact mode, `--exact`): every step of at most EXACT_MAX_TOKENS tokens per sequence that
    the target runs for keeps (an `ar` step, a chain or tree verification) rounds each of its rows exactly as
    a one-token step at that row's position would: the dense part runs on the fused kernels of
    pallas_kernels/dense.py (fixed tiles), attention on `flash_scores(exact=True)` / `tree_attention(exact=True)`
    (the one-token step's key tiles and MMA tile, split-K over fixed key ranges whatever the cache's capacity,
    a fixed split merge; a tree node sees its ancestors
    in the columns that one-token step has them in). The aim: a speculative method's greedy output equals
    `ar`'s (run with the same impl) bit for bit, whatever gamma, lookup tokens or tree shape; shown on the CPU
    in interpret mode and on an H100 (docs/methods.md, "Lossless"). Draft steps keep the default path
    (`for_drafts`): their rounding only changes what is proposed.
    Needs the Pallas kernels (a GPU, or interpret=True) and a model the dense kernels tile (Llama, Qwen2 or
    Qwen3 layers with contraction <= 2048: `layers.exact_supported`); elsewhere the steps
    fall back to the default path and are not exact. The final norm and LM head run on the dense kernel too
    (f32 logits) where it tiles the head (`layers.exact_supported` requires it).
    """

    backend: Optional[str] = None
    interpret: bool = False
    mesh: Optional[Mesh] = None
    # Steps of at most this many tokens (B*T) run each layer's dense part as fused Pallas launches
    # (pallas_kernels/dense.py) when the attention kernels are in use; 0 (default) keeps XLA's GEMMs. Opt-in
    # because they are slower than cuBLAS in whole loops (docs/performance.md). Their rounding does not depend
    # on the step's row count; `exact` uses them for every step it covers, whatever dense_rows says.
    dense_rows: int = 0
    exact: bool = False

    def __post_init__(self):
        if self.backend not in (None, "xla", "pallas"):
            raise ValueError(f"unknown attention backend {self.backend!r}; use None, 'xla' or 'pallas'")
        if self.exact and self.backend == "xla":
            raise ValueError("exact mode needs the Pallas kernels; backend='xla' cannot be exact")

    def for_step(self, T: int) -> "AttnImpl":
        """The impl a step of T tokens per sequence runs with: exact only up to EXACT_MAX_TOKENS."""
        return dataclasses.replace(self, exact=False) if self.exact and T > EXACT_MAX_TOKENS else self

    def for_drafts(self) -> "AttnImpl":
        """The impl of draft steps: the default path (a draft's rounding changes what is proposed, never what
        is emitted, since every emitted token comes from a target step)."""
        return dataclasses.replace(self, exact=False) if self.exact else self


class Read(NamedTuple):
    """One layer's attention input: what the T new queries of a step read (`attend`).

    The whole cache (causal) by default; `tree_mask` makes the T new tokens a tree (tree verification);
    `idx` / `n_valid` restrict the prefix to a selection (sparse drafting and verification); `score_rows`
    also returns the per-position scores of those query rows (Collect-2-Query). Any combination.
    """

    kv_len: jax.Array                    # int32[B]: valid entries including the T new ones
    tree_mask: Optional[jax.Array] = None  # bool[B, T, T]
    idx: Optional[jax.Array] = None        # int32[B, M] (or [L, B, M]: every layer's) selected positions
    n_valid: Optional[jax.Array] = None    # int32[B] (or [L, B])
    score_rows: tuple = ()               # static query rows
    score_mode: str = "weights"          # "weights" | "logits" (see `full`)

    def select(self, idx, n_valid) -> "Read":
        """This read restricted to the selection idx[b, :n_valid[b]] (+ the T new tokens)."""
        return self._replace(idx=idx, n_valid=n_valid)


def attend(q, k_all, v_all, layer: int, read: Read, impl: AttnImpl = AttnImpl()):
    """Attention of the queries q [B, T, N, H] over layer `layer` of the stacked cache [L, B, S, K, H] (the T new
    entries already written), as `read` describes: `full` or `sparse` (+ `sparse_scores`).

    Returns:
      out [B, T, N, H], scores f32[B, S] summed over heads and read.score_rows (None without score rows; under a
      selection 0 at the slots not read).
    """
    if read.idx is None:
        return full(q, k_all, v_all, layer, read.kv_len, tree_mask=read.tree_mask, score_rows=read.score_rows,
                    score_mode=read.score_mode, impl=impl)
    o = sparse(q, k_all, v_all, layer, read.kv_len, read.idx, read.n_valid, tree_mask=read.tree_mask, impl=impl)
    if not read.score_rows:
        return o, None
    return o, sparse_scores(q, k_all, layer, read.kv_len, read.idx, read.n_valid, score_rows=read.score_rows,
                            score_mode=read.score_mode, tree_mask=read.tree_mask)


def _per_shard(impl: AttnImpl, op, q, k_all, v_all, *replicated, scores: bool = False):
    """op(q, k_all, v_all, *replicated) on each tensor-parallel shard of the heads (or directly, no mesh).

    q [B, T, N, H] is split over N and the stacked cache [L, B, S, K, H] over K, so every device attends
    with its own N/tp query heads over its own K/tp KV heads (GQA groups stay whole: head n reads KV head
    n // G). `replicated` arguments (lengths, indices, masks) go to every shard whole. With `scores`, the
    op returns (out, scores f32[B, S]) and the per-shard scores, sums over that shard's heads, are
    summed over tp.
    """
    if impl.mesh is None:
        return op(q, k_all, v_all, *replicated)
    tp = tp_axis(impl.mesh)
    heads, kv = P(None, None, tp, None), P(None, None, None, tp, None)

    def body(*args):
        res = op(*args)
        if scores:
            return res[0], jax.lax.psum(res[1], tp)
        return res

    # check_vma=False: pallas_call does not declare how its outputs vary over the mesh axes.
    return jax.shard_map(body, mesh=impl.mesh, in_specs=(heads, kv, kv) + (P(),) * len(replicated),
                         out_specs=(heads, P()) if scores else heads, check_vma=False)(q, k_all, v_all, *replicated)


def full(q, k_all, v_all, layer: int, kv_len, *, tree_mask=None, score_rows=(), score_mode="weights",
         impl=AttnImpl()):
    """Causal (or tree-masked) attention of T new queries over one layer's cache.

    Args:
      q: [B, T, N, H] queries (RoPE applied).
      k_all, v_all: [L, B, S, K, H] the stacked cache, the T new entries already written.
      layer: static layer index (the ops read that layer in place).
      kv_len: int32[B] valid entries including the T new ones.
      tree_mask: optional bool[B, T, T]; query i sees tree slot j iff tree_mask[b, i, j].
      score_rows: static tuple of query rows whose per-key scores are returned (Collect-2-Query).
      score_mode: "weights" (softmax weights exp(s - lse)) or "logits" (raw scale * q.k).
    Returns:
      out [B, T, N, H] (q.dtype), scores f32[B, S] summed over heads and score_rows (None if no rows).
    """
    kw = dict(implementation=impl.backend, interpret=impl.interpret, layer=layer, exact=impl.exact)
    score_rows = tuple(score_rows)
    if tree_mask is None:
        def flash(q, k_all, v_all, kv_len):
            out, _, scores = pk.flash_scores(q, k_all, v_all, kv_len, score_rows=score_rows, score_mode=score_mode,
                                             **kw)
            return (out, scores) if score_rows else out
        res = _per_shard(impl, flash, q, k_all, v_all, kv_len, scores=bool(score_rows))
        return res if score_rows else (res, None)
    prefix_len = kv_len - q.shape[1]
    if score_rows:   # a tree verification that collects scores: no kernel emits them, so XLA's alone
        if impl.backend == "pallas":
            raise NotImplementedError("tree_attention does not emit scores")

        def tree_scores(q, k_all, v_all, prefix_len, tree_mask):
            out, _, scores = pk.xla.tree_attention_scores(q, k_all, v_all, prefix_len, tree_mask, score_rows=score_rows,
                                                          score_mode=score_mode, layer=layer)
            return out, scores
        return _per_shard(impl, tree_scores, q, k_all, v_all, prefix_len, tree_mask, scores=True)

    def tree(q, k_all, v_all, prefix_len, tree_mask):
        return pk.tree_attention(q, k_all, v_all, prefix_len, tree_mask, **kw)[0]
    return _per_shard(impl, tree, q, k_all, v_all, prefix_len, tree_mask), None


def sparse(q, k_all, v_all, layer: int, kv_len, idx, n_valid, *, tree_mask=None, impl=AttnImpl()):
    """Attention of T new queries over the gathered entries idx[b, :n_valid[b]] plus the T newest tokens.

    Args:
      q: [B, T, N, H]; k_all, v_all: [L, B, S, K, H]; layer: static layer index;
      kv_len: int32[B] (including the T new entries);
      idx: int32[B, M] selected cache positions (all < kv_len - T); n_valid: int32[B]. Or every layer's
        selections, idx int32[L, B, M] and n_valid int32[L, B]: the op reads row `layer` itself.
      tree_mask: optional bool[B, T, T]: the T new tokens are a draft tree (Dustin's sparse tree
        verification): token t sees new token u iff tree_mask[b, t, u]; default causal (u <= t).
    Returns:
      out [B, T, N, H].
    """
    kw = dict(implementation=impl.backend, interpret=impl.interpret, layer=layer)
    if tree_mask is None:
        def gathered(q, k_all, v_all, idx, n_valid, kv_len):
            return pk.sparse_attention(q, k_all, v_all, idx, n_valid, kv_len, **kw)[0]
        return _per_shard(impl, gathered, q, k_all, v_all, idx, n_valid, kv_len)

    def gathered_tree(q, k_all, v_all, idx, n_valid, prefix_len, tree_mask):
        return pk.sparse_tree_attention(q, k_all, v_all, idx, n_valid, prefix_len, tree_mask, **kw)[0]
    return _per_shard(impl, gathered_tree, q, k_all, v_all, idx, n_valid, kv_len - q.shape[1], tree_mask)


def sparse_scores(q, k_all, layer: int, kv_len, idx, n_valid, *, score_rows, score_mode="weights", tree_mask=None):
    """`full`'s per-position scores for a sparse attention (Vegas' selection under Dustin's sparse verification):
    the rows' attention over the entries `sparse` read, summed over heads and rows, 0 at every slot not read.

    Always XLA (`pallas_kernels.xla.sparse_scores`: a second gather of the selected keys; the kernels emit no
    scores), partitioned by XLA under a mesh.
    Args: as `sparse`'s; score_rows: static tuple of query rows.
    Returns:
      f32[B, S].
    """
    return pk.xla.sparse_scores(q, k_all, idx, n_valid, kv_len, score_rows=score_rows, score_mode=score_mode,
                                tree_mask=tree_mask, layer=layer)
