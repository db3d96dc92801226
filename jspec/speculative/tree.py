"""Draft trees of static shape: growth level by level, lossless acceptance (greedy and sampled), compaction.

Layout. A tree with widths (w_1 .. w_D) has T = 1 + sum(w) nodes in level order: index 0 is the root (the
newest emitted token, depth 0), level l (depth l) occupies indices off_l .. off_l + w_l - 1 with
off_l = 1 + w_1 + .. + w_{l-1}. Every array is [B, T]: tokens, parent (int32, -1 for the root) and the
ancestor-or-self mask bool[B, T, T] that both the drafter and the target's tree verification attend with
(`jspec.model.Tree`). Depths are static (`depths(widths)`).

Growth (`grow`). Level l+1 is built from the drafter's distributions at the w_l nodes of level l:
  - greedy: the global top-w_{l+1} of all (node, token) pairs by cumulative draft log-probability
    (LongSpec / the public code's tree). Siblings are distinct tokens, so at most one child of a node can
    equal the target's argmax and the accepted path is unique.
  - sampling (T > 0): children are *sampled* i.i.d. from the processed draft distribution q(. | node)
    (with replacement: siblings may repeat). How many children a node gets is decided before they are
    drawn, from the parents' cumulative log-probabilities only: the level's slots go round-robin over the
    parents in decreasing score order (slot j -> parent rank j mod w_l, the (j // w_l)-th draw of that
    parent). So, given the count, a node's children are i.i.d. draws from q at that node, which is what
    the acceptance rule below needs.

Acceptance, sampling (`accept_sampled`): multi-draft recursive rejection sampling (SpecInfer, Miao et al. 2024,
"multi-step speculative sampling"; Chen et al. 2023 for the single-draft step). Start at the root with
r = p(. | root). At the current node, try its children x_1, x_2, .. in slot order: accept x_i with probability
min(1, r(x_i) / q(x_i)); on rejection set r <- norm(max(r - q, 0)) and try the next child. An accepted child
becomes the current node (r <- p(. | child)); when every child is rejected, or the node has none (a leaf or
a node the allocation gave no children), the bonus token is drawn from r and the round ends.

Why it is lossless. Let out_k(r) be the law of the token this emits at a node with target r and k i.i.d.
drafts from q. out_0(r) = r. For k >= 1, the first draft is accepted as x with probability
q(x) min(1, r(x)/q(x)) = min(r(x), q(x)); otherwise (probability 1 - sum_y min(r, q) = sum_y max(r - q, 0))
the remaining k-1 drafts, independent of the first and of its uniform, run with target
r' = max(r - q, 0) / sum_y max(r - q, 0), and by induction emit r'. Together
    out_k(r)(x) = min(r(x), q(x)) + max(r(x) - q(x), 0) = r(x).
At the root r = p(. | prefix), so the first token has the target's law. Given that a child x was accepted,
its children were drawn from q(. | prefix, x) independently of everything the decision at the parent used
(their number depends only on the parents' scores), so the next token has law p(. | prefix, x), and so on;
a rejected round ends with a token drawn exactly from the residual chain, and the next round restarts from
the true conditional. The emitted sequence therefore follows the target's autoregressive distribution.
p and q must be the *processed* distributions (`sampling.process_logits`, same SamplingConfig).

The public LongSpec code instead keeps the top-k drafts (deterministic, by q) and applies the p/q test: the
drafts are then not samples of q and the rule is biased (tests/test_longspec.py shows a chi-square failure).

Greedy acceptance (`accept_greedy`): the deepest node whose every ancestor (itself included, root excluded)
equals the target's argmax at its parent; the bonus is the target's argmax at that node. Each accepted token
is the target's argmax given the accepted prefix, so the output equals plain greedy decoding.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jspec import kv_cache, sampling
from jspec.config import SamplingConfig


class DraftTree(NamedTuple):
    tokens: jax.Array   # int32[B, T]   the root (index 0) and the drafted nodes in level order
    parent: jax.Array   # int32[B, T]   parent index (-1 for the root)
    mask: jax.Array     # bool[B, T, T] mask[b, t, a]: a is t or an ancestor of t


def node_depths(widths, chain: int = 0) -> np.ndarray:
    """int32[T]: each node's depth: the level-order tree of `widths`, then (`add_chain`) `chain` nodes of a chain
    from the root (depths 1 .. chain)."""
    return np.concatenate([depths(widths), np.arange(1, chain + 1)]).astype(np.int32)


def add_chain(tree: DraftTree, tokens) -> DraftTree:
    """The tree with a chain of G = tokens.shape[1] nodes appended (indices T .. T+G-1): node T hangs off the
    root, node T+i off node T+i-1. Acceptance and compaction take it through their `chain=G` argument."""
    B, T = tree.tokens.shape
    G = tokens.shape[1]
    parent = np.concatenate([[0], T + np.arange(G - 1)]).astype(np.int32)
    rows = np.zeros((G, T + G), bool)
    rows[:, 0] = True
    for i in range(G):
        rows[i, T:T + i + 1] = True
    mask = jnp.concatenate([jnp.pad(tree.mask, ((0, 0), (0, 0), (0, G))),
                            jnp.broadcast_to(jnp.asarray(rows), (B, G, T + G))], axis=1)
    return DraftTree(tokens=jnp.concatenate([tree.tokens, tokens.astype(jnp.int32)], axis=1),
                     parent=jnp.concatenate([tree.parent, jnp.broadcast_to(jnp.asarray(parent), (B, G))], axis=1),
                     mask=mask)


def level_sizes(widths) -> tuple:
    """Nodes per level, the root's level included: (1, w_1, .., w_D)."""
    return (1,) + tuple(widths)


def level_offsets(widths) -> tuple:
    """Index of the first node of each level 0..D, plus T at the end."""
    return tuple(int(x) for x in np.cumsum((0,) + level_sizes(widths)))


def depths(widths) -> np.ndarray:
    """int32[T]: the static depth of each node index."""
    return np.repeat(np.arange(len(widths) + 1), level_sizes(widths)).astype(np.int32)


# ------------------------------------------------------------------------------------------------ growth

def top_k_chunked(x, k: int, *, chunk: int = 0):
    """lax.top_k over the last axis, for few long rows in two exact stages: top-k of every `chunk`-wide slice,
    then top-k of those candidates (the overall top-k lies among them). Same values and indices as lax.top_k,
    ties included (lower index first at both stages).

    Why: XLA's GPU TopK runs one thread block per row, so a few long rows leave the GPU mostly idle and
    slicing them pays, while many rows already fill it and slicing only adds work (docs/performance.md,
    "LongSpec"). So chunk=0 (auto) slices only when there are fewer than 128 rows, into about 1024 rows of
    >= 1024 entries; an explicit chunk always slices (tests)."""
    V = x.shape[-1]
    rows = int(np.prod(x.shape[:-1]))
    if not chunk:
        n = min(V // 1024, 1024 // max(rows, 1)) if rows < 128 else 1
        chunk = -(-V // n) if n >= 2 else V
    if chunk >= V or k > chunk:
        return jax.lax.top_k(x, k)
    n = -(-V // chunk)
    pad = [(0, 0)] * (x.ndim - 1) + [(0, n * chunk - V)]
    xs = jnp.pad(x, pad, constant_values=-jnp.inf).reshape(*x.shape[:-1], n, chunk)
    v1, i1 = jax.lax.top_k(xs, k)                                          # [..., n, k]
    i1 = i1 + (jnp.arange(n, dtype=i1.dtype) * chunk)[:, None]
    v2, j = jax.lax.top_k(v1.reshape(*x.shape[:-1], n * k), k)
    return v2, jnp.take_along_axis(i1.reshape(*x.shape[:-1], n * k), j, axis=-1)


def top_k_small(x, k: int):
    """lax.top_k over the last axis by k argmax passes, for small k: the same values and indices, ties
    included (lower index first), -inf entries included.

    Each pass is one reduction over the row, where XLA's TopK sorts it, so for k <= 4 the passes are cheaper
    than the sort (see `top_k_chunked`). Ranking happens on the
    floats' order-preserving int32 keys, so an entry already taken (key INT32_MIN) stays below a -inf one."""
    from pallas_kernels.topk_select import order_key   # jspec loads the kernel package lazily

    V = x.shape[-1]
    key = order_key(x)   # float order == int order
    pos = jnp.arange(V, dtype=jnp.int32)
    taken = jnp.iinfo(jnp.int32).min
    idx = []
    for _ in range(k):
        i = jnp.argmax(key, axis=-1).astype(jnp.int32)
        idx.append(i)
        key = jnp.where(pos == i[..., None], taken, key)
    idx = jnp.stack(idx, axis=-1)
    return jnp.take_along_axis(x, idx, axis=-1), idx


def top_k_rows(x, k: int):
    """lax.top_k's result for tree drafting's row shapes: k argmax passes for k <= 4, else `top_k_chunked`."""
    return top_k_small(x, k) if k <= 4 else top_k_chunked(x, k)


def _top_children(logits, parent_score, w_next):
    """Greedy: the global top-w_next (node, token) pairs by cumulative log-probability.

    logits f32[B, w, V], parent_score f32[B, w] -> token, parent (level-local), score: [B, w_next] each."""
    B, w, V = logits.shape
    m = min(w_next, V)
    cand = parent_score[:, :, None] + jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    # Per-parent top-m first: the global top-w_next is among them, and [B, w*V] is never sorted.
    vals, toks = top_k_rows(cand, m)                                        # [B, w, m]
    score, flat = top_k_rows(vals.reshape(B, w * m), w_next)                # [B, w_next]
    token = jnp.take_along_axis(toks.reshape(B, w * m), flat, axis=1)
    return token.astype(jnp.int32), (flat // m).astype(jnp.int32), score


def _sampled_children(q, parent_score, w_next, key):
    """Sampling: children drawn i.i.d. from q at their parent; counts allocated by the parents' scores.

    q f32[B, w, V] processed; parent_score f32[B, w] -> token, parent (level-local), score: [B, w_next]."""
    B, w, V = q.shape
    c = -(-w_next // w)                                                     # draws per parent
    logq = jnp.where(q > 0, jnp.log(jnp.where(q > 0, q, 1.0)), -jnp.inf)
    draws = jax.random.categorical(key, logq, axis=-1, shape=(c, B, w))     # [c, B, w] i.i.d. per parent
    rank = jnp.argsort(-parent_score, axis=1, stable=True).astype(jnp.int32)   # parents, best first
    j = np.arange(w_next)
    parent = rank[:, j % w]                                                 # [B, w_next]
    token = jnp.take_along_axis(jnp.moveaxis(draws, 0, 2), parent[:, :, None], axis=1)  # [B, w_next, c]
    token = token[:, j, j // w].astype(jnp.int32)
    lq = logq[jnp.arange(B)[:, None], parent, token]                        # log q(child | parent)
    score = jnp.take_along_axis(parent_score, parent, axis=1) + lq
    return token, parent, score


def grow(widths, samp: SamplingConfig, key, root, run_level: Callable, state):
    """Build a draft tree level by level.

    Args:
      widths: static (w_1 .. w_D).
      samp: greedy -> top-k growth; else children sampled from the processed q.
      root: int32[B] the newest emitted token.
      run_level: run_level(state, level, idx, tree) -> (logits f32[B, len(idx), V], state): the drafter's
        logits at the nodes idx (static numpy indices of level `level`) of the partial tree (their tokens
        and ancestor rows are set; later levels are zero).
      state: threaded through run_level (the drafter's per-round node buffer).
    Returns:
      (DraftTree, q f32[B, T - w_D, V] the processed draft distributions at every node that has a level
      below it (None for greedy), state).
    """
    B = root.shape[0]
    offs, sizes = level_offsets(widths), level_sizes(widths)
    T = offs[-1]
    tree = DraftTree(tokens=jnp.zeros((B, T), jnp.int32).at[:, 0].set(root.astype(jnp.int32)),
                     parent=jnp.full((B, T), -1, jnp.int32),
                     mask=jnp.zeros((B, T, T), bool).at[:, 0, 0].set(True))
    score = jnp.zeros((B, T), jnp.float32)
    qs = []
    for lvl, w_next in enumerate(widths):
        idx = np.arange(offs[lvl], offs[lvl] + sizes[lvl])
        logits, state = run_level(state, lvl, idx, tree)
        key, sub = jax.random.split(key)
        if samp.greedy:
            tok, par, sc = _top_children(logits, score[:, idx], w_next)
        else:
            q = sampling.process_logits(logits, samp)
            qs.append(q)
            tok, par, sc = _sampled_children(q, score[:, idx], w_next, sub)
        nidx = np.arange(offs[lvl + 1], offs[lvl + 1] + w_next)
        par = par + offs[lvl]
        rows = jnp.take_along_axis(tree.mask, par[:, :, None], axis=1)      # the parents' ancestor rows
        rows = rows.at[:, np.arange(w_next), nidx].set(True)                # + self
        tree = DraftTree(tokens=tree.tokens.at[:, nidx].set(tok), parent=tree.parent.at[:, nidx].set(par),
                         mask=tree.mask.at[:, nidx].set(rows))
        score = score.at[:, nidx].set(sc)
    q = jnp.concatenate(qs, axis=1) if qs else None
    return tree, q, state


# ------------------------------------------------------------------------------------------- acceptance

def accept_greedy(widths, tree: DraftTree, target_logits, chain: int = 0):
    """Deepest path of target argmaxes.

    target_logits: [B, T, V] the target's logits at every node (or anything with the same argmax).
    chain: nodes of a root chain appended to the tree (`add_chain`).
    Returns best int32[B] (the deepest accepted node, 0 = root), n_accepted int32[B], next_token int32[B].
    """
    dep = jnp.asarray(node_depths(widths, chain))
    tgt = sampling.greedy(target_logits)                                     # [B, T]
    want = jnp.take_along_axis(tgt, jnp.maximum(tree.parent, 0), axis=1)     # argmax at each node's parent
    match = (tree.tokens == want).at[:, 0].set(True)
    ok = jnp.all(jnp.where(tree.mask, match[:, None, :], True), axis=-1)     # whole path matches
    best = jnp.argmax(jnp.where(ok, dep[None], -1), axis=1).astype(jnp.int32)
    nxt = jnp.take_along_axis(tgt, best[:, None], axis=1)[:, 0]
    return best, dep[best], nxt


def accept_sampled(widths, tree: DraftTree, q, target_logits, samp: SamplingConfig, key, chain: int = 0):
    """Multi-draft recursive rejection sampling down the tree (module docstring: rule and proof).

    Args:
      q: f32[B, >= T - w_D, V] processed draft distributions at the nodes with children (from `grow`).
      target_logits: [B, T, V] the target's logits at every node; processed here with `samp`.
      chain: nodes of a root chain appended to the tree (`add_chain`), whose tokens are fixed by the prefix
        (e.g. prompt lookup). At a node, the chain's child is tried after the sampled children, as a draft from
        the point mass on its token x: accepted with probability r(x), else r <- norm(r with x removed), the
        same rule with q = delta_x, so the induction in the module docstring covers it unchanged.
    Returns:
      best int32[B], n_accepted int32[B], next_token int32[B].
    """
    if samp.greedy:
        return accept_greedy(widths, tree, target_logits, chain=chain)
    B, T = tree.tokens.shape
    offs = level_offsets(widths)
    T0 = offs[-1]                                   # the chain's first node
    k_u, k_next = jax.random.split(key)
    u = jax.random.uniform(k_u, (B, T), jnp.float32)
    rows = jnp.arange(B)

    def target_at(node):
        return sampling.process_logits(jnp.take_along_axis(target_logits, node[:, None, None], axis=1)[:, 0], samp)

    def renorm(res, r):
        mass = jnp.sum(res, axis=-1, keepdims=True)
        # r == q up to rounding leaves no residual mass (and made rejection a rounding event): keep r.
        return jnp.where(mass > 0, res / jnp.where(mass > 0, mass, 1.0), r)

    cur = jnp.zeros((B,), jnp.int32)
    alive = jnp.ones((B,), bool)            # still walking down
    r = target_at(cur)                      # target (or residual) distribution at the current node
    final = r
    for lvl in range(max(len(widths), chain)):
        hit = jnp.full((B,), -1, jnp.int32)
        if lvl < len(widths):
            qc = jnp.take_along_axis(q, jnp.minimum(cur, q.shape[1] - 1)[:, None, None], axis=1)[:, 0]   # [B, V]
            for j in range(widths[lvl]):    # the level's slots, in order; only children of cur count
                t = offs[lvl + 1] + j
                x = tree.tokens[:, t]
                child = alive & (tree.parent[:, t] == cur) & (hit < 0)
                # u < r(x)/q(x) without the division (q(x) > 0 for a sampled x; r(x) = 0 is never accepted).
                ok = child & (u[:, t] * qc[rows, x] < r[rows, x])
                hit = jnp.where(ok, t, hit)
                r = jnp.where((child & ~ok)[:, None], renorm(jnp.maximum(r - qc, 0.0), r), r)
        if lvl < chain:                     # the chain's node at this depth: a point-mass draft
            t = T0 + lvl
            x = tree.tokens[:, t]
            child = alive & (tree.parent[:, t] == cur) & (hit < 0)
            ok = child & (u[:, t] < r[rows, x])
            hit = jnp.where(ok, t, hit)
            r = jnp.where((child & ~ok)[:, None], renorm(r.at[rows, x].set(0.0), r), r)
        moved = hit >= 0
        final = jnp.where((alive & ~moved)[:, None], r, final)
        cur = jnp.where(moved, hit, cur)
        alive = moved
        r = jnp.where(moved[:, None], target_at(cur), r)
    final = jnp.where(alive[:, None], r, final)                               # reached a leaf: draw from p
    nxt = sampling.draw(final, k_next)
    return cur, jnp.asarray(node_depths(widths, chain))[cur], nxt


def path(widths, tree: DraftTree, best, chain: int = 0):
    """int32[B, D]: the node at depth 1..D on the root-to-`best` path (entries past best's depth: 0);
    D = max(len(widths), chain) with a root chain of `chain` nodes (`add_chain`)."""
    dep = jnp.asarray(node_depths(widths, chain))
    D = max(len(widths), chain)
    on_path = jnp.take_along_axis(tree.mask, best[:, None, None], axis=1)[:, 0]          # [B, T]
    at = on_path[:, None, :] & (dep[None, None, :] == jnp.arange(1, D + 1)[None, :, None])
    return jnp.argmax(at, axis=-1).astype(jnp.int32)


# ------------------------------------------------------------------------------------------- compaction

def compact(cache: kv_cache.KVCache, base, path_idx, n_accepted) -> kv_cache.KVCache:
    """Move the accepted path's K/V to contiguous slots in every layer.

    Tree verification wrote node t at slot base + t (with RoPE at base + depth(t)); the accepted node at
    depth d belongs at slot base + d, the slot plain decoding would have used, at the same position. Gather
    all D path entries, then scatter the first n_accepted of them (the rest go out of range: dropped).

    Args:
      base: int32[B] slot of the root; path_idx: int32[B, D] from `path`; n_accepted: int32[B].
    Returns:
      the cache (lengths unchanged: the caller sets base + n_accepted + 1).
    """
    B, D = path_idx.shape
    d = jnp.arange(1, D + 1, dtype=jnp.int32)[None]
    src = base[:, None] + path_idx
    dst = jnp.where(d <= n_accepted[:, None], base[:, None] + d, cache.capacity)
    b = jnp.arange(B, dtype=jnp.int32)[:, None]
    k, v = cache.k[:, b, src], cache.v[:, b, src]                                         # [L, B, D, K, H]
    return cache.replace(k=cache.k.at[:, b, dst].set(k, mode="drop"), v=cache.v.at[:, b, dst].set(v, mode="drop"))
