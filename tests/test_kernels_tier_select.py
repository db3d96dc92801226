"""pallas_kernels/tier_select.py (interpret mode): Dustin's selection kernel over many blocks per row, every
radix width, against the XLA threshold search (itself checked against a brute force in test_dustin.py), and
its Triton lowering at the shapes jspec runs."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec import dustin
from pallas_kernels.tier_select import tier_select_kernel


def _kernel_select(monkeypatch, block, bits, d, t, lengths, **kw):
    monkeypatch.setattr(dustin, "tier_select_kernel", functools.partial(tier_select_kernel, block=block, bits=bits))
    return dustin.select_verify(d, t, lengths, method="kernel", interpret=True, **kw)


@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("page", [1, 4])
def test_many_blocks_ties_across_blocks(monkeypatch, bits, page):
    """Rows of 16-unit blocks: the running counts and offsets carry across blocks; integer scores put ties
    (the tier's last key) in many blocks, so which ties are taken depends on positions in earlier blocks."""
    rng = np.random.default_rng(bits * 10 + page)
    B, S = 5, 600
    d = rng.integers(0, 6, (B, S)).astype(np.float32)
    t = rng.integers(0, 4, (B, S)).astype(np.float32)
    t[rng.random((B, S)) < 0.05] = np.nan
    d[0] = rng.standard_normal(S)                       # distinct values in one row
    lengths = np.array([S, 577, 130, 97, 0], np.int32)  # full, ragged, just over the budget, dense, empty
    for m in (0, 20, 64):                              # target-only, both tiers, draft-only (free = 64)
        kw = dict(budget=96, sink=8, window=24, m=m, page=page)
        want = dustin.select_verify(d, t, lengths, method="select", **kw)
        got = _kernel_select(monkeypatch, 16, bits, d, t, lengths, **kw)
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]), err_msg=f"n, m={m}")
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]), err_msg=f"idx, m={m}")


def test_extreme_values_rank_like_the_xla_search(monkeypatch):
    """Keys near the ends of the int32 range: +-inf, the largest and smallest normals, subnormals, signed zeros
    and NaN (below every number), many tied."""
    rng = np.random.default_rng(7)
    tiny = np.finfo(np.float32).tiny
    vals = np.array([np.inf, -np.inf, 3.4e38, -3.4e38, tiny, -tiny, tiny / 8, -tiny / 8, 0.0, -0.0, np.nan, 1.0],
                    np.float32)
    B, S = 4, 300
    d, t = rng.choice(vals, (B, S)), rng.choice(vals, (B, S))
    lengths = np.array([S, 250, 200, 101], np.int32)
    for m in (0, 17, 60):
        kw = dict(budget=100, sink=4, window=16, m=m)
        want = dustin.select_verify(d, t, lengths, method="select", **kw)
        got = _kernel_select(monkeypatch, 32, 2, d, t, lengths, **kw)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]), err_msg=f"m={m}")
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]), err_msg=f"m={m}")


@pytest.mark.parametrize("U,page,bits,warps", [(32768, 1, 2, 8), (8192, 1, 4, 16), (1024, 8, 1, 4)])
def test_lowers_to_triton(U, page, bits, warps):
    """The kernel lowers to Triton IR for sm_90 (power-of-two block shapes, the int32 bit tricks) at Llama-3-8B's
    32K and SmolLM2's 8K verification shapes and with pages (PTX is not compiled here)."""
    from _kernel_utils import lower_for_cuda, triton_calls
    kp = 512 // page
    f = functools.partial(tier_select_kernel, page=page, budget=512, window=64, kp=kp, sink_pages=-(-4 // page),
                          m_pages=kp // 4, tiers=(True, True), bits=bits, num_warps=warps)
    sd = jax.ShapeDtypeStruct
    hlo = lower_for_cuda(f, sd((16, U), jnp.float32), sd((16, U), jnp.float32), sd((16,), jnp.int32))
    assert triton_calls(hlo, "tier_select") == 1
