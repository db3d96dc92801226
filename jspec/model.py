"""One functional forward for the Llama family (Llama 3.x, SmolLM2), Qwen2/2.5 and Qwen3.

The same call serves prefill (T = prompt), one-token decode (T = 1), chain verification (T = gamma + 1),
tree verification (`tree=`) and sparse self-drafting (`sparse=`): only the attention inputs differ.
Parameters are stacked on a leading layer axis, but the layer loop is unrolled in Python: a `lax.scan` over
layers is a device while-loop whose per-iteration overhead dominated small-batch decoding when measured
(docs/performance.md). The Pallas
kernels read layer i's K/V straight out of the stacked cache (no per-layer copy for the custom call); the
layer index reaches them as a runtime operand, so all layers share one compiled kernel per shape. The
cache is updated in place by scatter into the stacked buffers (donated by the jitted callers).
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jspec import attention, kv_cache, sharding
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


def rms_norm(x, w, eps):
    """RMSNorm in float32, result in x.dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * w.astype(jnp.float32)).astype(x.dtype)


@functools.lru_cache(maxsize=None)
def _inv_freq(cfg: ModelConfig) -> np.ndarray:
    """RoPE inverse frequencies [H/2] (float32, as Hugging Face computes them), with Llama 3 scaling."""
    H = cfg.head_dim
    inv = (1.0 / (cfg.rope_theta ** (np.arange(0, H, 2, dtype=np.int64).astype(np.float32) / H))).astype(np.float32)
    rs = cfg.rope_scaling
    if rs is None:
        return inv
    low_wavelen = rs.original_max_position / rs.low_freq_factor
    high_wavelen = rs.original_max_position / rs.high_freq_factor
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / rs.factor, inv)
    smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope(x, positions, cfg: ModelConfig):
    """Rotary embedding, "rotate half" convention. x: [B, T, heads, H]; positions: int32[B, T]."""
    ang = positions.astype(jnp.float32)[:, :, None] * jnp.asarray(_inv_freq(cfg))[None, None, :]
    cos, sin = jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def fuse_projections(params, cfg: ModelConfig):
    """The runtime layout `jspec.load` returns: q/k/v as one weight and gate/up as one (config.py).

    wqkv [L, D, K, G+2, H]: for each KV head its G query heads (query head n = k*G + g, as GQA reads them),
    then its k and v heads; w_gu [L, D, 2, F]: gate, up. Each pair is then one GEMM per layer; with separate
    weights XLA merges the GEMMs itself but concatenates the weights on every call (two extra kernels per
    layer; docs/performance.md). Both layouts shard over tp on their K / F
    axis (jspec/sharding.py). Idempotent; `forward` takes either layout.
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


def _project_qkv(h, p, cfg: ModelConfig):
    """q [B,T,N,H], k, v [B,T,K,H] from the normed input, either weight layout."""
    if "wqkv" not in p:
        return (jnp.einsum("BTD,DNH->BTNH", h, p["wq"]), jnp.einsum("BTD,DKH->BTKH", h, p["wk"]),
                jnp.einsum("BTD,DKH->BTKH", h, p["wv"]))
    y = jnp.einsum("BTD,DKJH->BTKJH", h, p["wqkv"])
    G = cfg.n_heads // cfg.n_kv_heads
    B, T = h.shape[:2]
    return y[:, :, :, :G].reshape(B, T, cfg.n_heads, -1), y[:, :, :, G], y[:, :, :, G + 1]


def _gate_up(h, p):
    if "w_gu" not in p:
        return jnp.einsum("BTD,DF->BTF", h, p["w_gate"]), jnp.einsum("BTD,DF->BTF", h, p["w_up"])
    y = jnp.einsum("BTD,DJF->BTJF", h, p["w_gu"])
    return y[:, :, 0], y[:, :, 1]


def _dense_kernels(params, cfg: ModelConfig, M: int, impl: AttnImpl):
    """pallas_kernels.dense when this step's layers can run as fused launches (AttnImpl.dense_rows, or exact
    mode), else None.

    Needs the fused weight layout, a plain Llama-style layer (no q/k/v bias or q/k norm) and a shape the
    kernels tile (rows are padded to a multiple of 16 by `forward`); anything else (CPU without interpret,
    tensor parallelism) keeps XLA's path.
    """
    if (impl.backend == "xla" or impl.mesh is not None or (M > impl.dense_rows and not impl.exact)
            or cfg.qkv_bias or cfg.qk_norm or "wqkv" not in params["layers"]):
        return None
    from pallas_kernels import _common, dense
    lp = params["layers"]
    try:
        _common.check_platform(impl.interpret)
        M = _pad16(M)
        x = jax.ShapeDtypeStruct((M, cfg.d_model), lp["wqkv"].dtype)
        dense.check_shapes("qkv_rope", x, _flat(lp["wqkv"], 2), 0, head_dim=cfg.head_dim, groups=cfg.group)
        dense.check_shapes("glu", x, _flat(lp["w_gu"], 2), 0)
        dense.check_shapes("residual", jax.ShapeDtypeStruct((M, cfg.ffn_dim), x.dtype), lp["w_down"], 0)
        dense.check_shapes("residual", jax.ShapeDtypeStruct((M, cfg.n_heads * cfg.head_dim), x.dtype),
                           _flat(lp["wo"], 1, 3), 0)
    except NotImplementedError:
        return None
    return dense


def exact_supported(params, cfg: ModelConfig, impl: AttnImpl) -> bool:
    """Whether `impl` (with exact=True) runs this model's one-token and verification steps exactly: the fused
    dense kernels tile its layers and the attention kernels run here (docs/methods.md, "Lossless")."""
    from pallas_kernels import _common, dense   # _dense_kernels also checks that Pallas runs here
    if (not impl.exact or _dense_kernels(params, cfg, 16, impl) is None
            or cfg.head_dim not in _common.SUPPORTED_HEAD_DIMS):
        return False
    w, wt = _head_args(params, cfg)
    try:
        dense.check_shapes("head", jax.ShapeDtypeStruct((16, cfg.d_model), w.dtype), w, 0, w_transposed=wt)
    except NotImplementedError:
        return False
    return True


def _head_args(params, cfg: ModelConfig):
    """(w, w_transposed) of the LM head as the dense kernel's one-layer weight: lm_head [1, D, V], or the tied
    embedding [1, V, D] read transposed (a free reshape, no [D, V] copy)."""
    if cfg.tie_embeddings:
        return params["embed"][None], True
    return params["lm_head"][None], False


def _exact_head(params, cfg: ModelConfig, x, impl: AttnImpl):
    """Exact mode's final RMSNorm + LM head on the dense kernel (rows independent of each other, like the
    layers'), f32 logits [B, R, V]; None where the kernel does not tile the head (XLA's head then runs)."""
    from pallas_kernels import dense
    B, R, D = x.shape
    M = _pad16(B * R)
    w, wt = _head_args(params, cfg)
    try:
        dense.check_shapes("head", jax.ShapeDtypeStruct((M, D), x.dtype), w, 0, w_transposed=wt)
    except NotImplementedError:
        return None
    xs = jnp.pad(x.reshape(B * R, D), ((0, M - B * R), (0, 0)))
    logits = dense.dense(xs, w, 0, mode="head", norm_w=params["final_norm"][None], eps=cfg.norm_eps,
                         w_transposed=wt, implementation="pallas", interpret=impl.interpret)
    return logits[:B * R].reshape(B, R, -1)


def _pad16(M: int) -> int:
    return -(-M // 16) * 16


def _flat(w, start, stop=None):
    """Merge axes start..stop-1 (default: through the last) of a stacked weight into one (a free reshape)."""
    stop = w.ndim if stop is None else stop
    return w.reshape(*w.shape[:start], -1, *w.shape[stop:])


def forward(params, cfg: ModelConfig, tokens, cache: kv_cache.KVCache, *, n_new=None, logits_at=None,
            tree: Optional[Tree] = None, sparse: Optional[Sparse] = None, score_rows: tuple = (),
            score_mode: str = "weights", impl: AttnImpl = AttnImpl(), selector: Optional[Callable] = None,
            positions=None, live=None, dense_layers: tuple = (), full_when=None, probe: Optional[Callable] = None,
            attend: Optional[Callable] = None):
    """Run T new tokens per sequence through the model, appending their K/V to the cache.

    Args:
      params: parameter pytree (layout in config.py; stored or `fuse_projections` layout).
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
      logits f32[B, R or T, V], the updated cache, and aux: {"scores": f32[L, B, S]} when score_rows.
    """
    B, T = tokens.shape
    impl = impl.for_step(T)   # exact mode covers decode and verification steps, not long prefills
    start = cache.lengths
    if positions is None:
        offs = tree.depth if tree is not None else jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        positions = start[:, None] + offs
    slots = start[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    kv_len = start + T if live is None else jnp.where(live, start + T, T)   # what attention reads

    def live_n(n):   # selections of finished rows: none
        return n if live is None else jnp.where(live, n, 0)
    eps = cfg.norm_eps
    x = params["embed"][tokens]

    sparse_n = None if sparse is None else live_n(sparse.n_valid)
    k_all, v_all = cache.k, cache.v
    all_scores, probed = [], []
    lp, M = params["layers"], B * T
    fused = _dense_kernels(params, cfg, M, impl)
    if fused is not None:   # the stream as [Mp, D] rows, zero rows padding M to the kernels' 16-row blocks
        def pad(a):
            return jnp.pad(a, ((0, _pad16(M) - M),) + ((0, 0),) * (a.ndim - 1))
        xs, pos = pad(x.reshape(M, -1)), pad(positions.reshape(M))
    for i in range(cfg.n_layers):
        p = jax.tree.map(lambda w: w[i], lp)
        if fused is not None:   # RMSNorm + q/k/v GEMM + RoPE in one launch
            y = fused.dense(xs, _flat(lp["wqkv"], 2), i, mode="qkv_rope", norm_w=lp["attn_norm"], eps=eps, aux=pos,
                            inv_freq=_inv_freq(cfg), head_dim=cfg.head_dim, groups=cfg.group,
                            implementation="pallas", interpret=impl.interpret)
            y = y[:M].reshape(B, T, cfg.n_kv_heads, cfg.group + 2, cfg.head_dim)
            q, k, v = y[:, :, :, :cfg.group].reshape(B, T, cfg.n_heads, -1), y[:, :, :, -2], y[:, :, :, -1]
        else:
            h = rms_norm(x, p["attn_norm"], eps)
            q, k, v = _project_qkv(h, p, cfg)
            if cfg.qkv_bias:
                q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
            if cfg.qk_norm:  # Qwen3 normalises each head before RoPE
                q, k = rms_norm(q, p["q_norm"], eps), rms_norm(k, p["k_norm"], eps)
            q, k = rope(q, positions, cfg), rope(k, positions, cfg)
        k_all, v_all = kv_cache.write(k_all, v_all, i, slots, k, v)
        if attend is not None:   # offline analysis: no selections, probes or scores
            o = attend(i, q, k_all, v_all, kv_len)
        else:
            sel = None
            if i not in dense_layers:
                if selector is not None:
                    sel_idx, sel_n = selector(i, q)
                    sel = (sel_idx, live_n(sel_n))
                elif sparse is not None:
                    sel = (sparse.idx, sparse_n)
            if probe is not None:
                got = probe(i, q, k_all, sel)
                if got is not None:
                    # The probe reads k_all, which later layers update in place: tie it to this layer's queries so
                    # it is computed before those writes (otherwise XLA keeps the cache alive by copying it).
                    q, got = jax.lax.optimization_barrier((q, got))
                    probed.append(got)
            if sel is None:
                o, scores = _full(q, k_all, v_all, i, kv_len, tree, score_rows, score_mode, impl)
            elif full_when is None:
                o, scores = _sparse(q, k_all, v_all, i, kv_len, sel, tree, score_rows, score_mode, impl)
            else:
                o, scores = jax.lax.cond(
                    full_when, lambda q, k_all, v_all, sel: _full(q, k_all, v_all, i, kv_len, tree, score_rows,
                                                                 score_mode, impl),
                    lambda q, k_all, v_all, sel: _sparse(q, k_all, v_all, i, kv_len, sel, tree, score_rows,
                                                         score_mode, impl),
                    q, k_all, v_all, sel)
            all_scores.append(scores)
        if fused is not None:   # x + o @ wo; RMSNorm + gate/up GEMM + SwiGLU; x + act @ w_down
            run = functools.partial(fused.dense, implementation="pallas", interpret=impl.interpret)
            x2 = run(pad(o.astype(x.dtype).reshape(M, -1)), _flat(lp["wo"], 1, 3), i, mode="residual", aux=xs)
            act = run(x2, _flat(lp["w_gu"], 2), i, mode="glu", norm_w=lp["mlp_norm"], eps=eps)
            xs = run(act, lp["w_down"], i, mode="residual", aux=x2)
            continue
        # wo and w_down contract over the heads / F that tensor parallelism shards (jspec/sharding.py): their
        # outputs accumulate in f32 so the all-reduce of the partial sums is f32 and the result is rounded
        # once, as on one device (a bf16 all-reduce changed greedy tokens). Same numerics unsharded.
        x = x + jnp.einsum("BTNH,NHD->BTD", o.astype(x.dtype), p["wo"],
                           preferred_element_type=jnp.float32).astype(x.dtype)
        h = rms_norm(x, p["mlp_norm"], eps)
        g, u = _gate_up(h, p)
        x = x + jnp.einsum("BTF,FD->BTD", jax.nn.silu(g) * u, p["w_down"],
                           preferred_element_type=jnp.float32).astype(x.dtype)

    if fused is not None:
        x = xs[:M].reshape(B, T, -1)
    if logits_at is not None:
        x = jnp.take_along_axis(x, logits_at[:, :, None], axis=1)
    logits = _exact_head(params, cfg, x, impl) if fused is not None and impl.exact else None
    if logits is None:
        x = rms_norm(x, params["final_norm"], eps)
        head = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
        logits = jnp.einsum("BTD,DV->BTV", x, head, preferred_element_type=jnp.float32)
    n_new = jnp.full((B,), T, jnp.int32) if n_new is None else n_new.astype(jnp.int32)
    cache = kv_cache.KVCache(k=k_all, v=v_all, lengths=start + n_new)
    aux = {"scores": jnp.stack(all_scores)} if score_rows and all_scores else {}
    if probed:
        aux["probe"] = sum(probed[1:], probed[0])
    return logits, cache, aux


def _full(q, k_all, v_all, layer, kv_len, tree, score_rows, score_mode, impl):
    return attention.full(q, k_all, v_all, layer, kv_len, tree_mask=None if tree is None else tree.mask,
                          score_rows=score_rows, score_mode=score_mode, impl=impl)


def _sparse(q, k_all, v_all, layer, kv_len, sel, tree, score_rows, score_mode, impl):
    """Attention over the layer's selection (+ the new tokens, tree-masked for a tree) and, with score_rows,
    `attention.sparse_scores` (0 at the slots not read)."""
    idx, n = sel
    mask = None if tree is None else tree.mask
    o = attention.sparse(q, k_all, v_all, layer, kv_len, idx, n, tree_mask=mask, impl=impl)
    if not score_rows:
        return o, None
    return o, attention.sparse_scores(q, k_all, layer, kv_len, idx, n, score_rows=score_rows, score_mode=score_mode,
                                      tree_mask=mask)


def init_params(cfg: ModelConfig, key, *, scale: float = 0.02, dtype=None, mesh=None):
    """Random parameters in the model's layout (speed work on the big presets; tests on tiny configs).
    mesh: a tensor-parallel mesh (`sharding.make_mesh`): the weights are created directly in its sharded
    layout (`sharding.param_shardings`), never whole on one device."""
    if mesh is not None:
        return jax.jit(lambda k: init_params(cfg, k, scale=scale, dtype=dtype),
                       out_shardings=sharding.param_shardings(cfg, mesh))(key)
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
    return params


def param_bytes(params) -> int:
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(params))
