"""Shared helpers of the kernel test suites (tests/test_kernels_*.py).

The suites run the Pallas kernels in interpret mode on CPU (CI) and natively on a GPU backend, always
against the float32 references of `pallas_kernels.reference`. Inputs are fresh random normals (a new
seed per case, never zeros), and cache slots the kernel must not read are poisoned (NaN, or 1e4 where a
finite junk value is the stronger check) so a stray read shows in the result; interpret mode also
starts every output buffer as NaN, so an element the kernel forgot to write fails the comparison.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# Native kernels on a GPU backend, the interpreter elsewhere.
INTERPRET = jax.default_backend() != "gpu"

# The interpreter's HLO is large and runs on tiny shapes: XLA's CPU optimisation passes cost more than
# they save (~1.5x compile time), so interpreted kernels and references are compiled at -O0.
_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0} if INTERPRET else None


def compiled(fn, *static_argnames: str):
    """`fn` jitted with the suite's compiler options (same HLO, cheaper CPU compile)."""
    return jax.jit(fn, static_argnames=static_argnames, compiler_options=_COMPILER_OPTIONS)


# Tolerances by dtype (atol, rtol). bf16 outputs carry the bf16 rounding of the output and of P in P@V.
TOLERANCES = {
    jnp.dtype(jnp.float32): {"out": (5e-5, 1e-5), "lse": (5e-5, 1e-5), "scores": (1e-4, 1e-4)},
    jnp.dtype(jnp.bfloat16): {"out": (2e-2, 2e-2), "lse": (2e-3, 1e-3), "scores": (2e-3, 2e-3)},
}


def assert_close(actual, expected, dtype, kind: str, what: str = ""):
    atol, rtol = TOLERANCES[jnp.dtype(dtype)][kind]
    actual = np.asarray(jnp.asarray(actual, jnp.float32))
    expected = np.asarray(jnp.asarray(expected, jnp.float32))
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert np.isfinite(actual).all(), f"{what or kind}: non-finite values in the kernel output"
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=rtol, err_msg=what or kind)


def assert_bitwise_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def random_qkv(seed: int, B: int, T: int, N: int, K: int, H: int, S: int, dtype):
    """Fresh normal q [B,T,N,H], k, v [B,S,K,H] for this seed."""
    return _random_qkv(jax.random.key(seed), (B, T, N, H), (B, S, K, H), jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(1, 2, 3), compiler_options=_COMPILER_OPTIONS)
def _random_qkv(key, q_shape, kv_shape, dtype):
    # One draw split three ways: a single random op keeps the per-shape compile cheap on CPU.
    nq, nkv = int(np.prod(q_shape)), int(np.prod(kv_shape))
    flat = jax.random.normal(key, (nq + 2 * nkv,), dtype)
    return (flat[:nq].reshape(q_shape), flat[nq: nq + nkv].reshape(kv_shape), flat[nq + nkv:].reshape(kv_shape))


def ragged_lengths(rng: np.random.Generator, B: int, lo: int, S: int) -> np.ndarray:
    """int32[B] in [lo, S]; with B >= 2 the extremes S and lo are always present."""
    lens = rng.integers(lo, S + 1, size=B)
    lens[0] = S
    if B >= 2:
        lens[1] = lo
    return lens.astype(np.int32)


def poison(x, keep, value=np.nan):
    """x [B,S,K,H] with positions where keep [B,S] is False replaced by `value` (done in numpy)."""
    x = np.asarray(x)
    return jnp.asarray(np.where(np.asarray(keep)[:, :, None, None], x, np.asarray(value).astype(x.dtype)))


def poison_after(k, v, length, value=np.nan):
    """Poisons every cache position >= length[b] of k and v."""
    keep = np.arange(k.shape[1])[None, :] < np.asarray(length)[:, None]
    return poison(k, keep, value), poison(v, keep, value)


def random_tree_mask(rng: np.random.Generator, B: int, n: int) -> np.ndarray:
    """bool [B,n,n] ancestor-or-self masks of random trees (node 0 is the root, parent[i] < i)."""
    mask = np.zeros((B, n, n), bool)
    for b in range(B):
        parent = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        for i in range(n):
            j = i
            while j >= 0:
                mask[b, i, j] = True
                j = parent[j]
    return mask


def random_index_sets(rng: np.random.Generator, M: int, kv_len: np.ndarray, T: int, *, sort: bool,
                      n_valid: np.ndarray) -> np.ndarray:
    """int32[B,M]: n_valid[b] distinct positions < kv_len[b] - T (sorted or not), then junk entries."""
    B = len(kv_len)
    idx = np.full((B, M), -7, np.int64)  # junk the kernel must ignore (even out of range)
    for b in range(B):
        chosen = rng.choice(int(kv_len[b]) - T, size=int(n_valid[b]), replace=False)
        idx[b, : n_valid[b]] = np.sort(chosen) if sort else chosen
        idx[b, n_valid[b]:] = rng.choice([-7, 10**6, 0], size=M - int(n_valid[b]))
    return idx.astype(np.int32)


# An abstract H200: lets CPU-only CI run the Pallas -> Triton lowering (not the Triton compiler) on
# real model shapes, catching ops or layouts the Triton backend rejects that interpret mode accepts.
_H200 = jax.sharding.AbstractMesh(
    (1,), ("x",), abstract_device=jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132,
                                                             platform="cuda"))


def lower_for_h200(fn, *args, **static) -> str:
    """StableHLO text of fn(*args, **static) lowered for CUDA, with its kernels lowered to Triton IR."""
    with jax.sharding.use_abstract_mesh(_H200):
        lowered = jax.jit(lambda *a: fn(*a, **static)).trace(*args).lower(lowering_platforms=("cuda",))
    return lowered.as_text()


def triton_calls(hlo_text: str, name: str | None = None) -> int:
    """Triton custom calls in a lowered module (only those of kernel `name` when given)."""
    lines = [ln for ln in hlo_text.splitlines() if "__gpu$xla.gpu.triton" in ln]
    return sum(1 for ln in lines if name is None or f'name = "{name}"' in ln)


def lower_for_cuda(fn, *avals) -> str:
    """StableHLO text of `fn` lowered for CUDA on any machine: Pallas runs its Triton lowering (every
    kernel becomes Triton IR inside a custom call) against a pretend sm_90 device, so a kernel that uses an
    op without a Triton lowering rule fails here on the CPU instead of on the GPU. PTX compilation is not
    exercised."""
    import types
    from unittest import mock

    import jax._src.pallas.triton.pallas_call_registration as reg
    import pallas_kernels._common as C

    with mock.patch.object(C, "check_platform", lambda interpret: None), \
            mock.patch.object(reg.gpu_info_lib, "get_gpu_info",
                              lambda: types.SimpleNamespace(compute_capability="9.0")):
        return jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
