"""A decoder layer's building blocks: RMSNorm, RoPE, and the dense part of a layer behind one interface.

The dense part (norm -> q/k/v projection -> RoPE; the output projection + residual; norm -> SwiGLU MLP +
residual; the final norm + LM head) has two implementations with the same methods:

    Xla     einsums and XLA's fusions: every step by default, every model family.
    Fused   the fused Pallas launches of pallas_kernels/dense.py (RMSNorm + GEMM + RoPE / SwiGLU / residual
            in one kernel each): exact mode and `AttnImpl.dense_rows`. A row's rounding does not depend on
            how many rows the step has, which is what exact mode needs (docs/methods.md, "Lossless").

`for_step` picks one per step. Both read the fused runtime weight layout (config.py): q/k/v as one weight
wqkv [L, D, K, G+2, H] and gate/up as one w_gu [L, D, 2, F], so each pair is one GEMM per layer.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from jspec.attention import AttnImpl
from jspec.config import ModelConfig
from jspec.errors import InputError


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


def check_layout(params) -> None:
    """Raise InputError unless `params` is the fused runtime layout (wqkv, w_gu) that `forward` runs."""
    lp = params["layers"]
    if "wqkv" not in lp or "w_gu" not in lp:
        raise InputError(
            "the model runs the fused weight layout (layers.wqkv [L, D, K, G+2, H] and layers.w_gu [L, D, 2, F]), "
            f"got layers with {sorted(lp)}: the stored layout (wq/wk/wv, w_gate/w_up) is for checkpoints only; "
            "convert it with jspec.model.fuse_projections(params, cfg) (jspec.load and model.init_params "
            "already return the fused layout)")


def xla_head(params, cfg: ModelConfig, x):
    """Final RMSNorm + LM head (the tied embedding when cfg.tie_embeddings): f32 logits [B, R, V]."""
    x = rms_norm(x, params["final_norm"], cfg.norm_eps)
    head = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
    return jnp.einsum("BTD,DV->BTV", x, head, preferred_element_type=jnp.float32)


class Xla(NamedTuple):
    """The dense part as einsums (XLA). The residual stream is x [B, T, D]; `p` is layer i's weights."""

    cfg: ModelConfig

    def enter(self, x, positions):
        """The residual stream and the RoPE positions this implementation threads through the layers."""
        return x, positions

    def qkv(self, x, positions, p, i):
        """RMSNorm -> q/k/v projection (+ Qwen2's biases, Qwen3's per-head norms) -> RoPE: q [B, T, N, H], k, v
        [B, T, K, H]."""
        cfg = self.cfg
        h = rms_norm(x, p["attn_norm"], cfg.norm_eps)
        y = jnp.einsum("BTD,DKJH->BTKJH", h, p["wqkv"])
        G = cfg.n_heads // cfg.n_kv_heads
        B, T = h.shape[:2]
        q, k, v = y[:, :, :, :G].reshape(B, T, cfg.n_heads, -1), y[:, :, :, G], y[:, :, :, G + 1]
        if cfg.qkv_bias:
            q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
        if cfg.qk_norm:  # Qwen3 normalises each head before RoPE
            q, k = rms_norm(q, p["q_norm"], cfg.norm_eps), rms_norm(k, p["k_norm"], cfg.norm_eps)
        return rope(q, positions, cfg), rope(k, positions, cfg), v

    # wo and w_down contract over the heads / F that tensor parallelism shards (jspec/sharding.py): their
    # outputs accumulate in f32 so the all-reduce of the partial sums is f32 and the result is rounded once,
    # as on one device (a bf16 all-reduce changed greedy tokens). Same numerics unsharded.
    def out(self, x, o, p, i):
        """x + o @ wo, for the attention output o [B, T, N, H]."""
        return x + jnp.einsum("BTNH,NHD->BTD", o.astype(x.dtype), p["wo"],
                              preferred_element_type=jnp.float32).astype(x.dtype)

    def mlp(self, x, p, i):
        """x + SwiGLU(RMSNorm(x)): gate/up as one GEMM, then w_down."""
        h = rms_norm(x, p["mlp_norm"], self.cfg.norm_eps)
        y = jnp.einsum("BTD,DJF->BTJF", h, p["w_gu"])
        g, u = y[:, :, 0], y[:, :, 1]
        return x + jnp.einsum("BTF,FD->BTD", jax.nn.silu(g) * u, p["w_down"],
                              preferred_element_type=jnp.float32).astype(x.dtype)

    def leave(self, x):
        """The stream back as [B, T, D]."""
        return x

    def head(self, params, x):
        return xla_head(params, self.cfg, x)


class Fused(NamedTuple):
    """The dense part as fused Pallas launches (pallas_kernels/dense.py). The stream is [Mp, D] rows, zero rows
    padding the step's M = B*T tokens to the kernels' 16-row blocks. The kernels read the stacked weights at
    the runtime layer index i in place (no per-layer copy); `p` is unused."""

    cfg: ModelConfig
    lp: dict            # params["layers"], stacked
    B: int
    T: int
    interpret: bool
    exact: bool         # exact mode: the LM head on the dense kernel too

    def _pad(self, a):
        M = self.B * self.T
        return jnp.pad(a, ((0, _pad16(M) - M),) + ((0, 0),) * (a.ndim - 1))

    def _run(self, x, w, i, **kw):
        from pallas_kernels import dense
        return dense.dense(x, w, i, implementation="pallas", interpret=self.interpret, **kw)

    def enter(self, x, positions):
        M = self.B * self.T
        return self._pad(x.reshape(M, -1)), self._pad(positions.reshape(M))

    def qkv(self, x, positions, p, i):
        """RMSNorm + q/k/v GEMM (+ Qwen2's biases, Qwen3's per-head norms) + RoPE in one launch."""
        cfg = self.cfg
        y = self._run(x, _flat(self.lp["wqkv"], 2), i, mode="qkv_rope", norm_w=self.lp["attn_norm"],
                      eps=cfg.norm_eps, aux=positions, inv_freq=_inv_freq(cfg), head_dim=cfg.head_dim,
                      groups=cfg.group, **_qkv_extras(self.lp, cfg))
        y = y[:self.B * self.T].reshape(self.B, self.T, cfg.n_kv_heads, cfg.group + 2, cfg.head_dim)
        return y[:, :, :, :cfg.group].reshape(self.B, self.T, cfg.n_heads, -1), y[:, :, :, -2], y[:, :, :, -1]

    def out(self, x, o, p, i):
        """x + o @ wo."""
        return self._run(self._pad(o.astype(x.dtype).reshape(self.B * self.T, -1)), _flat(self.lp["wo"], 1, 3), i,
                         mode="residual", aux=x)

    def mlp(self, x, p, i):
        """RMSNorm + gate/up GEMM + SwiGLU in one launch; then x + act @ w_down."""
        act = self._run(x, _flat(self.lp["w_gu"], 2), i, mode="glu", norm_w=self.lp["mlp_norm"], eps=self.cfg.norm_eps)
        return self._run(act, self.lp["w_down"], i, mode="residual", aux=x)

    def leave(self, x):
        return x[:self.B * self.T].reshape(self.B, self.T, -1)

    def head(self, params, x):
        """Exact mode: final RMSNorm + LM head on the dense kernel (rows independent of each other, like the
        layers'), where it tiles the head; else XLA's."""
        logits = _exact_head(params, self.cfg, x, self.interpret) if self.exact else None
        return xla_head(params, self.cfg, x) if logits is None else logits


Dense = Union[Xla, Fused]


def _qkv_extras(lp, cfg: ModelConfig) -> dict:
    """The qkv_rope launch's optional operands for this family: `bias` [L, K*(G+2)*H] (Qwen2's bq/bk/bv in wqkv's
    column order, per KV head its G query heads, then k, then v) and `head_norm` [L, 2, H] (Qwen3's q_norm and
    k_norm). Built from the stacked weights once per step, for all layers."""
    out = {}
    if cfg.qkv_bias:
        L, K, G, H = lp["bk"].shape[0], cfg.n_kv_heads, cfg.group, cfg.head_dim
        b = jnp.concatenate([lp["bq"].reshape(L, K, G, H), lp["bk"][:, :, None], lp["bv"][:, :, None]], axis=2)
        out["bias"] = b.reshape(L, -1).astype(lp["wqkv"].dtype)
    if cfg.qk_norm:
        out["head_norm"] = jnp.stack([lp["q_norm"], lp["k_norm"]], axis=1).astype(lp["wqkv"].dtype)
    return out


def for_step(params, cfg: ModelConfig, B: int, T: int, impl: AttnImpl) -> Dense:
    """The dense implementation for a step of T tokens per sequence, M = B*T in all: `Fused` where this step's
    layers can run as fused launches (M <= AttnImpl.dense_rows, or exact mode), else `Xla`.

    The fused launches cover every supported family (Llama, Qwen2's q/k/v biases, Qwen3's q/k norms) at shapes
    the kernels tile (rows are padded to a multiple of 16); anything else (CPU without interpret, tensor
    parallelism) keeps XLA's path. Raises InputError for the stored weight layout (`check_layout`).
    """
    check_layout(params)
    M = B * T
    if impl.backend == "xla" or impl.mesh is not None or (M > impl.dense_rows and not impl.exact):
        return Xla(cfg)
    from pallas_kernels import _common, dense
    lp = params["layers"]
    try:
        _common.check_platform(impl.interpret)
        x = jax.ShapeDtypeStruct((_pad16(M), cfg.d_model), lp["wqkv"].dtype)
        dense.check_shapes("qkv_rope", x, _flat(lp["wqkv"], 2), 0, head_dim=cfg.head_dim, groups=cfg.group,
                           **jax.eval_shape(lambda: _qkv_extras(lp, cfg)))
        dense.check_shapes("glu", x, _flat(lp["w_gu"], 2), 0)
        dense.check_shapes("residual", jax.ShapeDtypeStruct((x.shape[0], cfg.ffn_dim), x.dtype), lp["w_down"], 0)
        dense.check_shapes("residual", jax.ShapeDtypeStruct((x.shape[0], cfg.n_heads * cfg.head_dim), x.dtype),
                           _flat(lp["wo"], 1, 3), 0)
    except NotImplementedError:
        return Xla(cfg)
    return Fused(cfg, lp, B, T, impl.interpret, impl.exact)


def exact_supported(params, cfg: ModelConfig, impl: AttnImpl) -> bool:
    """Whether `impl` (with exact=True) runs this model's one-token and verification steps exactly: the fused
    dense kernels tile its layers and head and the attention kernels run here (docs/methods.md, "Lossless")."""
    from pallas_kernels import _common, dense   # for_step also checks that Pallas runs here
    if (not impl.exact or not isinstance(for_step(params, cfg, 16, 1, impl), Fused)
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


def _exact_head(params, cfg: ModelConfig, x, interpret: bool):
    """Final RMSNorm + LM head on the dense kernel, f32 logits [B, R, V]; None where it does not tile the head."""
    from pallas_kernels import dense
    B, R, D = x.shape
    M = _pad16(B * R)
    w, wt = _head_args(params, cfg)
    try:
        dense.check_shapes("head", jax.ShapeDtypeStruct((M, D), x.dtype), w, 0, w_transposed=wt)
    except NotImplementedError:
        return None
    xs = jnp.pad(x.reshape(B * R, D), ((0, M - B * R), (0, 0)))
    return dense.dense(xs, w, 0, mode="head", norm_w=params["final_norm"][None], eps=cfg.norm_eps,
                       w_transposed=wt, implementation="pallas", interpret=interpret)[:B * R].reshape(B, R, -1)


def _pad16(M: int) -> int:
    return -(-M // 16) * 16


def _flat(w, start, stop=None):
    """Merge axes start..stop-1 (default: through the last) of a stacked weight into one (a free reshape)."""
    stop = w.ndim if stop is None else stop
    return w.reshape(*w.shape[:start], -1, *w.shape[stop:])
