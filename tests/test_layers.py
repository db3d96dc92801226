"""jspec/layers.py: each building block against a plain float32 numpy reference written here from the stored
weights (wq/wk/wv, w_gate/w_up), on fresh random inputs; the two dense implementations (XLA, fused Pallas
kernels in interpret mode) against each other; the stored layout refused."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec import kv_cache, layers, model
from jspec.attention import AttnImpl
from jspec.config import ModelConfig, RopeScaling
from jspec.errors import InputError

F32 = dict(atol=2e-5, rtol=2e-5)


def tiny(arch, **kw):
    base = dict(arch=arch, vocab_size=96, d_model=96, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=64,
                ffn_dim=96, rope_theta=10000.0, dtype="float32", max_position=256)
    if arch == "llama":
        base["rope_scaling"] = RopeScaling(factor=8.0, original_max_position=32)
    return ModelConfig(**{**base, **kw})


def _stored_and_fused(cfg, seed):
    stored = model.init_params(cfg, jax.random.key(seed), scale=0.3, stored=True)
    return stored, model.fuse_projections(stored, cfg)


def _layer(params, i=0):
    return jax.tree.map(lambda w: np.asarray(w[i], np.float32), params["layers"])


def _np_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _np_inv_freq(cfg):
    """Hugging Face's RoPE frequencies, frequency by frequency (Llama 3 scaling as its modeling code states it)."""
    H, rs = cfg.head_dim, cfg.rope_scaling
    out = []
    for j in range(H // 2):
        f = 1.0 / cfg.rope_theta ** (2 * j / H)
        if rs is not None:
            wavelen = 2 * math.pi / f
            if wavelen > rs.original_max_position / rs.low_freq_factor:
                f = f / rs.factor
            elif wavelen >= rs.original_max_position / rs.high_freq_factor:
                lo, hi = rs.low_freq_factor, rs.high_freq_factor
                s = (rs.original_max_position / wavelen - lo) / (hi - lo)
                f = (1 - s) * f / rs.factor + s * f
        out.append(f)
    return np.array(out)


def _np_rope(x, positions, cfg):
    """x [B, T, heads, H]: pairs (j, j + H/2) rotated by positions * inv_freq[j]."""
    ang = positions[:, :, None, None] * _np_inv_freq(cfg)      # [B, T, 1, H/2]
    a, b = np.split(x, 2, axis=-1)
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], axis=-1)


def _inputs(cfg, B=3, T=5, seed=0):
    r = np.random.default_rng(seed)
    x = r.standard_normal((B, T, cfg.d_model)).astype(np.float32)
    positions = r.integers(0, 200, (B, T)).astype(np.int32)
    o = r.standard_normal((B, T, cfg.n_heads, cfg.head_dim)).astype(np.float32)
    return x, positions, o


def test_rms_norm_against_numpy():
    r = np.random.default_rng(1)
    x, w = r.standard_normal((4, 7, 48)).astype(np.float32), r.standard_normal(48).astype(np.float32)
    np.testing.assert_allclose(layers.rms_norm(jnp.asarray(x), jnp.asarray(w), 1e-5), _np_norm(x, w, 1e-5), **F32)
    got = layers.rms_norm(jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16), 1e-5)
    assert got.dtype == jnp.bfloat16


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rope_against_numpy(arch):
    cfg = tiny(arch)
    np.testing.assert_allclose(layers._inv_freq(cfg), _np_inv_freq(cfg), rtol=1e-6)
    r = np.random.default_rng(2)
    x = r.standard_normal((2, 5, 3, cfg.head_dim)).astype(np.float32)
    pos = r.integers(0, 250, (2, 5)).astype(np.int32)
    np.testing.assert_allclose(layers.rope(jnp.asarray(x), jnp.asarray(pos), cfg), _np_rope(x, pos, cfg),
                               atol=1e-4, rtol=1e-4)   # f32 angles up to ~250 rad


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_xla_dense_against_numpy(arch):
    """Xla.qkv / out / mlp / head against the reference on the stored weights: the fused layout's GEMMs compute
    the same heads in the same order (Qwen2's biases, Qwen3's per-head norms included)."""
    cfg = tiny(arch)
    stored, params = _stored_and_fused(cfg, 3)
    sp, p = _layer(stored), jax.tree.map(lambda w: w[0], params["layers"])
    x, pos, o = _inputs(cfg)
    dense, eps = layers.Xla(cfg), cfg.norm_eps

    h = _np_norm(x, sp["attn_norm"], eps)
    q, k, v = (np.einsum("btd,dnh->btnh", h, sp[n]) for n in ("wq", "wk", "wv"))
    if cfg.qkv_bias:
        q, k, v = q + sp["bq"], k + sp["bk"], v + sp["bv"]
    if cfg.qk_norm:
        q, k = _np_norm(q, sp["q_norm"], eps), _np_norm(k, sp["k_norm"], eps)
    want = (_np_rope(q, pos, cfg), _np_rope(k, pos, cfg), v)
    got = dense.qkv(*dense.enter(jnp.asarray(x), jnp.asarray(pos)), p, 0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)

    np.testing.assert_allclose(dense.out(jnp.asarray(x), jnp.asarray(o), p, 0),
                               x + np.einsum("btnh,nhd->btd", o, sp["wo"]), atol=1e-4, rtol=1e-4)
    h = _np_norm(x, sp["mlp_norm"], eps)
    g, u = h @ sp["w_gate"], h @ sp["w_up"]
    np.testing.assert_allclose(dense.mlp(jnp.asarray(x), p, 0), x + (g / (1 + np.exp(-g)) * u) @ sp["w_down"],
                               atol=1e-4, rtol=1e-4)
    head = np.asarray(stored["embed"]).T if cfg.tie_embeddings else np.asarray(stored["lm_head"])
    np.testing.assert_allclose(dense.head(params, jnp.asarray(x)),
                               _np_norm(x, np.asarray(stored["final_norm"]), eps) @ head, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("B, T", [(3, 5), (16, 1)])   # 15 rows padded to 16; 16 rows
def test_fused_dense_equals_xla(B, T):
    """The fused Pallas implementation (interpret mode) computes what the XLA one does, block by block, and
    the exact-mode LM head likewise."""
    cfg = tiny("llama")
    params = model.init_params(cfg, jax.random.key(4), scale=0.3)
    impl = AttnImpl(backend="pallas", interpret=True, exact=True)
    fused, xla = layers.for_step(params, cfg, B, T, impl), layers.Xla(cfg)
    assert isinstance(fused, layers.Fused)
    p = jax.tree.map(lambda w: w[1], params["layers"])
    x, pos, o = (jnp.asarray(a) for a in _inputs(cfg, B, T, seed=5))
    xs, ps = fused.enter(x, pos)
    assert xs.shape[0] % 16 == 0
    for g, w in zip(fused.qkv(xs, ps, p, 1), xla.qkv(x, pos, p, 1)):
        np.testing.assert_allclose(g, w, atol=3e-4, rtol=3e-4)
    np.testing.assert_allclose(fused.leave(fused.out(xs, o, p, 1)), xla.out(x, o, p, 1), atol=3e-4, rtol=3e-4)
    np.testing.assert_allclose(fused.leave(fused.mlp(xs, p, 1)), xla.mlp(x, p, 1), atol=3e-4, rtol=3e-4)
    np.testing.assert_allclose(fused.head(params, x), xla.head(params, x), atol=3e-4, rtol=3e-4)


def test_for_step_picks_xla_where_the_kernels_do_not_apply():
    cfg = tiny("llama")
    params = model.init_params(cfg, jax.random.key(0))
    assert isinstance(layers.for_step(params, cfg, 2, 1, AttnImpl()), layers.Xla)                  # default
    assert isinstance(layers.for_step(params, cfg, 2, 1, AttnImpl(backend="xla")), layers.Xla)
    exact = AttnImpl(backend="pallas", interpret=True, exact=True)
    for arch in ("llama", "qwen2", "qwen3"):   # every family's layer is fused...
        c = tiny(arch)
        assert isinstance(layers.for_step(model.init_params(c, jax.random.key(0)), c, 2, 1, exact), layers.Fused)
    wide = tiny("qwen3", ffn_dim=2064)   # ...but a contraction over 2048 keeps XLA's GEMMs
    assert isinstance(layers.for_step(model.init_params(wide, jax.random.key(0)), wide, 2, 1, exact), layers.Xla)


def test_the_stored_layout_is_refused():
    cfg = tiny("qwen2")
    stored, fused = _stored_and_fused(cfg, 0)
    layers.check_layout(fused)
    with pytest.raises(InputError, match="stored layout"):
        layers.check_layout(stored)
    with pytest.raises(InputError, match="fuse_projections"):
        model.forward(stored, cfg, jnp.zeros((1, 3), jnp.int32), kv_cache.init(cfg, batch=1, capacity=8))
