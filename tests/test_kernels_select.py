"""topk_select: the threshold-search kernel (interpret mode on CPU) against its reference and a numpy brute
force on fresh random rows with ties, negative scores, empty and short rows; every kernel's Triton lowering
for CUDA, checked on the CPU."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _kernel_utils import INTERPRET, compiled, lower_for_cuda
from pallas_kernels.topk_select import order_key, topk_select, topk_select_kernel, topk_select_reference


def brute_force(scores, limit, k, slots):
    """Per row: positions < limit by (score descending, position ascending), the first n, ascending."""
    R, S = scores.shape
    idx, ns = np.zeros((R, slots), np.int64), []
    for r in range(R):
        lim = int(np.clip(limit[r], 0, S))
        n = int(np.clip(min(k[r], lim), 0, min(slots, S)))
        order = sorted(range(lim), key=lambda j: (-scores[r, j], j))[:n]
        idx[r, :n] = sorted(order)
        ns.append(n)
    return idx, np.array(ns)


def rows(seed, R, S):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((R, S)).astype(np.float32)
    x[0] = np.round(x[0] * 2) / 2                      # heavy ties, across block boundaries
    x[1] = np.abs(x[1]) * 1e-3                         # small non-negative weights (Vegas' case)
    if R > 2:
        x[2, : S // 2] = x[2, S // 2:S // 2 * 2]       # every value twice
    return x


KERNEL = compiled(topk_select_kernel, "slots", "block", "num_warps", "interpret")


@pytest.mark.parametrize("R,S,slots,block,seed", [(6, 300, 40, 64, 0), (5, 1000, 128, 256, 1),
                                                  (4, 90, 128, 32, 2), (3, 2048, 16, 1024, 3)])
def test_kernel_equals_reference_and_brute_force(R, S, slots, block, seed):
    x = rows(seed, R, S)
    rng = np.random.default_rng(seed + 100)
    limit = rng.integers(0, S + 20, R).astype(np.int32)
    limit[0], limit[-1] = S, 0                          # a full row and an empty one
    k = rng.integers(0, slots + 10, R).astype(np.int32)
    k[0] = slots
    want_idx, want_n = brute_force(x, limit, k, slots)
    ref_idx, ref_n = topk_select_reference(jnp.asarray(x), jnp.asarray(limit), jnp.asarray(k), slots=slots)
    np.testing.assert_array_equal(np.asarray(ref_idx), want_idx)
    np.testing.assert_array_equal(np.asarray(ref_n), want_n)
    got_idx, got_n = KERNEL(jnp.asarray(x), jnp.asarray(limit), jnp.asarray(k), slots=slots, block=block,
                            interpret=INTERPRET)
    np.testing.assert_array_equal(np.asarray(got_idx), want_idx)
    np.testing.assert_array_equal(np.asarray(got_n), want_n)


def test_leading_axes_broadcast_limit_and_k():
    L, B, S, M = 3, 4, 200, 24
    x = rows(7, L * B, S).reshape(L, B, S)
    point = np.array([200, 50, 7, 120], np.int32)
    k = np.array([24, 10, 24, 3], np.int32)
    got_idx, got_n = KERNEL(jnp.asarray(x), jnp.asarray(point), jnp.asarray(k), slots=M, block=64,
                            interpret=INTERPRET)
    want_idx, want_n = brute_force(x.reshape(-1, S), np.tile(point, L), np.tile(k, L), M)
    np.testing.assert_array_equal(np.asarray(got_idx).reshape(-1, M), want_idx)
    np.testing.assert_array_equal(np.asarray(got_n).reshape(-1), want_n)
    # the dispatcher on this backend gives the same
    d_idx, _ = topk_select(jnp.asarray(x), jnp.asarray(point), jnp.asarray(k), slots=M, block=64,
                           interpret=INTERPRET)
    np.testing.assert_array_equal(np.asarray(d_idx).reshape(-1, M), want_idx)


def test_order_key_preserves_float_order():
    v = np.array([-np.inf, -3.5, -1.0, -1e-30, 0.0, 1e-30, 1e-3, 2.0, 7.5e30, np.inf], np.float32)
    keys = np.asarray(order_key(jnp.asarray(v)))
    assert (np.diff(keys.astype(np.int64)) > 0).all(), keys


def test_selection_method_select_keeps_the_sort_set():
    from jspec import selection

    rng = np.random.default_rng(11)
    scores = jnp.asarray(rng.standard_normal((2, 3, 64)).astype(np.float32))
    point, k = np.array([64, 30, 9], np.int32), np.array([10, 10, 10], np.int32)
    a_idx, a_n = selection.topk_before(scores, point, k, slots=12)
    b_idx, b_n = selection.topk_before(scores, point, k, slots=12, method="select")
    np.testing.assert_array_equal(np.asarray(a_n), np.asarray(b_n))
    for a, b, n in zip(np.asarray(a_idx).reshape(-1, 12), np.asarray(b_idx).reshape(-1, 12),
                       np.asarray(a_n).reshape(-1)):
        assert sorted(a[:n].tolist()) == b[:n].tolist() and not b[n:].any()
    with pytest.raises(ValueError, match="method"):
        selection.topk_before(scores, point, k, slots=12, method="radix")


# ---------------------------------------------------------------------------------------------- lowering

def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_every_kernel_lowers_to_triton_for_cuda():
    from pallas_kernels import flash_scores_kernel, sparse_attention_kernel, tree_attention_kernel

    bf16, i32 = jnp.bfloat16, jnp.int32
    B, T, N, K, H, S, L = 2, 5, 9, 3, 64, 1024, 4
    q, kv = _sds((B, T, N, H), bf16), _sds((L, B, S, K, H), bf16)
    vec = _sds((B,), i32)
    cases = {
        "flash_scores": (lambda q, k, v, n: flash_scores_kernel(q, k, v, n, score_rows=(0, T - 1), layer=1),
                         (q, kv, kv, vec)),
        "score_weights": (lambda q, k, v, n: flash_scores_kernel(q, k, v, n, score_rows=(0, T - 1), layer=1)[2],
                          (q, kv, kv, vec)),
        "sparse_attention": (lambda q, k, v, i, nv, n: sparse_attention_kernel(q, k, v, i, nv, n, layer=2),
                             (q, kv, kv, _sds((B, 128), i32), vec, vec)),
        "tree_attention": (lambda q, k, v, p, m: tree_attention_kernel(q, k, v, p, m, layer=0),
                           (_sds((B, 14, N, H), bf16), kv, kv, vec, _sds((B, 14, 14), jnp.bool_))),
        "topk_select": (lambda x, p, k: topk_select_kernel(x, p, k, slots=512),
                        (_sds((30, 64, 8448), jnp.float32), _sds((64,), i32), _sds((64,), i32))),
    }
    for name, (fn, avals) in cases.items():
        text = lower_for_cuda(fn, *avals)
        assert "xla.gpu.triton" in text, name
        assert f'name = "{name}"' in text, name          # that kernel's own Triton module
