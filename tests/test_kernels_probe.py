"""head_weights kernel (Dustin's A_T probe) vs the f32 softmax over the whole cache (interpret mode on CPU)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _kernel_utils import INTERPRET, compiled, ragged_lengths
from jspec import dustin
from pallas_kernels.head_weights import head_weights_kernel

kernel = compiled(head_weights_kernel, "heads", "block_k", "num_splits", "interpret")


def _reference(q, k, lengths, heads):
    """f32: softmax over the valid positions per (row, head), summed over the chosen heads and the rows."""
    w = dustin.softmax_weights(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32), lengths)   # [B, N, R, S]
    return np.asarray(w)[:, list(heads)].sum(axis=(1, 2))


def _inputs(seed, B, R, N, K, H, S, dtype, heads, layers=None):
    """Random q, k; lengths ragged with a 0 row; every cache slot the probe must not read (positions >= lengths,
    the KV groups of no chosen head, other layers) is NaN, so a stray read shows."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, R, N, H)).astype(np.float32)
    k = rng.normal(size=(B, S, K, H)).astype(np.float32)
    lengths = ragged_lengths(rng, B, 0, S)
    read = {n // (N // K) for n in heads}
    k[np.arange(S)[None, :] >= lengths[:, None]] = np.nan
    k[:, :, [g for g in range(K) if g not in read]] = np.nan
    k_in = k
    if layers is not None:
        k_in = np.full((layers[0],) + k.shape, np.nan, np.float32)
        k_in[layers[1]] = k
    return (jnp.asarray(q, dtype), jnp.asarray(k_in, dtype), jnp.asarray(lengths), jnp.asarray(k, dtype))


@pytest.mark.parametrize("B,R,N,K,H,S,heads,dtype,block_k,splits", [
    (3, 2, 6, 2, 64, 160, (0, 4, 5), jnp.float32, 32, None),       # G=3, two groups, S not a power of two
    (3, 2, 8, 4, 128, 256, (1, 2, 7), jnp.bfloat16, 64, 3),        # G=2, one group with two heads, 3 splits
    (2, 2, 4, 4, 64, 128, (3,), jnp.float32, 128, None),           # G=1, one head
    (4, 1, 12, 3, 64, 96, tuple(range(12)), jnp.bfloat16, 32, 2),  # every head (the default heads' shape)
    (2, 21, 9, 3, 64, 128, (2, 7), jnp.float32, 32, 2),            # LongSpec's tree nodes: 21 rows -> a 32-row tile
])
def test_matches_the_f32_softmax(B, R, N, K, H, S, heads, dtype, block_k, splits):
    q, k, lengths, k1 = _inputs(B * S + N, B, R, N, K, H, S, dtype, heads)
    got = np.asarray(kernel(q, k, lengths, heads, block_k=block_k, num_splits=splits, interpret=INTERPRET))
    want = _reference(q, np.nan_to_num(np.asarray(k1, np.float32)), lengths, heads)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert (got[np.asarray(lengths) == 0] == 0).all()
    np.testing.assert_allclose(got.sum(-1), R * len(heads) * (np.asarray(lengths) > 0), rtol=1e-4)


def test_reads_the_stacked_cache_in_place_and_equals_the_xla_probe():
    """With `layer` the kernel reads that layer of the stacked cache (other layers are NaN); dustin.head_weights
    with kernel=True gives the kernel's result, with kernel=False the XLA version's, and they agree."""
    heads = (1, 5)
    q, k_all, lengths, _ = _inputs(9, 3, 2, 6, 3, 64, 128, jnp.bfloat16, heads, layers=(3, 2))
    got = np.asarray(kernel(q, k_all, lengths, heads, layer=2, block_k=32, interpret=INTERPRET))
    via = np.asarray(jax.jit(lambda q, k, n: dustin.head_weights(q, k, n, heads, layer=2, kernel=True,
                                                                 interpret=INTERPRET))(q, k_all, lengths))
    clean = jnp.asarray(np.nan_to_num(np.asarray(k_all, np.float32)), jnp.bfloat16)   # XLA reads whole groups
    xla = np.asarray(jax.jit(lambda q, k, n: dustin.head_weights(q, k, n, heads, layer=2, kernel=False))(
        q, clean, lengths))
    np.testing.assert_array_equal(via, got)
    np.testing.assert_allclose(got, xla, rtol=1e-4, atol=1e-6)


def test_unsupported_shapes_fall_back_to_xla():
    q, k, lengths, _ = _inputs(3, 2, 2, 4, 2, 64, 40, jnp.float32, (0,))   # S = 40: not a multiple of 16
    with pytest.raises(NotImplementedError):
        head_weights_kernel(q, k, lengths, (0,), interpret=True)
    k = jnp.nan_to_num(k)
    np.testing.assert_allclose(np.asarray(dustin.head_weights(q, k, lengths, (0,), kernel=True, interpret=True)),
                               np.asarray(dustin.head_weights(q, k, lengths, (0,), kernel=False)), rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")  # DESIGN.md 3
@pytest.mark.parametrize("N,K,H,heads,R", [(9, 3, 64, (0, 4, 5), 2), (32, 8, 128, (3, 17), 2),
                                           (32, 8, 128, tuple(range(32)), 2), (9, 3, 64, (4,), 69)])
def test_lowers_to_triton_at_model_shapes(N, K, H, heads, R):
    """SmolLM2-135M and Llama-3-8B shapes, from the stacked cache: one Triton kernel (the per-row logits stores
    included; interpret mode would accept ops Triton has no rule for). R = 69: LongSpec's default tree as rows."""
    from _kernel_utils import lower_for_h200, triton_calls
    sd = jax.ShapeDtypeStruct
    hlo = lower_for_h200(head_weights_kernel, sd((2, R, N, H), jnp.bfloat16), sd((3, 2, 8192, K, H), jnp.bfloat16),
                         sd((2,), jnp.int32), heads=heads, layer=1)
    assert triton_calls(hlo, "head_weights") == 1
