"""Attention over the fixed-capacity cache: one entry point per use, each dispatching to a Pallas kernel
(`pallas_kernels/`) or to the pure-XLA path here, which is also what runs on CPU.

Convention shared with the kernels: the T query tokens of a call have already been written into the cache
at slots `kv_len - T .. kv_len - 1` (bottom-right aligned), so query t of row b sees key j iff
`j <= kv_len[b] - T + t` (chain) or, for a tree, `j < kv_len[b] - T` plus the tree slots its mask allows.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jspec.sharding import tp_axis

# Largest f32 logits tensor [B, K, G, Tc, S] the XLA path materialises at once; longer queries (prefill)
# are processed in chunks of Tc rows so memory stays bounded at any prompt length.
_XLA_LOGITS_BUDGET = 1 << 30
# Exact mode covers steps of at most this many tokens per sequence: decode, chain and tree verification.
# Longer steps (prefills) keep the default path; a static batch's prefill is one and the same call for
# every method, and exact attention's fixed split-K plan would hold [splits, T*G, H] partials per head there.
EXACT_MAX_TOKENS = 128


def _kernel_module(name: str):
    """pallas_kernels.<name> as a module (the package re-exports same-named functions over them)."""
    import importlib
    return importlib.import_module(f"pallas_kernels.{name}")


@dataclasses.dataclass(frozen=True)
class AttnImpl:
    """How attention runs. `backend`: None = Pallas when available, else XLA; "xla"; "pallas".

    `mesh`: the tensor-parallel mesh when params and cache are head-sharded (jspec/sharding.py). The Pallas
    kernels are custom calls XLA cannot partition, so they then run per shard under `shard_map` (queries
    split over N, the cache over K, each device its own heads); the XLA path needs no hint.

    `exact` (bf16 exact mode, `--exact`): every step of at most EXACT_MAX_TOKENS tokens per sequence that
    the target runs for keeps (an `ar` step, a chain or tree verification) rounds each of its rows exactly as
    a one-token step at that row's position would: the dense part runs on the fused kernels of
    pallas_kernels/dense.py (fixed tiles), attention on `flash_scores(exact=True)` / `tree_attention(exact=True)`
    (the one-token step's key tiles, MMA tile, split-K plan and split merge; a tree node sees its ancestors
    in the columns that one-token step has them in). So a speculative method's greedy output equals `ar`'s
    (run with the same impl) bit for bit, whatever gamma, lookup tokens or tree shape (docs/methods.md,
    "Lossless"). Draft steps keep the default path (`for_drafts`): their rounding only changes what is proposed.
    Needs the Pallas kernels (a GPU, or interpret=True) and a model the dense kernels tile (Llama-style
    layers, no q/k/v bias or q/k norm, contraction <= 2048: `model.exact_supported`); elsewhere the steps
    fall back to the default path and are not exact. The final norm and LM head stay XLA's (f32 logits).
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


def _per_shard(impl: AttnImpl, kernel, q, k_all, v_all, *replicated, scores: bool = False):
    """kernel(q, k_all, v_all, *replicated) on each tensor-parallel shard of the heads (or directly, no mesh).

    q [B, T, N, H] is split over N and the stacked cache [L, B, S, K, H] over K, so every device attends
    with its own N/tp query heads over its own K/tp KV heads (GQA groups stay whole: head n reads KV head
    n // G). `replicated` arguments (lengths, indices, masks) go to every shard whole. With `scores`, the
    kernel returns (out, scores f32[B, S]) and the per-shard scores, sums over that shard's heads, are
    summed over tp.
    """
    if impl.mesh is None:
        return kernel(q, k_all, v_all, *replicated)
    tp = tp_axis(impl.mesh)
    heads, kv = P(None, None, tp, None), P(None, None, None, tp, None)

    def body(*args):
        res = kernel(*args)
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
      layer: static layer index (kernels read that layer in place).
      kv_len: int32[B] valid entries including the T new ones.
      tree_mask: optional bool[B, T, T]; query i sees tree slot j iff tree_mask[b, i, j].
      score_rows: static tuple of query rows whose per-key scores are returned (Collect-2-Query).
      score_mode: "weights" (softmax weights exp(s - lse)) or "logits" (raw scale * q.k).
    Returns:
      out [B, T, N, H] (q.dtype), scores f32[B, S] summed over heads and score_rows (None if no rows).
    """
    if impl.backend != "xla":
        try:  # kernels read layer `layer` of the stacked cache in place (no per-layer copy)
            if tree_mask is None:
                def flash(q, k_all, v_all, kv_len):
                    out, _, scores = _kernel_module("flash_scores").flash_scores_kernel(
                        q, k_all, v_all, kv_len, score_rows=tuple(score_rows), score_mode=score_mode,
                        interpret=impl.interpret, layer=layer, exact=impl.exact)
                    return (out, scores) if score_rows else out
                res = _per_shard(impl, flash, q, k_all, v_all, kv_len, scores=bool(score_rows))
                return res if score_rows else (res, None)
            if score_rows:
                raise NotImplementedError("tree_attention does not emit scores")

            def tree(q, k_all, v_all, prefix_len, tree_mask):
                return _kernel_module("tree_attention").tree_attention_kernel(
                    q, k_all, v_all, prefix_len, tree_mask, interpret=impl.interpret, layer=layer,
                    exact=impl.exact)[0]
            return _per_shard(impl, tree, q, k_all, v_all, kv_len - q.shape[1], tree_mask), None
        except NotImplementedError:
            if impl.backend == "pallas":
                raise
    k, v = k_all[layer], v_all[layer]
    return _full_xla(q, k, v, kv_len, tree_mask, score_rows, score_mode)


def _full_xla(q, k, v, kv_len, tree_mask, score_rows, score_mode):
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    chunk = max(1, min(T, _XLA_LOGITS_BUDGET // (4 * B * N * S)))
    if score_rows or tree_mask is not None or chunk >= T:
        out, scores = _attend_chunk(q, k, v, kv_len, jnp.int32(0), T, tree_mask, score_rows, score_mode)
        return out, scores
    # Prefill: bounded memory by mapping over query chunks (padding T up to a multiple of the chunk).
    n_chunks = -(-T // chunk)
    qp = jnp.pad(q, ((0, 0), (0, n_chunks * chunk - T), (0, 0), (0, 0)))
    qc = qp.reshape(B, n_chunks, chunk, N, H).swapaxes(0, 1)

    def one(args):
        qi, start = args
        return _attend_chunk(qi, k, v, kv_len, start, T, None, (), score_mode)[0]

    outs = jax.lax.map(one, (qc, jnp.arange(n_chunks, dtype=jnp.int32) * chunk))
    return outs.swapaxes(0, 1).reshape(B, n_chunks * chunk, N, H)[:, :T], None


def _attend_chunk(q, k, v, kv_len, start, T_total, tree_mask, score_rows, score_mode):
    """Rows start .. start+Tc-1 of a T_total-query block; einsum letters as in docs/kernels.md (G = N / K)."""
    B, Tc, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    scale = H ** -0.5
    qg = q.reshape(B, Tc, K, G, H)
    s = jnp.einsum("BTKGH,BSKH->BKGTS", qg, k, preferred_element_type=jnp.float32) * scale
    t = start + jnp.arange(Tc, dtype=jnp.int32)                          # row index within the block
    j = jnp.arange(S, dtype=jnp.int32)
    first = (kv_len - T_total)[:, None, None]                            # slot of query row 0
    if tree_mask is None:
        visible = j[None, None, :] <= first + t[None, :, None]           # [B, Tc, S]
    else:
        rel = j[None, None, :] - first                                   # tree slot index of key j
        in_tree = (rel >= 0) & (rel < T_total)
        tm = _tree_lookup(tree_mask, rel, Tc)
        visible = (rel < 0) | (in_tree & tm)
    s = jnp.where(visible[:, None, None], s, -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1, keepdims=True)                    # [B, K, G, Tc, 1]
    p = jnp.exp(s - lse)
    out = jnp.einsum("BKGTS,BSKH->BTKGH", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    out = out.reshape(B, Tc, N, H).astype(q.dtype)
    scores = None
    if score_rows:
        rows = jnp.asarray(score_rows, jnp.int32)
        src = p if score_mode == "weights" else jnp.where(visible[:, None, None], s, 0.0)
        scores = jnp.sum(src[:, :, :, rows, :], axis=(1, 2, 3))          # [B, S]
    return out, scores


def _tree_lookup(tree_mask, rel, Tc):
    """tree_mask[b, t, rel[b, 0, j]] for every row t and key j (False outside the tree)."""
    T = tree_mask.shape[-1]
    idx = jnp.clip(rel, 0, T - 1)                                         # [B, 1, S]
    idx = jnp.broadcast_to(idx, (idx.shape[0], Tc, idx.shape[-1]))
    return jnp.take_along_axis(tree_mask, idx, axis=2)


def sparse(q, k_all, v_all, layer: int, kv_len, idx, n_valid, *, tree_mask=None, impl=AttnImpl()):
    """Attention of T new queries over the gathered entries idx[b, :n_valid[b]] plus the T newest tokens.

    Args:
      q: [B, T, N, H]; k_all, v_all: [L, B, S, K, H]; layer: static layer index;
      kv_len: int32[B] (including the T new entries);
      idx: int32[B, M] selected cache positions (all < kv_len - T); n_valid: int32[B]. Or every layer's
        selections, idx int32[L, B, M] and n_valid int32[L, B]: the kernel reads row `layer` itself.
      tree_mask: optional bool[B, T, T]: the T new tokens are a draft tree (Dustin's sparse tree
        verification): token t sees new token u iff tree_mask[b, t, u]; default causal (u <= t).
    Returns:
      out [B, T, N, H].
    """
    if impl.backend != "xla":
        try:
            if tree_mask is None:
                def gathered(q, k_all, v_all, idx, n_valid, kv_len):
                    return _kernel_module("sparse_attention").sparse_attention_kernel(
                        q, k_all, v_all, idx, n_valid, kv_len, interpret=impl.interpret, layer=layer)[0]
                return _per_shard(impl, gathered, q, k_all, v_all, idx, n_valid, kv_len)

            def gathered_tree(q, k_all, v_all, idx, n_valid, prefix_len, tree_mask):
                return _kernel_module("tree_attention").sparse_tree_attention_kernel(
                    q, k_all, v_all, idx, n_valid, prefix_len, tree_mask, interpret=impl.interpret, layer=layer)[0]
            return _per_shard(impl, gathered_tree, q, k_all, v_all, idx, n_valid, kv_len - q.shape[1], tree_mask)
        except NotImplementedError:
            if impl.backend == "pallas":
                raise
    if idx.ndim == 3:
        idx, n_valid = idx[layer], n_valid[layer]
    k, v = k_all[layer], v_all[layer]
    return _sparse_xla(q, k, v, kv_len, idx, n_valid, tree_mask)


def _sparse_logits(q, k, kv_len, idx, n_valid, tree_mask, v=None):
    """Scaled logits [B, K, G, T, M + T] over the gathered entries (selection, then the T new tokens), -inf
    where not visible, the gathered positions [B, M + T] and (given v) the gathered values."""
    B, T, N, H = q.shape
    K = k.shape[2]
    G, M = N // K, idx.shape[1]
    tail = (kv_len - T)[:, None] + jnp.arange(T, dtype=jnp.int32)[None]  # [B, T] slots of the new tokens
    pos = jnp.concatenate([idx, tail], axis=1)                           # [B, M + T]
    kg = jnp.take_along_axis(k, pos[:, :, None, None], axis=1)
    vg = None if v is None else jnp.take_along_axis(v, pos[:, :, None, None], axis=1)
    qg = q.reshape(B, T, K, G, H)
    s = jnp.einsum("BTKGH,BSKH->BKGTS", qg, kg, preferred_element_type=jnp.float32) * H ** -0.5
    c = jnp.arange(M + T, dtype=jnp.int32)
    t = jnp.arange(T, dtype=jnp.int32)
    sel_ok = (c[None, None, :] < n_valid[:, None, None]) & (c[None, None, :] < M)
    if tree_mask is None:
        tail_ok = (c[None, None, :] >= M) & (c[None, None, :] - M <= t[None, :, None])
    else:
        tail_ok = jnp.concatenate([jnp.zeros((B, T, M), bool), tree_mask], axis=2)
    return jnp.where((sel_ok | tail_ok)[:, None, None], s, -jnp.inf), pos, vg


def _sparse_xla(q, k, v, kv_len, idx, n_valid, tree_mask=None):
    B, T, N, H = q.shape
    s, _, vg = _sparse_logits(q, k, kv_len, idx, n_valid, tree_mask, v)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("BKGTS,BSKH->BTKGH", p.astype(vg.dtype), vg, preferred_element_type=jnp.float32)
    return out.reshape(B, T, N, H).astype(q.dtype)


def sparse_scores(q, k_all, layer: int, kv_len, idx, n_valid, *, score_rows, score_mode="weights", tree_mask=None):
    """`full`'s per-position scores for a sparse attention (Vegas' selection under Dustin's sparse verification):
    the rows' attention over the entries `sparse` read, summed over heads and rows, 0 at every slot not read.

    Computed in XLA from a second gather of the selected keys (the kernels emit no scores): softmax weights over
    the selection and the visible new tokens ("weights") or the raw scale * q.k ("logits").
    Args: as `sparse`'s; score_rows: static tuple of query rows.
    Returns:
      f32[B, S].
    """
    if idx.ndim == 3:
        idx, n_valid = idx[layer], n_valid[layer]
    k = k_all[layer]
    s, pos, _ = _sparse_logits(q, k, kv_len, idx, n_valid, tree_mask)   # every row: masks are per block row
    s = s[:, :, :, jnp.asarray(score_rows, jnp.int32)]
    if score_mode == "weights":
        src = jnp.exp(s - jax.nn.logsumexp(s, axis=-1, keepdims=True))
    else:
        src = jnp.where(jnp.isfinite(s), s, 0.0)
    per_pos = jnp.where(jnp.arange(pos.shape[1]) < idx.shape[1], src.sum(axis=(1, 2, 3)), 0.0)   # [B, M + T]
    B, S = q.shape[0], k.shape[1]
    return jnp.zeros((B, S), jnp.float32).at[jnp.arange(B)[:, None], pos].add(per_pos)
