"""The LongSpec drafter: one decoder block sized like the target, reading the target's last-layer KV cache.

    embed (target's, frozen) -> RMSNorm -> self-attention (sliding window W over the drafter's own keys,
    RoPE from the target's config) -> RMSNorm -> cross-attention (drafter queries over the target's
    last-layer K/V, post-RoPE, GQA, no k/v projection) -> RMSNorm -> SwiGLU MLP -> final norm (the
    drafter's own) -> LM head (target's, frozen)

Parameters (plain dict; only the block trains, embedding and head stay in the target's pytree):

    attn_norm [D]    wq [D, N, H]   wk [D, K, H]   wv [D, K, H]   wo [N, H, D]
    xattn_norm [D]   wq_x [D, N, H]                               wo_x [N, H, D]
    mlp_norm [D]     w_gate [D, F]  w_up [D, F]    w_down [F, D]
    final_norm [D]   (the drafter's own, initialised from the target's; see `init_drafter_params`)

The block is Llama-style whatever the target's arch (no q/k/v bias, no q/k norm): it is trained from
scratch, so Qwen2's biases and Qwen3's q/k norms buy nothing; only the RoPE tables follow the target.

Two entry points share one block: `drafter_forward_train` (a whole packed sequence, causal sliding-window
self-attention, per-query cross-attention visibility) and `drafter_tree_step` (one level of a draft tree,
incremental over a ring buffer of exactly W slots per sequence, so the drafter's memory does not grow with
the context; the public LongSpec code allocates its drafter cache at full length).

A property of a one-block drafter used below: the self-attention K/V of token j depend only on token j and
its position (they are projected from the embedding, before any attention). So the ring only ever needs
the last W tokens, a prompt of any length is "prefilled" by projecting its last W tokens
(`drafter_fill`), and rollback after a rejected draft is unnecessary: the tree's nodes live in a per-round
buffer, and `drafter_commit` appends the accepted path's K/V to the ring.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct

from jspec.config import ModelConfig
from jspec.layers import rms_norm, rope

DEFAULT_WINDOW = 512


@struct.dataclass
class DrafterCache:
    """Ring buffer of the drafter's own self-attention K/V: W slots per sequence, W = the window.

    Entry of sequence index n (== its RoPE position) lives in slot n % W; `pos` records which index each
    slot holds (-1: empty), so a cache can start at any length (prefill) and rows may be ragged.
    """

    k: jax.Array        # [B, W, K, H]
    v: jax.Array        # [B, W, K, H]
    pos: jax.Array      # int32[B, W]  sequence index held by each slot, -1 when empty
    lengths: jax.Array  # int32[B]     tokens processed so far (= index of the next token)

    @property
    def window(self) -> int:
        return self.k.shape[1]


def init_drafter_params(cfg: ModelConfig, key, *, target_params=None, scale: float = 0.02,
                        final_norm_scale: Optional[float] = None, dtype=jnp.float32) -> dict:
    """Random drafter-block parameters (float32 master weights by default).

    The drafter has its own final norm (trainable; D parameters), initialised from the target's final norm
    so the frozen head starts on per-channel scales it was trained with, times `final_norm_scale`. Default
    scale: 0.1 with tied embeddings, else 1. Why: at initialisation the block is close to the identity, so the
    head sees the input token's own embedding; with a tied head that row wins by a wide margin (SmolLM2 on
    stdlib text: cross-entropy 107 with the target's norm, 12.8 with 0.1x, log V = 10.8), and in a 60-step
    CPU probe the 0.1x start reached loss 6.9 against 7.7 (a zero norm, 9.6, starves the block of gradient).

    Args:
      cfg: the TARGET's config; the block takes its D, N, K, H, F.
      key: PRNG key.
      target_params: the target's params (for its final norm); None: ones.
      scale: std of the normal init of every matrix.
      final_norm_scale: see above; None picks by cfg.tie_embeddings.
    """
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    shapes = {"wq": (D, N, H), "wk": (D, K, H), "wv": (D, K, H), "wo": (N, H, D),
              "wq_x": (D, N, H), "wo_x": (N, H, D), "w_gate": (D, F), "w_up": (D, F), "w_down": (F, D)}
    keys = jax.random.split(key, len(shapes))
    p = {n: (scale * jax.random.normal(k, s, jnp.float32)).astype(dtype)
         for k, (n, s) in zip(keys, shapes.items())}
    for n in ("attn_norm", "xattn_norm", "mlp_norm"):
        p[n] = jnp.ones((D,), dtype)
    if final_norm_scale is None:
        final_norm_scale = 0.1 if cfg.tie_embeddings else 1.0
    fn = jnp.ones((D,), jnp.float32) if target_params is None else jnp.asarray(target_params["final_norm"], jnp.float32)
    p["final_norm"] = (final_norm_scale * fn).astype(dtype)
    return p


def init_drafter_cache(cfg: ModelConfig, *, batch: int, window: int = DEFAULT_WINDOW, dtype=None,
                       lengths=None) -> DrafterCache:
    """An empty ring of `window` slots per sequence; `lengths` (default 0) is the index of the next token."""
    if window <= 0 or batch <= 0:
        raise ValueError(f"{batch=} and {window=} must be positive")
    dtype = jnp.dtype(dtype or cfg.dtype)
    shape = (batch, window, cfg.n_kv_heads, cfg.head_dim)
    lengths = jnp.zeros((batch,), jnp.int32) if lengths is None else jnp.asarray(lengths, jnp.int32)
    return DrafterCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                        pos=jnp.full((batch, window), -1, jnp.int32), lengths=lengths)


def attend(q, k, v, visible):
    """Masked GQA attention that returns 0 for a query that sees no key (noisy training hides every
    target entry from the first p queries; a plain -inf softmax would give NaN there).

    Args:
      q: [B, T, N, H]; k, v: [B, S, K, H]; visible: bool[B, T, S] (or broadcastable to it).
    Returns:
      [B, T, N, H] in q.dtype (softmax in float32).
    """
    B, T, N, H = q.shape
    K = k.shape[2]
    G = N // K
    s = jnp.einsum("BTKGH,BSKH->BKGTS", q.reshape(B, T, K, G, H), k.astype(q.dtype),
                   preferred_element_type=jnp.float32) * (H ** -0.5)
    vis = jnp.broadcast_to(visible, (B, T, s.shape[-1]))[:, None, None]       # [B, 1, 1, T, S]
    m = jnp.max(jnp.where(vis, s, -jnp.inf), axis=-1, keepdims=True)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    p = jnp.exp(jnp.where(vis, s - m, -jnp.inf))                               # exactly 0 where hidden
    den = jnp.sum(p, axis=-1)                                                  # [B, K, G, T]
    out = jnp.einsum("BKGTS,BSKH->BTKGH", p.astype(q.dtype), v.astype(q.dtype),
                     preferred_element_type=jnp.float32)
    den = jnp.moveaxis(den, 3, 1)[..., None]                                   # [B, T, K, G, 1]
    out = out / jnp.maximum(den, jnp.finfo(jnp.float32).tiny)
    return out.reshape(B, T, N, H).astype(q.dtype)


def _w(p, name, dtype):
    """Weights are cast to the activation dtype (bf16 compute over float32 master weights)."""
    return p[name].astype(dtype)


def _self_kv(dp, cfg, h, positions):
    k = jnp.einsum("BTD,DKH->BTKH", h, _w(dp, "wk", h.dtype))
    v = jnp.einsum("BTD,DKH->BTKH", h, _w(dp, "wv", h.dtype))
    return rope(k, positions, cfg), v


def _self_qkv(dp, cfg, x, positions):
    h = rms_norm(x, dp["attn_norm"], cfg.norm_eps)
    q = jnp.einsum("BTD,DNH->BTNH", h, _w(dp, "wq", x.dtype))
    return (rope(q, positions, cfg),) + _self_kv(dp, cfg, h, positions)


def drafter_node_kv(dparams, tparams, cfg: ModelConfig, tokens, positions):
    """The self-attention K/V a drafter token writes at `positions` (int32[B, T]): they depend on the token and
    its position only. For nodes whose K/V no drafter step computed (a draft tree's last level)."""
    return _self_kv(dparams, cfg, rms_norm(_embed(tparams, tokens), dparams["attn_norm"], cfg.norm_eps), positions)


def _after_self(dp, tp, cfg, x, o_self, positions, target_k, target_v, cross_visible, logits_at, cross_fn=None):
    """Residual of the self-attention, cross-attention over the target's K/V, MLP, final norm, head.
    `cross_fn(q [B, T, N, H]) -> [B, T, N, H]`, when given, does the cross-attention instead (e.g. a kernel
    reading the target's stacked cache in place)."""
    eps, dt = cfg.norm_eps, x.dtype
    x = x + jnp.einsum("BTNH,NHD->BTD", o_self.astype(dt), _w(dp, "wo", dt))
    h = rms_norm(x, dp["xattn_norm"], eps)
    # The target's cached keys carry RoPE at their absolute positions, so the drafter's cross query gets
    # RoPE at its own position: q.k then depends on the relative distance, as inside the target.
    qx = rope(jnp.einsum("BTD,DNH->BTNH", h, _w(dp, "wq_x", dt)), positions, cfg)
    o_x = attend(qx, target_k, target_v, cross_visible) if cross_fn is None else cross_fn(qx)
    x = x + jnp.einsum("BTNH,NHD->BTD", o_x, _w(dp, "wo_x", dt))
    h = rms_norm(x, dp["mlp_norm"], eps)
    g = jnp.einsum("BTD,DF->BTF", h, _w(dp, "w_gate", dt))
    u = jnp.einsum("BTD,DF->BTF", h, _w(dp, "w_up", dt))
    x = x + jnp.einsum("BTF,FD->BTD", jax.nn.silu(g) * u, _w(dp, "w_down", dt))
    if logits_at is not None:
        x = jnp.take_along_axis(x, logits_at[:, :, None], axis=1)
    x = rms_norm(x, dp["final_norm"], eps)
    tp = jax.lax.stop_gradient(tp)  # embedding and head are the target's: shared and frozen
    head = tp["embed"].T if cfg.tie_embeddings else tp["lm_head"]
    return jnp.einsum("BTD,DV->BTV", x, head.astype(dt), preferred_element_type=jnp.float32)


def _embed(tp, tokens):
    return jax.lax.stop_gradient(tp["embed"])[tokens]


def drafter_forward_train(dparams, tparams, cfg: ModelConfig, tokens, positions, target_k, target_v, cross_len,
                          *, window: int = DEFAULT_WINDOW, logits_at=None):
    """Training-mode forward over whole sequences (no cache).

    Args:
      dparams: drafter block; tparams: the target's params (embed, head; frozen).
      cfg: the target's config.
      tokens: int32[B, T].
      positions: int32[B, T] RoPE positions (anchor-offset indices in training; arange at inference). The
        sliding window counts sequence indices t, not positions: query t sees its own keys t-W < j <= t.
      target_k, target_v: [B, S, K, H] the target's last-layer K/V for the same sequence (slot j = index j,
        computed at the same positions).
      cross_len: int32[B, T]; query t sees target slots j < cross_len[b, t] (the compact form of the
        cross-attention mask; `noisy_cross_len` builds it for lag p).
      window: the self-attention window W.
      logits_at: optional int32[B, R] rows whose logits to return.
    Returns:
      logits f32[B, T or R, V].
    """
    B, T = tokens.shape
    x = _embed(tparams, tokens)
    q, k, v = _self_qkv(dparams, cfg, x, positions)
    t = jnp.arange(T, dtype=jnp.int32)
    self_visible = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - window)     # [T, T]
    o = attend(q, k, v, self_visible[None])
    j = jnp.arange(target_k.shape[1], dtype=jnp.int32)
    cross_visible = j[None, None, :] < cross_len[:, :, None]                            # [B, T, S]
    return _after_self(dparams, tparams, cfg, x, o, positions, target_k, target_v, cross_visible, logits_at)


def drafter_tree_step(dparams, tparams, cfg: ModelConfig, tokens, depth, dcache: DrafterCache, tree_k, tree_v,
                      slots, visible, target_k_last=None, target_v_last=None, target_len=None, *, cross_fn=None):
    """Run one level of a draft tree through the drafter (LongSpec tree drafting, docs/methods.md).

    A round's tree lives outside the ring, in a small per-round buffer of node K/V (`tree_k`, `tree_v`, one
    slot per node, the root first): the ring keeps only accepted tokens, and a rejected branch never has to be
    rolled back. Node t sits at sequence index (and RoPE position) dcache.lengths + depth[b, t], as if its
    root-to-node path were the sequence; its self-attention sees the ring's committed entries inside its window
    and the buffer slots `visible` allows (its ancestors and itself). Its cross-attention sees target slots
    j < target_len.

    Args:
      tokens: int32[B, T] this level's nodes; depth: int32[B, T] (or broadcastable) their depths (root 0).
      dcache: the ring of committed tokens (not modified: the caller commits accepted nodes after verifying).
      tree_k, tree_v: [B, M, K, H] the round's node buffer; slots: int32[B, T] where this level's K/V go.
      visible: bool[B, T, M] buffer slots each node attends to (ancestor-or-self; the new K/V are written
        before attending, so a node sees itself).
      target_k_last, target_v_last: [B, S, K, H] the target's last-layer cache (k_all[L-1], v_all[L-1]);
      target_len: int32[B] (or [B, T]): queries see target slots j < target_len; or
      cross_fn: cross_fn(q [B, T, N, H]) -> [B, T, N, H], the cross-attention done by the caller (the
        speculative engine runs it with a kernel over the target's stacked cache, so its cost follows the
        context length rather than the cache capacity).
    Returns:
      (logits f32[B, T, V], tree_k, tree_v with this level written).
    """
    B, T = tokens.shape
    W = dcache.window
    start = dcache.lengths
    idx = start[:, None] + jnp.broadcast_to(jnp.asarray(depth, jnp.int32), (B, T))      # [B, T]
    x = _embed(tparams, tokens)
    q, k, v = _self_qkv(dparams, cfg, x, idx)
    b = jnp.arange(B, dtype=jnp.int32)[:, None]
    tree_k = tree_k.at[b, slots].set(k.astype(tree_k.dtype))
    tree_v = tree_v.at[b, slots].set(v.astype(tree_v.dtype))

    # Ring entries: committed (pos < start) and inside each node's window (pos > idx - W).
    ring_pos = jnp.where((dcache.pos >= 0) & (dcache.pos < start[:, None]), dcache.pos, -1)[:, None, :]
    ring_visible = (ring_pos >= 0) & (ring_pos > idx[:, :, None] - W)                   # [B, T, W]
    keys = jnp.concatenate([dcache.k.astype(k.dtype), tree_k.astype(k.dtype)], axis=1)
    vals = jnp.concatenate([dcache.v.astype(v.dtype), tree_v.astype(v.dtype)], axis=1)
    o = attend(q, keys, vals, jnp.concatenate([ring_visible, visible], axis=2))

    cross_visible = None
    if cross_fn is None:
        target_len = jnp.asarray(target_len, jnp.int32)
        tl = target_len[:, None] if target_len.ndim == 1 else target_len
        j = jnp.arange(target_k_last.shape[1], dtype=jnp.int32)
        cross_visible = j[None, None, :] < tl[:, :, None]
    logits = _after_self(dparams, tparams, cfg, x, o, idx, target_k_last, target_v_last, cross_visible, None,
                         cross_fn)
    return logits, tree_k, tree_v


def drafter_commit(dcache: DrafterCache, k, v, n_new) -> DrafterCache:
    """Append precomputed self-attention K/V (e.g. a verified tree path taken from the round's node buffer)
    to the ring: row b's first n_new[b] entries of k, v [B, T, K, H] get indices lengths .. lengths+n_new-1.

    Exact because a drafter token's self K/V depend only on the token and its position, and the buffer
    computed them at the very positions they now take. Entries past n_new (and all but the last W) are
    dropped."""
    B, T = k.shape[:2]
    W = dcache.window
    n_new = jnp.asarray(n_new, jnp.int32)
    idx = dcache.lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    t = jnp.arange(T, dtype=jnp.int32)[None]
    keep = (t < n_new[:, None]) & (t >= n_new[:, None] - W)
    slots = jnp.where(keep, idx % W, W)
    b = jnp.arange(B, dtype=jnp.int32)[:, None]
    return DrafterCache(k=dcache.k.at[b, slots].set(k.astype(dcache.k.dtype), mode="drop"),
                        v=dcache.v.at[b, slots].set(v.astype(dcache.v.dtype), mode="drop"),
                        pos=dcache.pos.at[b, slots].set(idx, mode="drop"),
                        lengths=dcache.lengths + n_new)


def drafter_fill(dparams, tparams, cfg: ModelConfig, prompt, prompt_len, *, window: int = DEFAULT_WINDOW,
                 dtype=None) -> DrafterCache:
    """A ring holding a (right-padded, ragged) prompt: the self K/V of each row's last min(W, len) tokens.

    Nothing attends (no logits, no cross-attention over the target's cache), so the cost is one projection
    of W tokens whatever the context: what a decoding loop needs when its first draft starts from a token
    after the prompt (lengths = prompt_len).
    """
    B, P = prompt.shape
    Wc = min(window, P)
    prompt_len = jnp.asarray(prompt_len, jnp.int32)
    n = jnp.minimum(prompt_len, Wc)
    first = prompt_len - n
    gather = jnp.clip(first[:, None] + jnp.arange(Wc, dtype=jnp.int32)[None], 0, P - 1)
    chunk = jnp.take_along_axis(prompt, gather, axis=1)
    x = _embed(tparams, chunk)
    _, k, v = _self_qkv(dparams, cfg, x, first[:, None] + jnp.arange(Wc, dtype=jnp.int32)[None])
    dcache = init_drafter_cache(cfg, batch=B, window=window, dtype=dtype, lengths=first)
    return drafter_commit(dcache, k, v, n)
