"""flash_scores kernel vs the f32 reference (interpret mode on CPU, native on GPU)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pallas_kernels as pk
from _kernel_utils import (INTERPRET, assert_bitwise_equal, assert_close, compiled, lower_for_h200,
                           poison_after, ragged_lengths, random_qkv, triton_calls)

F32, BF16 = jnp.float32, jnp.bfloat16
BS = pk.BlockSizes
_STATIC = ("score_rows", "score_mode", "block_sizes", "interpret")
kernel = compiled(pk.flash_scores_kernel, *_STATIC)
reference = compiled(pk.flash_scores_reference, *_STATIC)


def _check(seed, B, T, N, K, H, S, dtype, rows=(), mode="weights", block_sizes=None):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(seed, B, T, N, K, H, S, dtype)
    kv_len = ragged_lengths(rng, B, T, S)
    # Past kv_len the cache holds junk: NaN in f32 (any read poisons the row), huge finite in bf16.
    k, v = poison_after(k, v, kv_len, np.nan if dtype == F32 else 1e4)
    kv_len = jnp.asarray(kv_len)
    out, lse, scores = kernel(q, k, v, kv_len, score_rows=rows, score_mode=mode, block_sizes=block_sizes,
                              interpret=INTERPRET)
    r_out, r_lse, r_scores = reference(q, k, v, kv_len, score_rows=rows, score_mode=mode)
    assert out.dtype == q.dtype and lse.dtype == F32
    assert_close(out, r_out, dtype, "out")
    assert_close(lse, r_lse, dtype, "lse")
    if not rows:
        assert scores is None
        return
    assert scores.shape == (B, S) and scores.dtype == F32
    assert_close(scores, r_scores, dtype, "scores")
    invalid = np.arange(S)[None, :] > (np.asarray(kv_len) - T + max(r % T for r in rows))[:, None]
    assert (np.asarray(scores)[invalid] == 0).all(), "scores must be 0 where no score row may look"
    if mode == "weights":  # each (row, head) softmax sums to one (16-bit inputs: float16 logits, see the kernel)
        np.testing.assert_allclose(np.asarray(scores).sum(1), N * len(rows), rtol=1e-4 if dtype == F32 else 1e-3)


# (B, T, N, K, H, S, dtype, score_rows, mode, block sizes): GQA 1/3/4/8, head dims 64/128, T 1..16 plus
# prefill, forced split-K, several row blocks with scores, S not a power of two.
CASES = [
    (3, 1, 9, 3, 64, 128, F32, (0, -1), "weights", None),  # SmolLM2 decode shape (G=3), row 0 twice
    (3, 5, 8, 8, 128, 96, F32, (1, 4), "weights", BS(block_k=16, num_splits=3)),  # G=1, split-K
    (2, 5, 32, 4, 64, 80, BF16, (0, 4), "logits", BS(block_k=16, num_splits=2)),  # G=8
    (2, 16, 8, 2, 128, 64, F32, (), "weights", None),  # G=4, 64 packed rows
    (2, 2, 12, 3, 64, 48, BF16, (1,), "weights", BS(block_k=16, num_splits=2)),  # S not a power of 2
    (2, 1, 32, 8, 128, 64, F32, (0, -1), "logits", None),  # Llama-3-8B decode shape, row 0 twice
    (2, 64, 4, 1, 64, 128, F32, (3, 63), "weights", BS(block_m=32, block_k=32)),  # row blocks + scores
    (1, 128, 3, 3, 128, 160, BF16, (), "weights", None),  # prefill with the default blocks
    # One split over several key blocks, S past the epilogue's block, NaN junk past kv_len (f32) or float16
    # logits (bf16), a row counted twice.
    (3, 5, 9, 3, 64, 600, F32, (0, 4), "weights", BS(block_k=64, num_splits=1)),
    (2, 5, 9, 3, 64, 200, BF16, (0, 4), "weights", BS(block_k=32, num_splits=1)),
    (2, 1, 32, 8, 128, 96, F32, (0, -1), "weights", BS(block_k=16, num_splits=1)),
    (2, 6, 9, 3, 64, 320, BF16, (0, 5), "weights", None),  # Vegas at gamma 5: 18 rows, the 17-32-row defaults
]


@pytest.mark.parametrize("B,T,N,K,H,S,dtype,rows,mode,bs", CASES)
def test_matches_reference(B, T, N, K, H, S, dtype, rows, mode, bs):
    _check(1000 + T * 7 + H + S, B, T, N, K, H, S, dtype, rows, mode, bs)


@settings(max_examples=6, deadline=None)
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 12),
    K=st.sampled_from([1, 2]),
    G=st.sampled_from([1, 3, 4, 8]),
    H=st.sampled_from([64, 128]),
    S_extra=st.integers(0, 80),
    rows=st.sampled_from([(), (0,), (-1,), (0, -1)]),
    mode=st.sampled_from(["weights", "logits"]),
    splits=st.sampled_from([None, 2]),
    seed=st.integers(0, 2**16),
)
def test_fuzz(B, T, K, G, H, S_extra, rows, mode, splits, seed):
    S = max(16, T + S_extra)
    bs = BS(block_k=16, num_splits=splits) if splits else None
    _check(seed, B, T, G * K, K, H, S, F32, rows, mode, bs)


def test_deterministic():
    q, k, v = random_qkv(7, 2, 5, 8, 8, 128, 96, F32)
    kv_len = jnp.asarray([96, 40], jnp.int32)
    run = lambda: kernel(q, k, v, kv_len, score_rows=(1, 4), block_sizes=BS(block_k=16, num_splits=3),
                         interpret=INTERPRET)
    assert_bitwise_equal(run(), run())


def test_unsupported_head_dim_and_fallback():
    q, k, v = random_qkv(3, 2, 3, 4, 2, 96, 32, F32)
    kv_len = jnp.asarray([32, 10], jnp.int32)
    with pytest.raises(NotImplementedError, match="head_dim=96"):
        pk.flash_scores(q, k, v, kv_len, interpret=True, implementation="pallas")
    got = pk.flash_scores(q, k, v, kv_len, score_rows=(0,), interpret=True)  # falls back to the XLA path
    want = pk.flash_scores(q, k, v, kv_len, score_rows=(0,), implementation="xla")
    assert_bitwise_equal(want, pk.xla.flash_scores(q, k, v, kv_len, score_rows=(0,)))
    assert_bitwise_equal(got, want)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="CPU-only dispatch behaviour")
def test_cpu_without_interpret_falls_back():
    q, k, v = random_qkv(4, 1, 2, 4, 2, 64, 32, F32)
    kv_len = jnp.asarray([20], jnp.int32)
    with pytest.raises(NotImplementedError, match="GPU"):
        pk.flash_scores(q, k, v, kv_len, implementation="pallas")
    assert_bitwise_equal(pk.flash_scores(q, k, v, kv_len), pk.xla.flash_scores(q, k, v, kv_len))


def test_bad_arguments():
    q, k, v = random_qkv(5, 1, 2, 4, 2, 64, 32, F32)
    kv_len = jnp.asarray([20], jnp.int32)
    with pytest.raises(ValueError, match="score_mode"):
        pk.flash_scores_kernel(q, k, v, kv_len, score_rows=(0,), score_mode="probs", interpret=True)
    with pytest.raises(ValueError, match="score_rows"):
        pk.flash_scores_kernel(q, k, v, kv_len, score_rows=(2,), interpret=True)



def test_stacked_cache_layer_read_in_place():
    """k_all [L,B,S,K,H] with a static layer gives exactly the result of the sliced single layer."""
    q, k, v = random_qkv(8, 2, 5, 8, 2, 64, 64, F32)
    kv_len = jnp.asarray([64, 17], jnp.int32)
    k_all, v_all = jnp.stack([k * 3, k, -k]), jnp.stack([v * 3, v, -v])
    kw = dict(score_rows=(0, 4), block_sizes=BS(block_k=16, num_splits=2), interpret=INTERPRET)
    got = compiled(pk.flash_scores_kernel, "score_rows", "block_sizes", "interpret", "layer")(
        q, k_all, v_all, kv_len, layer=1, **kw)
    assert_bitwise_equal(got, kernel(q, k, v, kv_len, **kw))

@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")  # DESIGN.md 3
def test_model_layers_share_one_kernel():
    """The layer index is a runtime operand: a 4-layer verification forward lowers one flash_scores kernel
    (called once per layer), not one per layer (each would be a separate Triton compile)."""
    from conftest import tiny_config
    from jspec import kv_cache, model
    from jspec.attention import AttnImpl

    cfg = tiny_config("llama", n_layers=4, head_dim=64, dtype="bfloat16")
    sd = jax.ShapeDtypeStruct
    params = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
    cache = jax.eval_shape(lambda: kv_cache.init(cfg, batch=2, capacity=256))
    hlo = lower_for_h200(lambda p, c, t: model.forward(p, cfg, t, c, score_rows=(0, 4),
                                                       impl=AttnImpl(backend="pallas")),
                         params, cache, sd((2, 5), jnp.int32))
    assert triton_calls(hlo, "flash_scores") == 1
    assert triton_calls(hlo, "score_weights") == 1   # the weights epilogue, likewise shared
    assert triton_calls(hlo) == 2
    assert hlo.count("call @") >= cfg.n_layers   # ... called once per layer


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")  # DESIGN.md 3
@pytest.mark.parametrize("N,K,H", [(9, 3, 64), (32, 8, 128)])  # SmolLM2-135M, Llama-3-8B
@pytest.mark.parametrize("T,rows", [(1, ()), (5, (0, 4)), (6, (0, 5)), (256, ())])
def test_lowers_to_triton_at_model_shapes(N, K, H, T, rows):
    sd = jax.ShapeDtypeStruct
    kv = sd((2, 8192, K, H), BF16)
    for mode in ("weights", "logits") if rows else ("weights",):
        hlo = lower_for_h200(pk.flash_scores_kernel, sd((2, T, N, H), BF16), kv, kv, sd((2,), jnp.int32),
                             score_rows=rows, score_mode=mode)
        assert triton_calls(hlo, "flash_scores") == 1
        assert triton_calls(hlo) == 1 + (mode == "weights" and bool(rows))   # + the weights epilogue
        assert ("xf16>" in hlo) == (mode == "weights" and bool(rows))   # bf16 K/V: float16 score-row logits


@pytest.mark.parametrize("S,block_s,logits_dtype,R", [(200, 64, np.float32, 8), (48, 512, np.float32, 16),
                                                      (200, 64, np.float16, 8)])   # S % block != 0; S < block
def test_score_weights_epilogue_ignores_junk(S, block_s, logits_dtype, R):
    """The weights epilogue alone against numpy: NaN in padding rows, in rows past the R it reads and in
    positions a row may not see (the flash kernel leaves those unwritten) must not reach the result; each
    score row's LSE is gathered from its packed row's; float16 logits (16-bit K/V) are read as float32."""
    from pallas_kernels.flash_scores import score_weights

    rng = np.random.default_rng(0)
    B, K, Rp, T, Mp = 3, 3, 16, 5, 16
    sel = np.array([0, 1, 2, 12, 13, 14] + [0] * (R - 6), np.int32)       # packed rows (0, T-1) x G=3 heads
    rows_t = np.array([0, 0, 0, 4, 4, 4] + [0] * (R - 6), np.int32)
    mult = np.array([1.0] * 6 + [0.0] * (R - 6), np.float32)
    kv_len = np.array([S, S - 7, 20], np.int32)
    sc = rng.normal(size=(B, K, Rp, S)).astype(np.float32) * 3
    lse = rng.normal(size=(B, K, Mp)).astype(np.float32) + 5
    seen = np.arange(S)[None, None, :] < (kv_len[:, None, None] - T + rows_t[None, :, None] + 1)   # [B, R, S]
    sc[:, :, 6:] = np.nan
    sc[:, :, :R] = np.where(seen[:, None], sc[:, :, :R], np.nan)
    sc = sc.astype(logits_dtype)
    lse_sel = lse[:, :, sel]                                               # [B, K, R]
    want = np.exp(sc[:, :, :R].astype(np.float32) - lse_sel[..., None]) * mult[None, None, :, None]
    want = np.where(seen[:, None] & (mult[None, None, :, None] > 0), want, 0.0).sum(axis=(1, 2))
    got = score_weights(jnp.asarray(sc), jnp.asarray(lse), jnp.asarray(kv_len), jnp.asarray(sel),
                        jnp.asarray(rows_t), jnp.asarray(mult), T=T, interpret=INTERPRET, block_s=block_s)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_split_plan_avoids_a_badly_filled_last_wave():
    """Auto split-K: ~4 programs per SM, stepping down while the launch spills into a last wave < 90% busy."""
    from pallas_kernels import _common as C

    sms = C.num_sms()
    for blocks, programs, resident in [(63, 192, 3), (63, 48, 3), (63, 3, 3), (1000, 7, 2), (63, 900, 3),
                                       (256, 128, 1)]:
        splits, per = C.split_plan(blocks, programs, None, resident=resident)
        assert splits * per >= blocks and (splits - 1) * per < blocks          # every block in exactly one split
        assert per >= min(4, blocks)                                            # splits stay >= 4 blocks
        n, slots = splits * programs, resident * sms
        assert splits == 1 or n <= slots or n / (-(-n // slots) * slots) >= 0.9   # no badly filled last wave
    if sms == 132:   # the measured cases (H200; interpret mode assumes it)
        assert C.split_plan(63, 192, None, resident=3)[0] == 2      # SmolLM2 B=64: one wave, not 1.45
        assert C.split_plan(256, 128, None, resident=1)[0] == 5     # Llama-3-8B B=16: 4.85 waves, kept
    assert C.split_plan(63, 192, 5, resident=3)[0] == 5                         # an explicit count is kept
    bs = C.BlockSizes(block_k=128, num_stages=2)
    assert C.resident_programs(bs, 128, 64, jnp.bfloat16) == 3                  # 64 KB of K+V tiles each
    assert C.resident_programs(bs, 128, 128, jnp.bfloat16) == 1
