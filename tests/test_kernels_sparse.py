"""sparse_attention kernel vs the f32 reference (interpret mode on CPU, native on GPU)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pallas_kernels as pk
from _kernel_utils import (INTERPRET, assert_bitwise_equal, assert_close, compiled, lower_for_h200,
                           poison, ragged_lengths, random_index_sets, random_qkv, triton_calls)

F32, BF16 = jnp.float32, jnp.bfloat16
BS = pk.BlockSizes
_STATIC = ("tail", "block_sizes", "interpret")
kernel = compiled(pk.sparse_attention_kernel, *_STATIC)
reference = compiled(pk.sparse_attention_reference, *_STATIC)


def _inputs(seed, B, T, N, K, H, S, M, dtype, *, sort, tail, empty_row=True):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(seed, B, T, N, K, H, S, dtype)
    kv_len = ragged_lengths(rng, B, T + (0 if tail else 1), S)
    n_valid = np.minimum(rng.integers(0, M + 1, size=B), kv_len - T)
    n_valid[0] = min(M, kv_len[0] - T)  # a full index list
    if tail and empty_row and B >= 2:
        n_valid[1] = 0  # only the causal tail
    if not tail:
        n_valid = np.maximum(n_valid, 1)  # some key to attend to
    idx = random_index_sets(rng, M, kv_len, T, sort=sort, n_valid=n_valid)
    # Every slot the kernel may not read is junk: unselected slots 1e4, and past kv_len NaN in f32.
    selected = np.zeros((B, S), bool)
    for b in range(B):
        selected[b, idx[b, : n_valid[b]]] = True
        if tail:
            selected[b, kv_len[b] - T: kv_len[b]] = True
    k, v = poison(k, selected, 1e4), poison(v, selected, 1e4)
    if dtype == F32:
        in_cache = np.arange(S)[None, :] < kv_len[:, None]
        k, v = poison(k, in_cache), poison(v, in_cache)
    return q, k, v, jnp.asarray(idx), jnp.asarray(n_valid, jnp.int32), jnp.asarray(kv_len)


def _check(seed, B, T, N, K, H, S, M, dtype, *, sort=False, tail=True, block_sizes=None):
    args = _inputs(seed, B, T, N, K, H, S, M, dtype, sort=sort, tail=tail)
    out, lse = kernel(*args, tail=tail, block_sizes=block_sizes, interpret=INTERPRET)
    r_out, r_lse = reference(*args, tail=tail)
    assert out.dtype == dtype and lse.shape == (B, N, T)
    assert_close(out, r_out, dtype, "out")
    assert_close(lse, r_lse, dtype, "lse")


# (B, T, N, K, H, S, M, dtype, sorted, tail, block sizes)
CASES = [
    (3, 1, 9, 3, 64, 128, 24, F32, False, True, None),  # SmolLM2 draft step, G=3
    (3, 5, 8, 8, 128, 96, 40, F32, True, True, BS(block_k=16, num_splits=3)),  # G=1, split-K, sorted
    (2, 5, 32, 4, 64, 112, 50, BF16, False, True, BS(block_k=16)),  # G=8, auto splits
    (3, 4, 8, 2, 128, 64, 20, F32, False, False, BS(block_k=16, num_splits=2)),  # G=4, no tail
    (2, 16, 6, 2, 64, 80, 33, BF16, True, True, None),  # G=3, T=16 (verification)
]


@pytest.mark.parametrize("B,T,N,K,H,S,M,dtype,sort,tail,bs", CASES)
def test_matches_reference(B, T, N, K, H, S, M, dtype, sort, tail, bs):
    _check(2000 + T * 5 + S + M, B, T, N, K, H, S, M, dtype, sort=sort, tail=tail, block_sizes=bs)


@settings(max_examples=5, deadline=None)
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 8),
    K=st.sampled_from([1, 2]),
    G=st.sampled_from([1, 3, 4, 8]),
    H=st.sampled_from([64, 128]),
    S_extra=st.integers(0, 96),
    M=st.integers(1, 40),
    sort=st.booleans(),
    tail=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fuzz(B, T, K, G, H, S_extra, M, sort, tail, seed):
    S = max(32, T + 1 + S_extra)
    _check(seed, B, T, G * K, K, H, S, M, F32, sort=sort, tail=tail, block_sizes=BS(block_k=16))


def test_tail_only_equals_causal_attention():
    """n_valid = 0 everywhere: attention over the T newest tokens alone, i.e. flash with kv_len = T."""
    q, k, v = random_qkv(11, 2, 4, 8, 2, 64, 64, F32)
    kv_len = jnp.asarray([64, 30], jnp.int32)
    idx = jnp.zeros((2, 8), jnp.int32)
    out, lse = kernel(q, k, v, idx, jnp.zeros(2, jnp.int32), kv_len, tail=True, block_sizes=BS(block_k=16),
                      interpret=INTERPRET)
    shift = lambda x: jnp.stack([x[0, 60:64], x[1, 26:30]])  # the tail, moved to positions 0..T-1
    r_out, r_lse, _ = pk.flash_scores_reference(q, shift(k), shift(v), jnp.asarray([4, 4], jnp.int32))
    assert_close(out, r_out, F32, "out")
    assert_close(lse, r_lse, F32, "lse")


def test_deterministic():
    args = _inputs(12, 3, 5, 8, 8, 128, 96, 40, F32, sort=False, tail=True)
    run = lambda: kernel(*args, tail=True, block_sizes=BS(block_k=16, num_splits=3), interpret=INTERPRET)
    assert_bitwise_equal(run(), run())


def test_unsupported_head_dim_and_fallback():
    args = _inputs(13, 2, 2, 4, 2, 32, 48, 10, F32, sort=True, tail=True)
    with pytest.raises(NotImplementedError, match="head_dim=32"):
        pk.sparse_attention(*args, interpret=True, implementation="pallas")
    assert_bitwise_equal(pk.sparse_attention(*args, interpret=True), pk.xla.sparse_attention(*args))
    if jax.default_backend() != "gpu":
        with pytest.raises(NotImplementedError):
            pk.sparse_attention(*_inputs(14, 1, 2, 4, 2, 64, 48, 10, F32, sort=True, tail=True),
                                implementation="pallas")



def test_stacked_cache_layer_read_in_place():
    q, k, v, idx, n_valid, kv_len = _inputs(15, 2, 3, 8, 2, 64, 64, 12, F32, sort=False, tail=True)
    k_all, v_all = jnp.stack([k, k * 2]), jnp.stack([v, v * 2])
    kw = dict(tail=True, block_sizes=BS(block_k=16), interpret=INTERPRET)
    got = compiled(pk.sparse_attention_kernel, *_STATIC, "layer")(q, k_all, v_all, idx, n_valid, kv_len, layer=0,
                                                                  **kw)
    assert_bitwise_equal(got, kernel(q, k, v, idx, n_valid, kv_len, **kw))



def _per_layer_inputs(seed, qkv_seed, *, L, B, S, M, min_valid):
    """A draft step's operands as the model passes them (SmolLM2 heads, T=1): q, the stacked cache [L,B,S,K,H],
    every layer's selections idx [L,B,M] with n_valid [L,B] (>= min_valid), kv_len [B]."""
    rng = np.random.default_rng(seed)
    qkv = [random_qkv(qkv_seed + i, B, 1, 9, 3, 64, S, F32) for i in range(L)]
    k_all, v_all = jnp.stack([x[1] for x in qkv]), jnp.stack([x[2] for x in qkv])
    kv_len = ragged_lengths(rng, B, 1, S)
    n_valid = np.stack([np.minimum(rng.integers(min_valid, M + 1, size=B), kv_len - 1) for _ in range(L)])
    idx = np.stack([random_index_sets(rng, M, kv_len, 1, sort=False, n_valid=n_valid[i]) for i in range(L)])
    return (qkv[0][0], k_all, v_all, jnp.asarray(idx), jnp.asarray(n_valid, jnp.int32), jnp.asarray(kv_len))


@pytest.mark.parametrize("layer", [1, "traced"])
def test_per_layer_selections_read_at_layer(layer):
    """Every layer's selections [L,B,M] handed over whole (Vegas: no per-layer slice in XLA): the kernel reads
    row `layer` of idx and n_valid, and matches the one-layer call on that layer's selections and cache."""
    q, k_all, v_all, idx, n_valid, kv_len = _per_layer_inputs(7, 16, L=3, B=3, S=80, M=24, min_valid=0)
    kw = dict(tail=True, block_sizes=BS(block_k=16), interpret=INTERPRET)
    run = compiled(pk.sparse_attention_kernel, *_STATIC)
    lay = jnp.int32(1) if layer == "traced" else 1
    got = run(q, k_all, v_all, idx, n_valid, kv_len, layer=lay, **kw)
    want = run(q, k_all[1], v_all[1], idx[1], n_valid[1], kv_len, **kw)
    assert_bitwise_equal(got, want)
    ref = pk.sparse_attention_reference(q, k_all, v_all, idx, n_valid, kv_len, layer=1)
    assert_close(got[0], ref[0], F32, "out")
    with pytest.raises(ValueError, match="per-layer selections"):
        run(q, k_all[1], v_all[1], idx, n_valid, kv_len, **kw)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")  # DESIGN.md 3
@pytest.mark.parametrize("N,K,H", [(9, 3, 64), (32, 8, 128)])  # SmolLM2-135M, Llama-3-8B
@pytest.mark.parametrize("T", [1, 5])
def test_lowers_to_triton_at_model_shapes(N, K, H, T):
    sd = jax.ShapeDtypeStruct
    kv = sd((2, 8192, K, H), BF16)
    i32 = sd((2,), jnp.int32)
    hlo = lower_for_h200(pk.sparse_attention_kernel, sd((2, T, N, H), BF16), kv, kv, sd((2, 410), jnp.int32), i32,
                         i32)
    assert triton_calls(hlo) == 1


# Fused heads (`fuse_heads=True`): one program per sequence holds every KV head's packed query rows and
# gathers each selected position's heads together (adjacent cache rows); a query row sees its own head only.
FUSED_CASES = [   # (B, T, N, K, H, S, M, dtype, tail, block sizes)
    (3, 1, 9, 3, 64, 128, 24, F32, True, None),                  # SmolLM2 draft step: 9 rows, 3 heads -> 4 lanes
    (2, 5, 8, 4, 64, 112, 40, F32, True, BS(block_k=32, num_splits=2)),   # 40 rows, split-K, 8 entries/step
    (2, 1, 8, 2, 128, 96, 30, BF16, True, None),                 # H=128, 2 heads
    (3, 2, 12, 3, 64, 128, 50, F32, False, BS(block_k=64)),      # no tail, 16 entries/step
]


@pytest.mark.parametrize("B,T,N,K,H,S,M,dtype,tail,bs", FUSED_CASES)
def test_fused_heads_match_reference(B, T, N, K, H, S, M, dtype, tail, bs):
    args = _inputs(3000 + T + S + M, B, T, N, K, H, S, M, dtype, sort=False, tail=tail)
    fused = compiled(pk.sparse_attention_kernel, *_STATIC, "fuse_heads")
    out, lse = fused(*args, tail=tail, block_sizes=bs, interpret=INTERPRET, fuse_heads=True)
    r_out, r_lse = reference(*args, tail=tail)
    assert_close(out, r_out, dtype, "out")
    assert_close(lse, r_lse, dtype, "lse")


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")
def test_fused_heads_lower_to_one_triton_call_with_one_program_per_sequence():
    """At the draft step's shape the fused launch is one Triton kernel whose grid has no KV-head axis."""
    sd = jax.ShapeDtypeStruct
    B, S, L = 64, 8192, 2
    kv = sd((L, B, S, 3, 64), BF16)
    grid_x = {}
    for fuse in (True, False):
        hlo = lower_for_h200(pk.sparse_attention_kernel, sd((B, 1, 9, 64), BF16), kv, kv,
                             sd((L, B, 512), jnp.int32), sd((L, B), jnp.int32), sd((B,), jnp.int32), layer=1,
                             fuse_heads=fuse)
        assert triton_calls(hlo, "sparse_attention") == 1
        grid_x[fuse] = int(re.search(r"grid_x = (\d+)", hlo).group(1))
    assert grid_x == {True: B, False: B * 3}


def test_fused_heads_read_the_stacked_cache_and_per_layer_selections():
    """As the model calls it: every layer's selections [L,B,M] and the stacked cache read at a traced layer."""
    args = _per_layer_inputs(9, 40, L=3, B=2, S=96, M=20, min_valid=1)
    run = compiled(pk.sparse_attention_kernel, *_STATIC, "fuse_heads")
    got = run(*args, layer=jnp.int32(2), tail=True, interpret=INTERPRET, fuse_heads=True)
    ref = pk.sparse_attention_reference(*args, layer=2)
    assert_close(got[0], ref[0], F32, "out")
    assert_close(got[1], ref[1], F32, "lse")
