"""The production XLA path (pallas_kernels/xla.py, every op's fallback) against the f32 references.

Unlike the kernels, the XLA path reads every cache slot its gathers or dots touch, so the inputs here keep
junk finite (jspec's cache is zero-initialised; slots past a row's length hold old, finite entries)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels import xla
from _kernel_utils import assert_close, random_qkv, random_tree_mask

F32, BF16 = jnp.float32, jnp.bfloat16


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("mode", ["weights", "logits"])
def test_flash_scores(dtype, mode):
    B, T, N, K, H, S, L = 2, 5, 4, 2, 64, 48, 3
    q, k, v = random_qkv(1, B, T, N, K, H, L * S, dtype)
    k, v = k.reshape(B, L, S, K, H).swapaxes(0, 1), v.reshape(B, L, S, K, H).swapaxes(0, 1)
    kv_len = jnp.asarray([S, 9], jnp.int32)
    kw = dict(score_rows=(0, T - 1), score_mode=mode, layer=1)
    out, lse, sc = xla.flash_scores(q, k, v, kv_len, **kw)
    r_out, r_lse, r_sc = pk.flash_scores_reference(q, k, v, kv_len, **kw)
    assert_close(out, r_out, dtype, "out")
    assert_close(lse, r_lse, dtype, "lse")
    assert_close(sc, r_sc, dtype, "scores")


def test_flash_chunked_prefill(monkeypatch):
    B, T, N, K, H, S = 2, 21, 4, 2, 64, 32
    q, k, v = random_qkv(2, B, T, N, K, H, S, F32)
    kv_len = jnp.asarray([S, T], jnp.int32)
    monkeypatch.setattr(xla, "_XLA_LOGITS_BUDGET", 4 * B * N * S * 8)   # chunks of 8 rows, the last padded
    out, lse, sc = xla.flash_scores(q, k, v, kv_len)
    r_out, r_lse, _ = pk.flash_scores_reference(q, k, v, kv_len)
    assert sc is None
    assert_close(out, r_out, F32, "out")
    assert_close(lse, r_lse, F32, "lse")


@pytest.mark.parametrize("rows", [(), (0, 4)])
def test_tree_attention(rows):
    B, n, N, K, H, S = 2, 5, 4, 2, 64, 32
    q, k, v = random_qkv(3, B, n, N, K, H, S, F32)
    rng = np.random.default_rng(3)
    prefix_len = jnp.asarray([S - n, 0], jnp.int32)
    mask = jnp.asarray(random_tree_mask(rng, B, n))
    r_out, r_lse = pk.tree_attention_reference(q, k, v, prefix_len, mask)
    out, lse, sc = xla.tree_attention_scores(q, k, v, prefix_len, mask, score_rows=rows)
    assert_close(out, r_out, F32, "out")
    assert_close(lse, r_lse, F32, "lse")
    assert (sc is None) == (not rows)
    assert_close(xla.tree_attention(q, k, v, prefix_len, mask)[0], r_out, F32, "out")


def _selection(rng, B, M, S, T, L=None):
    lead = () if L is None else (L,)
    idx = np.stack([rng.permutation(S - T)[:M] for _ in range(int(np.prod(lead + (B,))))]).reshape(lead + (B, M))
    n_valid = rng.integers(1, M + 1, size=lead + (B,))
    return jnp.asarray(idx, jnp.int32), jnp.asarray(n_valid, jnp.int32)


@pytest.mark.parametrize("tail", [True, False])
def test_sparse_attention(tail):
    B, T, N, K, H, S, M, L = 2, 3, 4, 2, 64, 32, 8, 2
    rng = np.random.default_rng(4)
    q, k, v = random_qkv(4, B, T, N, K, H, L * S, F32)
    k, v = k.reshape(B, L, S, K, H).swapaxes(0, 1), v.reshape(B, L, S, K, H).swapaxes(0, 1)
    idx, n_valid = _selection(rng, B, M, S, T, L)
    kv_len = jnp.asarray([S, S - 4], jnp.int32)
    args = (q, k, v, idx, n_valid, kv_len)
    out, lse = xla.sparse_attention(*args, tail=tail, layer=1)
    r_out, r_lse = pk.sparse_attention_reference(*args, tail=tail, layer=1)
    assert_close(out, r_out, F32, "out")
    assert_close(lse, r_lse, F32, "lse")


def test_sparse_tree_attention():
    B, n, N, K, H, S, M = 2, 5, 4, 2, 64, 32, 8
    rng = np.random.default_rng(5)
    q, k, v = random_qkv(5, B, n, N, K, H, S, F32)
    idx, n_valid = _selection(rng, B, M, S, n)
    prefix_len = jnp.asarray([S - n, S - n - 3], jnp.int32)
    mask = jnp.asarray(random_tree_mask(rng, B, n))
    args = (q, k, v, idx, n_valid, prefix_len, mask)
    out, lse = xla.sparse_tree_attention(*args)
    r_out, r_lse = pk.sparse_tree_attention_reference(*args)
    assert_close(out, r_out, F32, "out")
    assert_close(lse, r_lse, F32, "lse")


@pytest.mark.parametrize("mode", ["weights", "logits"])
def test_sparse_scores_over_everything_are_flash_scores(mode):
    """A selection of every prefix position: the sparse scores are `flash_scores`' scores there (0 at the new
    tokens' slots and beyond)."""
    B, T, N, K, H, S = 2, 4, 4, 2, 64, 32
    q, k, v = random_qkv(6, B, T, N, K, H, S, F32)
    kv_len = jnp.asarray([S, 20], jnp.int32)
    idx = jnp.broadcast_to(jnp.arange(S - T, dtype=jnp.int32), (B, S - T))
    sc = xla.sparse_scores(q, k, idx, kv_len - T, kv_len, score_rows=(0, T - 1), score_mode=mode)
    _, _, r_sc = pk.flash_scores_reference(q, k, v, kv_len, score_rows=(0, T - 1), score_mode=mode)
    prefix = jnp.arange(S)[None] < (kv_len - T)[:, None]
    assert_close(sc, jnp.where(prefix, r_sc, 0.0), F32, "scores")
