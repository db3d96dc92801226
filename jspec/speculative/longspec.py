"""LongSpec: a trained one-block drafter over the target's last-layer KV cache, chain or tree drafts, one
tree-masked target verification per round (docs/methods.md; the drafter is jspec/drafter/model.py).

One round (driven by jspec/speculative/engine.py's while_loop, like the self-speculative methods):

    target cache: the accepted prefix, slots 0 .. base-1; drafter ring: the same tokens (lengths = base);
    `last` (the newest emitted token, not cached anywhere) is the tree's root at position base.
    1. draft    level by level (`tree.grow`): the drafter runs the root, then each level's nodes, with the
                tree's ancestor mask over a per-round node buffer (positions base + depth) and
                cross-attention over every accepted target slot (< base: the verification lag is 1 for the
                root, d + 1 at depth d). Chain mode is the tree of widths (1,) * gamma.
    2. verify   one target forward over [root, nodes] (T = 1 + sum(widths)) with `model.Tree(depth, mask)`:
                node t is written at slot base + t, RoPE position base + depth(t)
    3. accept   greedy: deepest path of target argmaxes; sampling: recursive rejection (tree.py, with proof)
    4. compact  the accepted path's K/V move to slots base+1 .. base+n in every layer (`tree.compact`); the
                root and the path's drafter K/V (from the node buffer: they depend only on token and
                position) go into the ring; the engine sets lengths = base + n + 1 for both.

Public pieces (`draft`, `verify`, `accept`, `commit`) are plain functions so a benchmark can jit one alone.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jspec import attention, kv_cache, model
from jspec.attention import AttnImpl
from jspec.config import ModelConfig, SamplingConfig
from jspec.drafter.model import DrafterCache, drafter_commit, drafter_fill, drafter_node_kv, drafter_tree_step
from jspec.speculative import lookup as lookup_lib
from jspec.speculative import sparse_verify
from jspec.speculative import tree as tree_lib
from jspec.speculative.config import SpecConfig


@struct.dataclass
class State:
    """LongSpec's per-run state (in the engine's State.method): the drafter's ring of accepted tokens."""

    dcache: DrafterCache
    tokens: object = None   # int32[B, C] with lookup: the token at each cache slot (prompt, then accepted text)


@struct.dataclass
class Draft:
    """One round's draft: the tree, q at its inner nodes (sampling only) and the drafter's node K/V."""

    tree: tree_lib.DraftTree
    q: object             # f32[B, T - w_D, V] or None (greedy)
    node_k: jax.Array     # [B, T, K, H] drafter self-attention K/V of every node (root included)
    node_v: jax.Array
    signal: object = None  # f32[B, S] Dustin's A_D: cross-attention weights on the draft heads (or None)


def _need(drafter):
    if drafter is None:
        raise ValueError("method 'longspec' needs the drafter's params: pass drafter=<params> (e.g. "
                         "jspec.drafter.load_drafter(path).params) to init / prepare / run")
    return drafter


def init(drafter, params, cfg: ModelConfig, spec: SpecConfig, prompt_tokens, prompt_lengths,
         capacity: int | None = None) -> State:
    """The ring after a prefill: the last W prompt tokens' drafter K/V (lengths = prompt_lengths); with
    spec.lookup also the prompt tokens by cache slot (`capacity` slots, default the prompt's width)."""
    dcache = drafter_fill(_need(drafter), params, cfg, prompt_tokens, prompt_lengths, window=spec.options.window,
                          dtype=cfg.dtype)
    tokens = lookup_lib.record(prompt_tokens, capacity or prompt_tokens.shape[1]) if spec.lookup else None
    return State(dcache=dcache, tokens=tokens)


def cross_attention(cfg: ModelConfig, cache: kv_cache.KVCache, impl: AttnImpl = AttnImpl(), live=None):
    """The drafter's cross-attention as `attention.full` over the target's last layer, read in place.

    Every draft node sees the same keys, the accepted slots j < lengths, so the T nodes are folded into the
    head axis as T*N heads of ONE query row (head k*T*G + t*G + g reads KV head k, GQA-grouped as the kernel
    expects) with kv_len = lengths: bottom-right causal then means "every slot < lengths". On GPU this is the
    flash kernel, whose cost follows the context length, not the cache capacity; on CPU the XLA path.
    Rows where `live` (bool[B], optional) is False read slot 0 only (finished rows: their output is junk).
    Returns cross_fn(q [B, T, N, H]) -> [B, T, N, H] for `drafter_tree_step`.
    """
    K = cfg.n_kv_heads
    kv_len = cache.lengths if live is None else jnp.where(live, cache.lengths, 1)

    def cross_fn(q):
        B, T, N, H = q.shape
        G = N // K
        q1 = q.reshape(B, T, K, G, H).transpose(0, 2, 1, 3, 4).reshape(B, 1, K * T * G, H)
        o, _ = attention.full(q1.astype(cache.k.dtype), cache.k, cache.v, cfg.n_layers - 1, kv_len, impl=impl)
        return o.reshape(B, K, T, G, H).transpose(0, 2, 1, 3, 4).reshape(B, T, N, H).astype(q.dtype)

    return cross_fn


def draft(params, cfg: ModelConfig, spec: SpecConfig, samp: SamplingConfig, drafter, mstate: State,
          cache: kv_cache.KVCache, last, key, impl: AttnImpl = AttnImpl(), live=None, signal: bool = False) -> Draft:
    """Grow the round's draft tree with the drafter (step 1). Reads the cache, writes nothing to it.
    `live` (bool[B], optional): rows still decoding; finished ones skip their cross-attention reads.
    signal: also collect Dustin's A_D (Draft.signal; sparse_verify.cross_probe)."""
    dparams = _need(drafter)
    widths = spec.widths
    B = last.shape[0]
    T = 1 + sum(widths)
    dcache = mstate.dcache
    shape = (B, T, cfg.n_kv_heads, cfg.head_dim)
    weights = sparse_verify.cross_probe(spec, cfg, cache, live) if signal else None
    a_d = None if weights is None else jnp.zeros((B, cache.capacity), jnp.float32)
    buf = (jnp.zeros(shape, dcache.k.dtype), jnp.zeros(shape, dcache.v.dtype), a_d)
    # Every accepted target slot (< lengths) is visible. Drafting never needs exact mode (AttnImpl.for_drafts).
    attend = cross_attention(cfg, cache, impl.for_drafts(), live)

    def run_level(buf, lvl, idx, tree):
        slots = jnp.broadcast_to(jnp.asarray(idx, jnp.int32), (B, len(idx)))
        seen = []   # the level's cross queries: drafter_tree_step calls cross_fn once, inside this trace

        def cross_fn(q):
            seen.append(q)
            return attend(q)

        logits, nk, nv = drafter_tree_step(dparams, params, cfg, tree.tokens[:, idx], lvl, dcache, buf[0], buf[1],
                                           slots, tree.mask[:, idx, :], cross_fn=cross_fn if weights else attend)
        a_d = buf[2] if weights is None else buf[2] + weights(seen[0])
        return logits, (nk, nv, a_d)

    tree, q, (nk, nv, a_d) = tree_lib.grow(widths, samp, key, last, run_level, buf)
    # The last level's nodes grow nothing, so no drafter step ran them; their K/V (token and position only)
    # are still needed when a round accepts the whole depth and commits the leaf to the ring. The lookup
    # chain's nodes are never run by the drafter either: theirs come from the same projection.
    leaf = np.arange(tree_lib.level_offsets(widths)[-2], T)
    tokens, positions = tree.tokens[:, leaf], jnp.broadcast_to(len(widths), (B, len(leaf)))
    if spec.lookup:
        base = cache.lengths
        seq = lookup_lib.commit(mstate.tokens, base, last[:, None], jnp.ones_like(base))
        tree = tree_lib.add_chain(tree, lookup_lib.propose(seq, base + 1, spec.lookup))
        tokens = jnp.concatenate([tokens, tree.tokens[:, T:]], axis=1)
        positions = jnp.concatenate([positions, jnp.broadcast_to(1 + jnp.arange(spec.lookup), (B, spec.lookup))], 1)
    k, v = drafter_node_kv(dparams, params, cfg, tokens, dcache.lengths[:, None] + positions)
    nk = jnp.concatenate([nk[:, :leaf[0]], k.astype(nk.dtype)], axis=1)
    nv = jnp.concatenate([nv[:, :leaf[0]], v.astype(nv.dtype)], axis=1)
    return Draft(tree=tree, q=q, node_k=nk, node_v=nv, signal=a_d)


def verify(params, cfg: ModelConfig, spec: SpecConfig, cache: kv_cache.KVCache, tree: tree_lib.DraftTree,
           impl: AttnImpl = AttnImpl(), live=None):
    """One target forward over the whole tree (step 2). Returns logits f32[B, T, V] and the cache (lengths
    + T; node t's K/V at slot base + t). `live` as in `draft` (model.forward's)."""
    logits, cache, _ = model.forward(params, cfg, tree.tokens, cache, tree=_tree_input(spec, tree), impl=impl,
                                     live=live)
    return logits, cache


def _tree_input(spec: SpecConfig, tree: tree_lib.DraftTree) -> model.Tree:
    B, T = tree.tokens.shape
    depth = jnp.broadcast_to(jnp.asarray(tree_lib.node_depths(spec.widths, spec.lookup)), (B, T))
    return model.Tree(depth=depth, mask=tree.mask)


def accept(spec: SpecConfig, samp: SamplingConfig, d: Draft, target_logits, key):
    """Lossless acceptance (step 3): best node int32[B], n_accepted int32[B] in [0, depth], next int32[B]."""
    if samp.greedy:
        return tree_lib.accept_greedy(spec.widths, d.tree, target_logits, chain=spec.lookup)
    return tree_lib.accept_sampled(spec.widths, d.tree, d.q, target_logits, samp, key, chain=spec.lookup)


def commit(spec: SpecConfig, d: Draft, cache: kv_cache.KVCache, base, best, n_accepted, active, mstate: State):
    """Step 4: the accepted path (drafts int32[B, depth], for the engine's `emitted`), the compacted target
    cache (lengths left to the caller) and the ring with root + path appended for the `active` rows."""
    path = tree_lib.path(spec.widths, d.tree, best, chain=spec.lookup)                  # [B, D]
    cache = tree_lib.compact(cache, base, path, n_accepted)
    drafts = jnp.take_along_axis(d.tree.tokens, path, axis=1)
    ring_idx = jnp.concatenate([jnp.zeros_like(path[:, :1]), path], axis=1)
    k = jnp.take_along_axis(d.node_k, ring_idx[:, :, None, None], axis=1)
    v = jnp.take_along_axis(d.node_v, ring_idx[:, :, None, None], axis=1)
    n_new = jnp.where(active, n_accepted + 1, 0)
    dcache = drafter_commit(mstate.dcache, k, v, n_new)
    tokens = mstate.tokens
    if tokens is not None:   # root + accepted path at slots base .. base + n_accepted
        tokens = lookup_lib.commit(tokens, base, jnp.take_along_axis(d.tree.tokens, ring_idx, axis=1), n_new)
    return drafts, cache, State(dcache=dcache, tokens=tokens)


def step(params, cfg: ModelConfig, spec: SpecConfig, samp: SamplingConfig, drafter, mstate: State,
          cache: kv_cache.KVCache, last, active, k_draft, k_accept, impl: AttnImpl = AttnImpl(), vstate=None):
    """draft -> verify -> accept -> commit. Returns drafts int32[B, depth] (the accepted path first),
    n_accepted, next token, the cache (lengths still base + T), the new State and the verification policy's
    state (`vstate`, sparse_verify.State with a lossy spec.verify, else None)."""
    base = cache.lengths
    signal = vstate is not None and sparse_verify.uses_draft(spec)
    d = draft(params, cfg, spec, samp, drafter, mstate, cache, last, k_draft, impl, active, signal)
    if vstate is None:
        logits, cache = verify(params, cfg, spec, cache, d.tree, impl, active)
    else:   # Dustin / its baselines: the tree verified against I_verify + the tree's own slots
        tokens, signal = d.tree.tokens, d.signal
        if signal is not None:   # A_D reads the cache the verification then updates in place: read it first
            tokens, signal = jax.lax.optimization_barrier((tokens, signal))
        logits, cache, _, vstate = sparse_verify.forward(params, cfg, spec, vstate, tokens, cache, signal,
                                                         tree=_tree_input(spec, d.tree), impl=impl, live=active)
    best, n_acc, nxt = accept(spec, samp, d, logits, k_accept)
    drafts, cache, mstate = commit(spec, d, cache, base, best, n_acc, active, mstate)
    return drafts, n_acc, nxt, cache, mstate, vstate


# ------------------------------------------------------------------------------ the engine's method protocol
# LongSpec implements the protocol of streaming.py with its two optional hooks: `prepare` (its state comes from
# the drafter and the prompts, not from the target's scores) and `tree_round` (its own round: the drafter's tree
# and a tree-masked verification). The chain hooks the engine would otherwise call are the trivial ones.

def prepare(drafter, params, cfg: ModelConfig, spec: SpecConfig, cache: kv_cache.KVCache, prompt_tokens) -> State:
    """The method state after a prefill into `cache` (the engine's hook; `init` with the cache's lengths)."""
    return init(drafter, params, cfg, spec, prompt_tokens, cache.lengths, cache.capacity)


tree_round = step


def score_rows(spec):
    return ()


def update(spec, state, cache, scores, point):
    return state   # `tree_round` already committed the round into the ring
