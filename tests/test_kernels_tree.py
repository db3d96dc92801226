"""tree_attention kernel vs the f32 reference and vs dense attention with an explicitly built mask."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pallas_kernels as pk
from _kernel_utils import (INTERPRET, assert_bitwise_equal, assert_close, compiled, lower_for_h200,
                           poison_after, random_qkv, random_tree_mask, triton_calls)

F32, BF16 = jnp.float32, jnp.bfloat16
BS = pk.BlockSizes
_STATIC = ("block_sizes", "interpret")
kernel = compiled(pk.tree_attention_kernel, *_STATIC)
reference = compiled(pk.tree_attention_reference, *_STATIC)
dense = compiled(pk.masked_attention_reference)


def _inputs(seed, B, n, N, K, H, S, dtype):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(seed, B, n, N, K, H, S, dtype)
    prefix_len = rng.integers(0, S - n + 1, size=B)
    prefix_len[0] = S - n  # the tree fills the cache
    if B >= 2:
        prefix_len[1] = 0  # no prefix: the tree part alone
    # Slots after the tree are junk the kernel must never read.
    k, v = poison_after(k, v, prefix_len + n, np.nan if dtype == F32 else 1e4)
    return q, k, v, jnp.asarray(prefix_len, jnp.int32), jnp.asarray(random_tree_mask(rng, B, n))


def _explicit_mask(prefix_len, tree_mask, S):
    """[B,n,S] built position by position: all prefix slots, then the tree slots the node may see."""
    B, n, _ = tree_mask.shape
    mask = np.zeros((B, n, S), bool)
    for b in range(B):
        p = int(prefix_len[b])
        mask[b, :, :p] = True
        mask[b, :, p: p + n] = np.asarray(tree_mask[b])
    return jnp.asarray(mask)


def _check(seed, B, n, N, K, H, S, dtype, block_sizes=None, against_dense=False):
    args = _inputs(seed, B, n, N, K, H, S, dtype)
    out, lse = kernel(*args, block_sizes=block_sizes, interpret=INTERPRET)
    assert out.dtype == dtype and lse.shape == (B, N, n)
    r_out, r_lse = reference(*args)
    assert_close(out, r_out, dtype, "out")
    assert_close(lse, r_lse, dtype, "lse")
    if against_dense:
        q, k, v, prefix_len, tree_mask = args
        d_out, d_lse = dense(q, k, v, _explicit_mask(prefix_len, tree_mask, S))
        assert_close(out, d_out, dtype, "out", "vs dense attention with the full mask")
        assert_close(lse, d_lse, dtype, "lse", "vs dense attention with the full mask")


# (B, n, N, K, H, S, dtype, block sizes)
CASES = [
    (3, 7, 9, 3, 64, 64, F32, None),  # G=3
    (2, 16, 8, 8, 128, 96, F32, BS(block_m=16, block_k=16, num_splits=3)),  # G=1, split prefix, 1 tree block
    (2, 20, 32, 4, 64, 80, BF16, BS(block_m=32, block_k=16)),  # G=8, row blocks, several tree blocks
    (2, 12, 8, 2, 128, 48, BF16, None),  # G=4
    (2, 45, 6, 2, 64, 112, F32, BS(block_m=32, block_k=16, num_splits=2)),  # a deeper tree: 3 tree key blocks
]


@pytest.mark.parametrize("B,n,N,K,H,S,dtype,bs", CASES)
def test_matches_reference_and_dense(B, n, N, K, H, S, dtype, bs):
    _check(3000 + n + S, B, n, N, K, H, S, dtype, bs, against_dense=True)


@settings(max_examples=5, deadline=None)
@given(
    B=st.integers(1, 3),
    n=st.integers(1, 24),
    K=st.sampled_from([1, 2]),
    G=st.sampled_from([1, 3, 4, 8]),
    H=st.sampled_from([64, 128]),
    S_extra=st.integers(0, 64),
    seed=st.integers(0, 2**16),
)
def test_fuzz(B, n, K, G, H, S_extra, seed):
    _check(seed, B, n, G * K, K, H, max(16, n + S_extra), F32, BS(block_m=32, block_k=16, num_splits=2))


def test_chain_tree_equals_causal_flash():
    """A chain (each node's parent is the previous one) is ordinary causal attention."""
    q, k, v = random_qkv(21, 2, 6, 8, 2, 64, 64, F32)
    prefix_len = jnp.asarray([58, 20], jnp.int32)
    chain = jnp.broadcast_to(jnp.tril(jnp.ones((6, 6), bool)), (2, 6, 6))
    out, lse = kernel(q, k, v, prefix_len, chain, interpret=INTERPRET)
    r_out, r_lse, _ = pk.flash_scores_reference(q, k, v, prefix_len + 6)
    assert_close(out, r_out, F32, "out")
    assert_close(lse, r_lse, F32, "lse")


def test_deterministic():
    args = _inputs(22, 2, 16, 8, 8, 128, 96, F32)
    run = lambda: kernel(*args, block_sizes=BS(block_m=16, block_k=16, num_splits=3), interpret=INTERPRET)
    assert_bitwise_equal(run(), run())


def test_merge_is_exact():
    """sigmoid(lse_a - lse_b) merging of two disjoint key sets equals attention over their union."""
    q, k, v = random_qkv(23, 1, 3, 4, 2, 64, 40, F32)
    left = jnp.broadcast_to(jnp.arange(40) < 25, (1, 3, 40))
    o_a, l_a = dense(q, k, v, left)
    o_b, l_b = dense(q, k, v, ~left)
    o, l = pk.merge_partials(o_a, jnp.swapaxes(l_a, 1, 2), o_b, jnp.swapaxes(l_b, 1, 2))  # lse as [B,T,N]
    r_o, r_l = dense(q, k, v, jnp.ones((1, 3, 40), bool))
    assert_close(o, r_o, F32, "out")
    assert_close(l, jnp.swapaxes(r_l, 1, 2), F32, "lse")


def test_unsupported_head_dim_and_fallback():
    args = _inputs(24, 2, 4, 4, 2, 80, 32, F32)
    with pytest.raises(NotImplementedError, match="head_dim=80"):
        pk.tree_attention(*args, interpret=True, implementation="pallas")
    assert_bitwise_equal(pk.tree_attention(*args, interpret=True), pk.xla.tree_attention(*args))
    if jax.default_backend() != "gpu":
        with pytest.raises(NotImplementedError):
            pk.tree_attention(*_inputs(25, 1, 4, 4, 2, 64, 32, F32), implementation="pallas")



def test_stacked_cache_layer_read_in_place():
    q, k, v, prefix_len, tree_mask = _inputs(26, 2, 6, 8, 2, 64, 48, F32)
    k_all, v_all = jnp.stack([k * 2, k]), jnp.stack([v * 2, v])
    kw = dict(block_sizes=BS(block_m=16, block_k=16), interpret=INTERPRET)
    got = compiled(pk.tree_attention_kernel, *_STATIC, "layer")(q, k_all, v_all, prefix_len, tree_mask, layer=1,
                                                                **kw)
    assert_bitwise_equal(got, kernel(q, k, v, prefix_len, tree_mask, **kw))

@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")  # DESIGN.md 3
@pytest.mark.parametrize("N,K,H", [(9, 3, 64), (32, 8, 128)])  # SmolLM2-135M, Llama-3-8B
@pytest.mark.parametrize("n", [16, 68])  # 68: LongSpec's default tree (4 + 4*16)
def test_lowers_to_triton_at_model_shapes(N, K, H, n):
    sd = jax.ShapeDtypeStruct
    kv = sd((2, 8192, K, H), BF16)
    hlo = lower_for_h200(pk.tree_attention_kernel, sd((2, n, N, H), BF16), kv, kv, sd((2,), jnp.int32),
                         sd((2, n, n), jnp.bool_))
    assert triton_calls(hlo) == 2  # prefix flash + tree part


# ---- sparse_tree_attention: a tree over selected prefix entries (Dustin's sparse tree verification) ----------

sparse_tree_kernel = compiled(pk.sparse_tree_attention_kernel, *_STATIC)
sparse_tree_reference = compiled(pk.sparse_tree_attention_reference, *_STATIC)


def _sparse_tree_inputs(seed, B, n, N, K, H, S, M, dtype):
    from _kernel_utils import random_index_sets
    q, k, v, prefix_len, tree_mask = _inputs(seed, B, n, N, K, H, S, dtype)
    rng = np.random.default_rng(seed + 1)
    pl_ = np.asarray(prefix_len)
    n_valid = np.minimum(pl_, rng.integers(0, M + 1, size=B))
    idx = random_index_sets(rng, M, pl_ + n, n, sort=False, n_valid=n_valid)
    return q, k, v, jnp.asarray(idx), jnp.asarray(n_valid, jnp.int32), prefix_len, tree_mask


def _masked_over_selection(q, k, v, idx, n_valid, prefix_len, tree_mask):
    """Dense attention over the whole cache with an explicit mask: the selected prefix slots + the tree's."""
    B, n = tree_mask.shape[:2]
    S = k.shape[1]
    mask = np.zeros((B, n, S), bool)
    for b in range(B):
        mask[b, :, np.asarray(idx[b, :int(n_valid[b])])] = True
        p = int(prefix_len[b])
        mask[b, :, p:p + n] = np.asarray(tree_mask[b])
    return dense(q, k, v, jnp.asarray(mask))


@pytest.mark.parametrize("B,n,N,K,H,S,M,dtype", [
    (3, 7, 9, 3, 64, 64, 20, F32),     # G=3 (SmolLM2's), some rows with no prefix (n_valid 0)
    (2, 16, 8, 2, 128, 96, 40, F32),   # G=4
    (2, 12, 8, 2, 128, 48, 16, BF16),
])
def test_sparse_tree_matches_reference_and_masked_dense(B, n, N, K, H, S, M, dtype):
    args = _sparse_tree_inputs(4000 + n + S, B, n, N, K, H, S, M, dtype)
    out, lse = sparse_tree_kernel(*args, interpret=INTERPRET)
    assert out.dtype == dtype and lse.shape == (B, N, n)
    r_out, r_lse = sparse_tree_reference(*args)
    assert_close(out, r_out, dtype, "out")
    assert_close(lse, r_lse, dtype, "lse")
    d_out, d_lse = _masked_over_selection(*args)
    assert_close(out, d_out, dtype, "out", "vs dense attention masked to the selection + tree")
    assert_close(lse, d_lse, dtype, "lse", "vs dense attention masked to the selection + tree")


def test_sparse_tree_with_every_prefix_slot_equals_tree_attention():
    q, k, v, prefix_len, tree_mask = _inputs(27, 2, 6, 8, 2, 64, 48, F32)
    M = 48
    idx = jnp.broadcast_to(jnp.arange(M, dtype=jnp.int32), (2, M))
    got = sparse_tree_kernel(q, k, v, idx, prefix_len, prefix_len, tree_mask, interpret=INTERPRET)
    want = kernel(q, k, v, prefix_len, tree_mask, interpret=INTERPRET)
    assert_close(got[0], want[0], F32, "out")
    assert_close(got[1], want[1], F32, "lse")
