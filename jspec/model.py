"""One functional forward for the Llama family (Llama 3.x, SmolLM2), Qwen2/2.5 and Qwen3.

The same call serves prefill (T = prompt), one-token decode (T = 1), chain verification (T = gamma + 1),
tree verification (`tree=`) and sparse self-drafting (`sparse=`, `selector=`): one layer loop, each layer
norm -> q/k/v -> RoPE -> cache write -> attention -> output projection + residual -> norm -> MLP + residual,
where only the attention input differs (`attention.Read`: the whole cache or a selection, a tree mask, score
rows). The dense part of a layer is jspec/layers.py's (XLA's einsums, or the fused Pallas launches of exact
mode), chosen once per step.

Parameters are stacked on a leading layer axis, in one runtime layout (config.py: q/k/v and gate/up fused;
`fuse_projections` makes it from the stored layout). The layer loop is unrolled in Python: a `lax.scan` over
layers is a device while-loop whose per-iteration overhead dominated small-batch decoding when measured
(docs/performance.md). The Pallas kernels read layer i's K/V straight out of the stacked cache (no per-layer
copy for the custom call); the layer index reaches them as a runtime operand, so all layers share one
compiled kernel per shape. The cache is updated in place by scatter into the stacked buffers (donated by the
jitted callers).
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from jspec import attention, kv_cache, layers, sharding
from jspec.attention import AttnImpl
from jspec.config import ModelConfig


class Tree(NamedTuple):
    """Tree verification inputs: node depth (RoPE offset from the first node) and ancestor-or-self mask."""

    depth: jax.Array   # int32[B, T]
    mask: jax.Array    # bool[B, T, T]


class Sparse(NamedTuple):
    """Per-layer KV selections for sparse drafting (shared by the heads of a layer)."""

    idx: jax.Array      # int32[L, B, M]
    n_valid: jax.Array  # int32[L, B]


def fuse_projections(params, cfg: ModelConfig):
    """The runtime layout `jspec.load` returns: q/k/v as one weight and gate/up as one (config.py).

    wqkv [L, D, K, G+2, H]: for each KV head its G query heads (query head n = k*G + g, as GQA reads them),
    then its k and v heads; w_gu [L, D, 2, F]: gate, up. Each pair is then one GEMM per layer; with separate
    weights XLA merges the GEMMs itself but concatenates the weights on every call (two extra kernels per
    layer; docs/performance.md). Both layouts shard over tp on their K / F axis (jspec/sharding.py).
    Idempotent. `forward` runs this layout only; checkpoints store the other (jspec/checkpoints).
    """
    lp = dict(params["layers"])
    if "wqkv" in lp:
        return params
    L, D, N, H = lp["wq"].shape
    K = cfg.n_kv_heads
    wq = lp.pop("wq").reshape(L, D, K, N // K, H)
    lp["wqkv"] = jnp.concatenate([wq, lp.pop("wk")[:, :, :, None], lp.pop("wv")[:, :, :, None]], axis=3)
    lp["w_gu"] = jnp.stack([lp.pop("w_gate"), lp.pop("w_up")], axis=2)
    return {**params, "layers": lp}


def forward(params, cfg: ModelConfig, tokens, cache: kv_cache.KVCache, *, n_new=None, logits_at=None,
            tree: Optional[Tree] = None, sparse: Optional[Sparse] = None, score_rows: tuple = (),
            score_mode: str = "weights", impl: AttnImpl = AttnImpl(), selector: Optional[Callable] = None,
            positions=None, live=None, dense_layers: tuple = (), full_when=None, probe: Optional[Callable] = None,
            attend: Optional[Callable] = None):
    """Run T new tokens per sequence through the model, appending their K/V to the cache.

    Args:
      params: parameter pytree in the fused runtime layout (config.py; InputError for the stored layout).
      tokens: int32[B, T]; row b's tokens go to slots cache.lengths[b] + t.
      cache: the KV cache; its lengths advance by `n_new` (default T; a ragged prefill passes the real
        per-row counts and right-pads the rest, whose entries then lie beyond the new lengths).
      logits_at: optional int32[B, R] row indices into T whose logits to return (prefill asks for the last
        real token only, so no [B, T, V] tensor is ever built); default all T.
      tree: tree verification inputs (positions = lengths + depth, masked attention among the T nodes).
      sparse: per-layer selections: attend over those entries plus the T new tokens (self-drafting; with
        `tree`, the new tokens under the tree mask). Also one set for all layers: idx int32[B, M], n_valid
        int32[B] (Dustin's sparse verification).
      score_rows / score_mode: collect per-layer scores of these query rows (see attention.full).
      selector: query-aware sparse attention (Quest-style drafting): `selector(layer, q[B, T, N, H]) ->
        (idx int32[B, M], n_valid int32[B])` picks each layer's entries from its own queries; replaces `sparse`.
      dense_layers: static layer indices that attend to the whole cache although `sparse` / `selector` is given.
      full_when: optional traced bool scalar: when True every layer attends to the whole cache instead of the
        selection (Dustin's dense rounds: a `lax.cond` per layer; the cache write is outside it).
      probe: optional `probe(layer, q [B, T, N, H], k_all, sel) -> f32[B, S] or None`, sel = (idx, n_valid) of
        the layer's selection or None: its results are summed into aux["probe"] (Dustin's signals, computed
        from the queries this forward already has; layers where it returns None cost nothing).
      attend: offline analysis only (jspec/offline): `attend(layer, q [B, T, N, H], k_all, v_all, kv_len) ->
        out [B, T, N, H]` replaces every layer's attention (e.g. a masked f32 softmax that also reads the
        queries); no scores are collected then. None (every runtime caller): the program is unchanged.
      live: optional bool[B]; rows where it is False are finished and ride along (a speculative batch runs
        until its slowest row is done): their K/V are still written, but their attention reads almost
        nothing of the cache (only the first T slots, no selections, an empty tree prefix), so a
        finished row stops costing its context's bandwidth. Their outputs are junk (finite); live rows
        are unaffected.
    Returns:
      logits f32[B, R or T, V], the updated cache, and aux: {"scores": f32[L, B, S]} when score_rows,
      {"probe": f32[B, S]} when a probe returned something.
    """
    B, T = tokens.shape
    impl = impl.for_step(T)   # exact mode covers decode and verification steps, not long prefills
    start = cache.lengths
    if positions is None:
        offs = tree.depth if tree is not None else jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        positions = start[:, None] + offs
    slots = start[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    kv_len = start + T if live is None else jnp.where(live, start + T, T)   # what attention reads
    x = params["embed"][tokens]

    attn = _Attention(
        read=attention.Read(kv_len, tree_mask=None if tree is None else tree.mask, score_rows=tuple(score_rows),
                            score_mode=score_mode),
        impl=impl, live=live, sparse=None if sparse is None else (sparse.idx, _live_n(sparse.n_valid, live)),
        selector=selector, dense_layers=dense_layers, full_when=full_when, probe=probe, hook=attend)
    dense = layers.for_step(params, cfg, B, T, impl)
    x, pos = dense.enter(x, positions)
    k_all, v_all = cache.k, cache.v
    all_scores, probed = [], []
    lp = params["layers"]
    for i in range(cfg.n_layers):
        p = jax.tree.map(lambda w: w[i], lp)   # layer i's weights (the fused kernels read lp at i in place)
        q, k, v = dense.qkv(x, pos, p, i)
        k_all, v_all = kv_cache.write(k_all, v_all, i, slots, k, v)
        o, scores, got = attn(i, q, k_all, v_all)
        all_scores += [] if scores is None else [scores]
        probed += [] if got is None else [got]
        x = dense.out(x, o, p, i)   # x + o @ wo
        x = dense.mlp(x, p, i)

    x = dense.leave(x)
    if logits_at is not None:
        x = jnp.take_along_axis(x, logits_at[:, :, None], axis=1)
    logits = dense.head(params, x)
    n_new = jnp.full((B,), T, jnp.int32) if n_new is None else n_new.astype(jnp.int32)
    cache = kv_cache.KVCache(k=k_all, v=v_all, lengths=start + n_new)
    aux = {"scores": jnp.stack(all_scores)} if all_scores else {}
    if probed:
        aux["probe"] = sum(probed[1:], probed[0])
    return logits, cache, aux


def _live_n(n, live):
    """Selection sizes with finished rows (live False) reading none."""
    return n if live is None else jnp.where(live, n, 0)


class _Attention(NamedTuple):
    """Every layer's attention this step: the `attention.Read` of each layer (the whole cache, or the layer's
    selection), the hooks around it (probe, offline `attend`) and Dustin's dense rounds (`full_when`)."""

    read: attention.Read          # the whole-cache read (tree mask, score rows)
    impl: AttnImpl
    live: Optional[jax.Array]
    sparse: Optional[tuple]       # (idx, n_valid) for every layer, or None
    selector: Optional[Callable]
    dense_layers: tuple
    full_when: Optional[jax.Array]
    probe: Optional[Callable]
    hook: Optional[Callable]      # forward's `attend`

    def selection(self, i, q):
        """Layer i's (idx, n_valid), or None where it reads the whole cache."""
        if i in self.dense_layers:
            return None
        if self.selector is not None:
            idx, n = self.selector(i, q)
            return idx, _live_n(n, self.live)
        return self.sparse

    def __call__(self, i, q, k_all, v_all):
        """Layer i's attention output [B, T, N, H], its scores (or None) and its probe result (or None)."""
        if self.hook is not None:   # offline analysis: no selections, probes or scores
            return self.hook(i, q, k_all, v_all, self.read.kv_len), None, None
        sel, got = self.selection(i, q), None
        if self.probe is not None:
            got = self.probe(i, q, k_all, sel)
            if got is not None:
                # The probe reads k_all, which later layers update in place: tie it to this layer's queries so
                # it is computed before those writes (otherwise XLA keeps the cache alive by copying it).
                q, got = jax.lax.optimization_barrier((q, got))
        read, impl = self.read, self.impl
        if sel is None:
            o, scores = attention.attend(q, k_all, v_all, i, read, impl)
        elif self.full_when is None:
            o, scores = attention.attend(q, k_all, v_all, i, read.select(*sel), impl)
        else:   # a lax.cond per layer; the cache write stays outside it
            o, scores = jax.lax.cond(
                self.full_when, lambda q, k_all, v_all, sel: attention.attend(q, k_all, v_all, i, read, impl),
                lambda q, k_all, v_all, sel: attention.attend(q, k_all, v_all, i, read.select(*sel), impl),
                q, k_all, v_all, sel)
        return o, scores, got


def init_params(cfg: ModelConfig, key, *, scale: float = 0.02, dtype=None, mesh=None, stored: bool = False):
    """Random parameters (speed work on the big presets; tests on tiny configs), in the fused runtime layout
    `forward` runs, or with `stored` in the checkpoint layout (config.py; the same values either way).
    mesh: a tensor-parallel mesh (`sharding.make_mesh`): the weights are created directly in its sharded
    layout (`sharding.param_shardings`), never whole on one device."""
    if mesh is not None:
        return jax.jit(lambda k: init_params(cfg, k, scale=scale, dtype=dtype, stored=stored),
                       out_shardings=sharding.param_shardings(cfg, mesh, stored=stored))(key)
    dtype = jnp.dtype(dtype or cfg.dtype)
    L, D, N, K, H, F, V = (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                           cfg.ffn_dim, cfg.vocab_size)
    shapes = {"wq": (L, D, N, H), "wk": (L, D, K, H), "wv": (L, D, K, H), "wo": (L, N, H, D),
              "w_gate": (L, D, F), "w_up": (L, D, F), "w_down": (L, F, D)}
    if cfg.qkv_bias:
        shapes.update(bq=(L, N, H), bk=(L, K, H), bv=(L, K, H))
    keys = iter(jax.random.split(key, len(shapes) + 8))
    layers = {n: (scale * jax.random.normal(next(keys), s, jnp.float32)).astype(dtype) for n, s in shapes.items()}
    norms = ["attn_norm", "mlp_norm"] + (["q_norm", "k_norm"] if cfg.qk_norm else [])
    for n in norms:
        size = H if n in ("q_norm", "k_norm") else D
        layers[n] = (1.0 + 0.1 * jax.random.normal(next(keys), (L, size), jnp.float32)).astype(dtype)
    params = {"embed": (scale * jax.random.normal(next(keys), (V, D), jnp.float32)).astype(dtype),
              "final_norm": jnp.ones((D,), dtype), "layers": layers}
    if not cfg.tie_embeddings:
        params["lm_head"] = (scale * jax.random.normal(next(keys), (D, V), jnp.float32)).astype(dtype)
    return params if stored else fuse_projections(params, cfg)


def param_bytes(params) -> int:
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(params))
