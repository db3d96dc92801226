"""pallas_kernels/dense.py: the fused decode-sized dense steps against float32 references, and the model
wired to them (AttnImpl.dense_rows) against its XLA path."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec import kv_cache, layers, model
from jspec.attention import AttnImpl
from jspec.config import ModelConfig
from pallas_kernels import dense as Dn
from tests._kernel_utils import INTERPRET

L, D, K, G, H, F = 2, 96, 2, 2, 64, 80
INV = 1.0 / (10000.0 ** (np.arange(0, H, 2) / H)).astype(np.float32)
TOL = {jnp.float32: dict(atol=1e-4, rtol=1e-4), jnp.bfloat16: dict(atol=6e-2, rtol=3e-2)}


def _rnd(seed, shape, dtype, scale=1.0):
    return (scale * jax.random.normal(jax.random.key(seed), shape)).astype(dtype)


def _case(mode, M, dtype, seed):
    nw = (1.0 + _rnd(seed, (L, D), jnp.float32, 0.1)).astype(dtype)
    if mode == "qkv_rope":
        x, w = _rnd(seed + 1, (M, D), dtype), _rnd(seed + 2, (L, D, K * (G + 2) * H), dtype, 0.1)
        pos = jax.random.randint(jax.random.key(seed + 3), (M,), 0, 9000)
        return x, w, dict(norm_w=nw, aux=pos, inv_freq=INV, head_dim=H, groups=G)
    if mode == "glu":
        return _rnd(seed + 1, (M, D), dtype), _rnd(seed + 2, (L, D, 2 * F), dtype, 0.1), dict(norm_w=nw)
    if mode == "head":   # one layer; odd seeds read a tied [1, V, D] embedding transposed
        V, t = 80, seed % 2 == 1
        w = _rnd(seed + 2, (1, V, D) if t else (1, D, V), dtype, 0.1)
        return _rnd(seed + 1, (M, D), dtype), w, dict(norm_w=nw[:1], w_transposed=t)
    a, w = _rnd(seed + 1, (M, F), dtype), _rnd(seed + 2, (L, F, D), dtype, 0.1)
    return a, w, dict(aux=_rnd(seed + 3, (M, D), dtype))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("mode", Dn.MODES)
def test_dense_matches_reference(mode, dtype):
    """Each mode at two row counts (one and several row blocks), both layers, a traced layer index."""
    for M, seed in ((16, 0), (80, 11)):
        x, w, kw = _case(mode, M, dtype, seed)
        for layer in (0, jnp.int32(1)) if mode != "head" else (0,):
            got = Dn.dense_kernel(x, w, layer, mode=mode, interpret=INTERPRET, **kw)
            want = Dn.dense_reference(x, w, layer, mode=mode, **kw)
            assert got.shape == want.shape and got.dtype == (jnp.float32 if mode == "head" else x.dtype)
            np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                       err_msg=f"{mode} M={M} layer={layer}", **TOL[dtype])


@pytest.mark.parametrize("mode", Dn.MODES)
def test_a_rows_result_does_not_depend_on_the_rows_per_program_or_the_launch(mode):
    """Exact mode's premise for the dense part: rows 16..31 of a 96-row launch equal, bit for bit, the same rows
    launched alone (16 rows), whatever the rows per program (16, 32 = 2 tiles, 96 -> 32: _block's divisor)."""
    x, w, kw = _case(mode, 96, jnp.bfloat16, 21)
    part = {k: (v[16:32] if k == "aux" else v) for k, v in kw.items()}
    alone = np.asarray(Dn.dense_kernel(x[16:32], w, 0, mode=mode, interpret=INTERPRET, block_m=16, **part))
    for bm in (16, 32, 64):
        got = np.asarray(Dn.dense_kernel(x, w, 0, mode=mode, interpret=INTERPRET, block_m=bm, **kw))
        np.testing.assert_array_equal(got[16:32], alone, err_msg=f"{mode} block_m={bm}")


def test_rows_per_program_grow_only_while_the_launch_stays_wide():
    """SwiGLU at SmolLM2's width (48 column blocks): 320 rows take 32-row programs (10 x 48 = 480 >= 256; 64 would
    leave 240); 64 rows stay at 16 (4 x 48 = 192); the LM head's 1536 column blocks take the cap when it divides."""
    assert Dn._rows_per_program(320, 48, 64) == 32
    assert Dn._rows_per_program(64, 48, 64) == 16
    assert Dn._rows_per_program(64, 1536, 128) == 64
    assert Dn._rows_per_program(384, 1536, 128) == 128
    assert Dn._rows_per_program(80, 1536, 128) == 16   # 80 = 16 x 5: no larger power of two divides it


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("extras", ["bias", "head_norm", "both"])
def test_qkv_rope_with_qwen_biases_and_head_norms_matches_reference(extras, dtype):
    """qkv_rope with Qwen2's q/k/v biases and/or Qwen3's per-head q/k norms (one weight per role, a traced layer)
    against the float32 reference, which adds the bias to every head and norms only q and k heads."""
    x, w, kw = _case("qkv_rope", 16, dtype, 31)
    if extras in ("bias", "both"):
        kw["bias"] = _rnd(32, (L, K * (G + 2) * H), dtype, 0.5)
    if extras in ("head_norm", "both"):
        kw["head_norm"] = (1.0 + _rnd(33, (L, 2, H), jnp.float32, 0.3)).astype(dtype)
    for layer in (0, jnp.int32(1)):
        got = Dn.dense_kernel(x, w, layer, mode="qkv_rope", interpret=INTERPRET, **kw)
        want = Dn.dense_reference(x, w, layer, mode="qkv_rope", **kw)
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                   err_msg=f"{extras} layer={layer}", **TOL[dtype])
        plain = Dn.dense_reference(x, w, layer, mode="qkv_rope", **{k: v for k, v in kw.items()
                                                                    if k not in ("bias", "head_norm")})
        assert np.abs(np.asarray(want, np.float32) - np.asarray(plain, np.float32)).max() > 0.1


def test_qkv_rope_head_norm_normalises_q_and_k_heads_only():
    """At position 0 (RoPE the identity) each q and k head of the output has RMS = its norm weight's RMS when
    the weight is constant, and the v heads are the plain projection."""
    x, w, kw = _case("qkv_rope", 16, jnp.float32, 41)
    kw["aux"] = jnp.zeros(16, jnp.int32)
    hn = jnp.stack([jnp.full((L, H), 2.0), jnp.full((L, H), 0.5)], axis=1)
    got = np.asarray(Dn.dense_kernel(x, w, 1, mode="qkv_rope", interpret=INTERPRET, head_norm=hn, **kw))
    plain = np.asarray(Dn.dense_kernel(x, w, 1, mode="qkv_rope", interpret=INTERPRET, **kw))
    heads, plain_heads = got.reshape(16, K, G + 2, H), plain.reshape(16, K, G + 2, H)
    rms = np.sqrt(np.mean(heads ** 2, axis=-1))
    np.testing.assert_allclose(rms[:, :, :G], 2.0, rtol=1e-3)
    np.testing.assert_allclose(rms[:, :, G], 0.5, rtol=1e-3)
    np.testing.assert_allclose(heads[:, :, G + 1], plain_heads[:, :, G + 1], atol=1e-6)


def test_rope_leaves_v_heads_alone_and_rotates_q_k():
    """With every position 0 RoPE is the identity; at other positions only the q and k heads change."""
    x, w, kw = _case("qkv_rope", 16, jnp.float32, 3)
    plain = Dn.dense_kernel(x, w, 0, mode="qkv_rope", interpret=INTERPRET, **{**kw, "aux": jnp.zeros(16, jnp.int32)})
    moved = Dn.dense_kernel(x, w, 0, mode="qkv_rope", interpret=INTERPRET, **kw)
    heads = lambda y: np.asarray(y).reshape(16, K, G + 2, H)   # noqa: E731
    np.testing.assert_allclose(heads(moved)[:, :, G + 1], heads(plain)[:, :, G + 1], atol=1e-6)
    assert np.abs(heads(moved)[:, :, : G + 1] - heads(plain)[:, :, : G + 1]).max() > 1e-2


def test_unsupported_shapes_raise():
    x, w, kw = _case("glu", 16, jnp.float32, 5)
    with pytest.raises(NotImplementedError, match="multiples of 16"):
        Dn.dense_kernel(x[:9], w, 0, mode="glu", interpret=True, **kw)
    with pytest.raises(NotImplementedError, match="2048"):
        Dn.check_shapes("residual", jax.ShapeDtypeStruct((16, 4096), jnp.bfloat16),
                        jax.ShapeDtypeStruct((2, 4096, 64), jnp.bfloat16), 0)
    with pytest.raises(ValueError, match="mode"):
        Dn.dense_kernel(x, w, 0, mode="swiglu", interpret=True)
    with pytest.raises(ValueError, match="norm_w"):
        Dn.dense_kernel(x, w, 0, mode="glu", interpret=True)
    with pytest.raises(ValueError, match="out of range"):
        Dn.dense_kernel(x, w, 2, mode="glu", interpret=True, **kw)
    with pytest.raises(ValueError, match="qkv_rope' only"):
        Dn.dense_kernel(x, w, 0, mode="glu", interpret=True, bias=jnp.zeros((L, 2 * F)), **kw)
    xq, wq, kq = _case("qkv_rope", 16, jnp.float32, 5)
    with pytest.raises(ValueError, match="bias must be"):
        Dn.dense_kernel(xq, wq, 0, mode="qkv_rope", interpret=True, bias=jnp.zeros((L, 16)), **kq)
    with pytest.raises(ValueError, match="head_norm must be"):
        Dn.dense_kernel(xq, wq, 0, mode="qkv_rope", interpret=True, head_norm=jnp.zeros((L, H)), **kq)


def _tiny(arch="llama"):
    return ModelConfig(arch=arch, vocab_size=96, d_model=96, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=64,
                       ffn_dim=96, dtype="float32", max_position=256)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_model_dense_path_equals_xla(arch):
    """model.forward with dense_rows on (Pallas, interpret on CPU): a one-token decode step and a 5-token step
    (with Collect-2-Query scores) give XLA's logits, scores and cache, at 16 / 80 rows and at 3 / 15 (padded);
    for Llama, Qwen2 (q/k/v biases) and Qwen3 (q/k norms)."""
    cfg = _tiny(arch)
    params = model.init_params(cfg, jax.random.key(21), scale=0.3)   # random biases (0.3) and norms (1 +- 0.1)
    pal = AttnImpl(backend="pallas", interpret=INTERPRET, dense_rows=128)
    xla = AttnImpl(backend="xla")
    assert isinstance(layers.for_step(params, cfg, 16, 1, pal), layers.Fused)
    for B in (16, 3):   # 3: 3 and 15 rows, padded to 16 inside forward
        toks = jax.random.randint(jax.random.key(9), (B, 22), 0, cfg.vocab_size)
        res = {}
        for name, impl in (("dense", pal), ("xla", xla)):
            cache = kv_cache.init(cfg, batch=B, capacity=32)
            _, cache, _ = model.forward(params, cfg, toks[:, :16], cache, impl=xla)
            a, cache, _ = model.forward(params, cfg, toks[:, 16:17], cache, impl=impl)
            b, cache, aux = model.forward(params, cfg, toks[:, 17:22], cache, score_rows=(1, 4), impl=impl)
            res[name] = (a, b, aux["scores"], cache.k, cache.v)
        for got, want in zip(res["dense"], res["xla"]):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=3e-4, rtol=3e-4, err_msg=f"{B=}")


def test_model_dense_path_is_used_only_where_it_applies():
    cfg = _tiny()
    params = model.init_params(cfg, jax.random.key(0))
    on = AttnImpl(backend="pallas", interpret=True, dense_rows=64)

    def fused(params, cfg, B, T, impl):
        return isinstance(layers.for_step(params, cfg, B, T, impl), layers.Fused)
    assert fused(params, cfg, 16, 4, on)
    assert not fused(params, cfg, 16, 5, on)                                    # more rows than dense_rows
    assert fused(params, cfg, 8, 1, on)                                         # padded to 16 rows by forward
    assert not fused(params, cfg, 64, 1, AttnImpl(backend="pallas", interpret=True))   # default off
    assert not fused(params, cfg, 64, 1, AttnImpl(backend="xla", dense_rows=64))
    for arch in ("qwen2", "qwen3"):   # q/k/v biases, q/k norms: in the fused launch too
        other = _tiny(arch)
        assert fused(model.init_params(other, jax.random.key(0)), other, 64, 1, on)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")  # DESIGN.md 3
@pytest.mark.parametrize("M", [64, 320])
def test_lowers_to_triton_at_smollm2_shapes(M):
    """Each mode lowers to one Triton custom call at SmolLM2-135M's shapes (D=576, 3+2 heads of 64 per KV
    head, F=1536): every op the kernels use has a Triton lowering rule."""
    from tests._kernel_utils import lower_for_cuda, triton_calls
    sd, bf = jax.ShapeDtypeStruct, jnp.bfloat16
    inv = np.ones(32, np.float32)
    cases = {
        "qkv_rope": (sd((M, 576), bf), sd((30, 576, 960), bf), sd((30, 576), bf), sd((M,), jnp.int32)),
        "glu": (sd((M, 576), bf), sd((30, 576, 3072), bf), sd((30, 576), bf), None),
        "residual": (sd((M, 1536), bf), sd((30, 1536, 576), bf), None, sd((M, 576), bf)),
        "head": (sd((M, 576), bf), sd((1, 49152, 576), bf), sd((1, 576), bf), None),   # tied embedding
    }
    for mode, (x, w, nw, aux) in cases.items():
        kw = dict(inv_freq=inv, head_dim=64, groups=3) if mode == "qkv_rope" else {}
        kw = dict(w_transposed=True) if mode == "head" else kw
        args = [a for a in (x, w, nw, aux) if a is not None]

        def fn(*a, mode=mode, kw=kw, has_nw=nw is not None, has_aux=aux is not None):
            it = iter(a[2:])
            return Dn.dense_kernel(a[0], a[1], 0 if mode == "head" else 7, mode=mode,
                                   norm_w=next(it) if has_nw else None,
                                   aux=next(it) if has_aux else None, **kw)
        hlo = lower_for_cuda(fn, *args)
        assert triton_calls(hlo, f"dense_{mode}") == 1, mode
    # Qwen2's biases with Qwen3's head norms, and a weight read transposed (bench/kernels.py's decode section)
    x, w, nw, pos = cases["qkv_rope"]
    extras = (sd((30, 960), bf), sd((30, 2, 64), bf))
    hlo = lower_for_cuda(lambda x, w, nw, pos, b, hn: Dn.dense_kernel(
        x, w, 7, mode="qkv_rope", norm_w=nw, aux=pos, inv_freq=inv, head_dim=64, groups=3, bias=b, head_norm=hn),
        x, w, nw, pos, *extras)
    assert triton_calls(hlo, "dense_qkv_rope") == 1
    x, _, nw, _ = cases["glu"]
    hlo = lower_for_cuda(lambda x, w, nw: Dn.dense_kernel(x, w, 7, mode="glu", norm_w=nw, w_transposed=True),
                         x, sd((30, 3072, 576), bf), nw)
    assert triton_calls(hlo, "dense_glu") == 1


@pytest.mark.parametrize("mode", ["qkv_rope", "glu", "residual"])
def test_a_transposed_weight_gives_the_same_bits(mode):
    """w_transposed reads the same weight as [L, Nc, Kd]: the same result, bit for bit (the dots see the same
    values in the same order; only the loads differ)."""
    x, w, kw = _case(mode, 16, jnp.bfloat16, 61)
    want = np.asarray(Dn.dense_kernel(x, w, 1, mode=mode, interpret=INTERPRET, **kw))
    got = np.asarray(Dn.dense_kernel(x, jnp.swapaxes(w, 1, 2), 1, mode=mode, interpret=INTERPRET, w_transposed=True,
                                     **kw))
    np.testing.assert_array_equal(got, want)
