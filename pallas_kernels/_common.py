"""Pieces shared by the attention kernels: block sizes, GQA packing, the online-softmax step, split-K
combine, shape checks and the one dispatcher (`dispatch`: the kernel, or the XLA path of xla.py).

GQA packing. A kernel program owns one KV head and stacks the G query heads that read it, times the T
query rows, into the M dimension of its tile: packed row r = t*G + g is query row t of head kh*G + g.
A T=1 decode at G=3 is then a [16, H] tile (3 real rows) against [block_k, H] keys instead of three
[1, H] programs, and K/V are read once per KV head, not once per query head.

Numerics. Scores run in base 2 inside the kernels (logits are pre-multiplied by log2(e), so the
exponentials are `exp2`); every LSE that leaves a kernel is converted to the natural log.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
# Finite start for the running max: with masked logits at -inf, exp2(m_prev - m_new) stays NaN-free
# even for a row that has seen no valid key yet (its l stays 0 and `finalize` reports lse = -inf).
M_INIT = -1e30
# Hardware facts of the GPU the defaults were chosen for (a Hopper sm_90 SXM part), used where the device cannot
# be asked: interpret mode and lowering for an abstract GPU.
SM90_SMS = 132
SMEM_PER_SM = 228 * 1024   # shared memory per SM


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tunables of one kernel launch (hashable: usable as a static jit argument).

    block_m:    packed query rows (T*G) per program; the launch uses min(block_m, next_pow2(T*G), >=16).
    block_k:    keys (or gathered cache entries) per inner-loop step; power of two >= 16.
    num_splits: split-K programs per (batch, KV head, row block); None picks enough to fill the GPU.
    num_warps, num_stages: Triton launch parameters (passed explicitly: the defaults changed between jax releases).
    """

    block_m: int = 64
    block_k: int = 128
    num_splits: int | None = None
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_m", "block_k"):
            val = getattr(self, name)
            if val < 16 or val & (val - 1):
                raise ValueError(f"{name}={val} must be a power of two >= 16")
        if self.num_splits is not None and self.num_splits < 1:
            raise ValueError(f"num_splits={self.num_splits} must be >= 1")

    def compiler_params(self) -> plgpu.CompilerParams:
        return plgpu.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def prev_pow2(x: int) -> int:
    return 1 << (x.bit_length() - 1) if x > 0 else 0


def row_block(rows: int, block_m: int) -> int:
    """Rows per program: a power of two >= 16 (Triton's dot minimum), at most `block_m`."""
    return min(block_m, max(16, next_pow2(rows)))


def num_sms() -> int:
    dev = jax.devices()[0]
    if dev.platform == "gpu":
        return getattr(dev, "core_count", None) or SM90_SMS
    return SM90_SMS  # interpret mode / lowering for an abstract sm_90 GPU


def resident_programs(bs: "BlockSizes", block_k: int, head_dim: int, dtype) -> int:
    """Programs of one launch an SM holds at once, as bounded by shared memory: each keeps num_stages K+V
    tiles of [block_k, head_dim] in flight (the packed query tile and registers are not the limit here)."""
    tile = 2 * block_k * head_dim * jnp.dtype(dtype).itemsize
    return max(1, SMEM_PER_SM // (bs.num_stages * tile))


def split_plan(num_blocks: int, programs: int, num_splits: int | None, min_blocks: int = 4, resident: int = 3):
    """(splits, blocks_per_split) for split-K over `num_blocks` key blocks.

    Auto mode (flash-decoding: small B*K alone cannot fill 132 SMs) aims at ~4 programs per SM, keeping at
    least `min_blocks` blocks per split so the partial outputs stay cheap to combine, then steps down while
    the launch spills past a wave of `resident` programs per SM into a badly filled last wave (< 90% of
    whole waves busy). At SmolLM2's B=64, L=8000 decode (192 programs, 3 resident per SM) that turns 3
    splits (1.45 waves) into 2 (one wave). Llama-3-8B at B=16 keeps its 5 splits (1 resident, 4.85 waves,
    97% busy): a rule that always fitted one wave starved such launches of parallelism. Measurements of both
    cases: docs/performance.md ("Split-K by waves").
    """
    if num_splits is None:
        num_splits = min(cdiv(4 * num_sms(), max(programs, 1)), max(1, num_blocks // min_blocks))
        slots = resident * num_sms()

        def busy(s):   # fraction of the launch's whole waves that holds programs
            return programs * s / (cdiv(programs * s, slots) * slots)

        while num_splits > 1 and programs * num_splits > slots and busy(num_splits) < 0.9:
            num_splits -= 1
    num_splits = max(1, min(num_splits, num_blocks))
    per_split = cdiv(num_blocks, num_splits)
    return cdiv(num_blocks, per_split), per_split


# ----------------------------------------------------------------------------------------------
# Checks and dispatch.


def check_platform(interpret: bool) -> None:
    """The Triton path needs a GPU (or an abstract GPU target); CPU runs use interpret or the XLA path."""
    if not interpret and not plgpu.is_gpu_device():
        raise NotImplementedError(
            f"Pallas Triton kernels need a GPU backend, got {jax.default_backend()=}; "
            "pass interpret=True or use the XLA path"
        )


def layer_shape(k, layer) -> tuple[int, ...]:
    """[B,S,K,H] of the one layer the kernels read: k itself, or k[layer] of a stacked [L,B,S,K,H] cache."""
    expected = 4 if layer is None else 5
    if k.ndim != expected:
        raise ValueError(f"expected a {expected}-d cache for {layer=}, got {k.shape=}")
    return tuple(k.shape) if layer is None else tuple(k.shape[1:])


def as_stacked(k, v, layer):
    """(k, v, layer) for a launch: the cache as [L,B,S,K,H] (a one-layer cache gains a leading axis of 1,
    a free reshape) and the layer as an int32[1] operand.

    The layer is a runtime operand, not a constant of the kernel: the launches of all L layers are then
    one kernel (one trace, one Triton compile, one entry in XLA's kernel cache) that reads layer i's K/V
    in place, instead of L kernels differing only in a baked-in offset (L Triton compiles per new shape,
    which dominated compile time for a 30-layer model).
    """
    if layer is None:
        return k[None], v[None], jnp.zeros((1,), jnp.int32)
    return k, v, jnp.reshape(jnp.asarray(layer, jnp.int32), (1,))


def kv_block_spec(k) -> pl.BlockSpec:
    """All layers of one (batch, KV head) of a stacked cache for grids (b, h, ...): [L, S, H] in the
    kernel, indexed there as ref[layer, rows, :] (a strided view: nothing is copied)."""
    L, _, S, _, H = k.shape
    return pl.BlockSpec((L, None, S, None, H), lambda b, h, *_: (0, b, 0, h, 0))


# The int32[1] layer operand, a scalar inside the kernel.
LAYER_SPEC = pl.BlockSpec((None,), lambda *_: (0,))


def check_layer(k, layer) -> None:
    """Range check of a concrete layer index (a traced one is the caller's responsibility)."""
    if isinstance(layer, (int, np.integer)) and not 0 <= layer < k.shape[0]:
        raise ValueError(f"{layer=} out of range for {k.shape=}")


def check_attention_shapes(q, k, v, layer=None) -> tuple[int, int]:
    """Validates q [B,T,N,H] and k/v [B,S,K,H] (or [L,B,S,K,H] with `layer`); returns (K, G)."""
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {k.shape=} {v.shape=}")
    kshape = layer_shape(k, layer)
    check_layer(k, layer)
    if q.ndim != 4:
        raise ValueError(f"expected q [B,T,N,H], got {q.shape=}")
    head_dim, num_heads, num_kv_heads = q.shape[3], q.shape[2], kshape[2]
    if kshape[0] != q.shape[0] or kshape[3] != head_dim:
        raise ValueError(f"batch / head_dim mismatch: {q.shape=} {k.shape=}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise NotImplementedError(f"{head_dim=} must be one of {SUPPORTED_HEAD_DIMS}")
    if num_heads % num_kv_heads:
        raise NotImplementedError(f"{num_heads=} must be a multiple of {num_kv_heads=}")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise NotImplementedError(f"q, k, v must share a dtype, got {q.dtype=} {k.dtype=} {v.dtype=}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise NotImplementedError(f"{q.dtype=} must be one of bfloat16, float16, float32")
    return num_kv_heads, num_heads // num_kv_heads


def dispatch(implementation: str | None, kernel: Callable, fallback: Callable, *args, **kwargs):
    """The one way into an op: `kernel` ("pallas") or `fallback` ("xla": the op's production XLA path,
    pallas_kernels/xla.py, or for the ops without one its reference); None tries the kernel and falls back
    when it raises NotImplementedError at trace time (unsupported shape, CPU backend without interpret)."""
    if implementation == "pallas":
        return kernel(*args, **kwargs)
    if implementation == "xla":
        return fallback(*args, **kwargs)
    if implementation is None:
        try:
            return kernel(*args, **kwargs)
        except NotImplementedError:
            return fallback(*args, **kwargs)
    raise ValueError(f"{implementation=} must be one of None, 'pallas', 'xla'")


# ----------------------------------------------------------------------------------------------
# GQA packing (outside the kernels, in XLA).


def pack_queries(q: jax.Array, num_kv_heads: int, block_m: int) -> jax.Array:
    """q [B,T,N,H] -> [B,K,Mp,H], packed row r = t*G + g, zero rows padding M = T*G up to block_m."""
    B, T, N, H = q.shape
    G = N // num_kv_heads
    qp = q.reshape(B, T, num_kv_heads, G, H).transpose(0, 2, 1, 3, 4).reshape(B, num_kv_heads, T * G, H)
    pad = cdiv(T * G, block_m) * block_m - T * G
    return jnp.pad(qp, ((0, 0), (0, 0), (0, pad), (0, 0))) if pad else qp


def unpack_out(op: jax.Array, T: int, N: int) -> jax.Array:
    """[B,K,Mp,H] -> [B,T,N,H]."""
    B, K, _, H = op.shape
    G = N // K
    return op[:, :, : T * G].reshape(B, K, T, G, H).transpose(0, 2, 1, 3, 4).reshape(B, T, N, H)


def unpack_lse(lp: jax.Array, T: int, N: int) -> jax.Array:
    """[B,K,Mp] -> [B,N,T]."""
    B, K, _ = lp.shape
    G = N // K
    return lp[:, :, : T * G].reshape(B, K, T, G).transpose(0, 1, 3, 2).reshape(B, N, T)


def combine_splits(o: jax.Array, lse: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Exact merge of split-K partials: o [P,...,H] (each normalised over its split), lse [P,...]."""
    if o.shape[0] == 1:
        return o[0].astype(jnp.float32), lse[0]
    top = lse.max(axis=0)
    top = jnp.where(jnp.isfinite(top), top, 0.0)  # all splits empty: keep exp() finite
    w = jnp.exp(lse - top)  # empty split: lse = -inf -> weight 0
    denom = w.sum(axis=0)
    # A multiply-and-sum, not an einsum: XLA would make that a GPU dot, which may run in TF32.
    out = (w[..., None] * o.astype(jnp.float32)).sum(axis=0) / jnp.where(denom > 0, denom, 1.0)[..., None]
    return out, top + jnp.log(denom)


def merge_partials(o_a, lse_a, o_b, lse_b):
    """Merges attention over two disjoint key sets: w = sigmoid(lse_a - lse_b) (docs/kernels.md)."""
    w = jax.nn.sigmoid(lse_a - lse_b)[..., None]
    return w * o_a + (1.0 - w) * o_b, jnp.logaddexp(lse_a, lse_b)


# ----------------------------------------------------------------------------------------------
# In-kernel helpers (Pallas Triton; also run under interpret=True).


def dot_nt(a: jax.Array, b: jax.Array) -> jax.Array:
    """a [M,H] . b[N,H]^T -> [M,N] f32."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def init_carry(block_m: int, head_dim: int):
    return (
        jnp.zeros((block_m, head_dim), jnp.float32),
        jnp.full((block_m,), M_INIT, jnp.float32),
        jnp.zeros((block_m,), jnp.float32),
    )


def softmax_step(carry, s: jax.Array, v: jax.Array):
    """One online-softmax update. s [bm,bk]: base-2 logits, -inf where masked; v [bk,H]."""
    acc, m_prev, l_prev = carry
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
    alpha = jnp.exp2(m_prev - m_new)
    p = jnp.exp2(s - m_new[:, None])
    l_new = l_prev * alpha + jnp.sum(p, axis=1)
    acc = acc * alpha[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return acc, m_new, l_new


def finalize(carry):
    """-> (normalised out [bm,H] f32, natural-log lse [bm]); rows that saw no key give (0, -inf)."""
    acc, m, l = carry
    empty = l == 0.0
    l_safe = jnp.where(empty, 1.0, l)
    lse = jnp.where(empty, -jnp.inf, (m + jnp.log2(l_safe)) * LN2)
    return acc / l_safe[:, None], lse


def run_key_blocks(lo, mid, hi, body, o_ref, lse_ref, n_sub: int = 0):
    """Online softmax over key blocks [lo, mid) unmasked then [mid, hi) masked (`body(masked)` is the
    fori_loop step), then normalise and store this program's out [bm, H] and lse [bm].

    n_sub > 0: the carry is a tuple of n_sub carries, one per sub-block of bm / n_sub rows (exact mode's
    fixed-size MMA tiles, `exact_block_sizes`), each normalised and stored to its own rows."""
    block_m, head_dim = o_ref.shape
    if not n_sub:
        carry = init_carry(block_m, head_dim)
        carry = lax.fori_loop(lo, mid, body(False), carry)
        carry = lax.fori_loop(mid, hi, body(True), carry)
        o, lse = finalize(carry)
        o_ref[...] = o.astype(o_ref.dtype)
        lse_ref[...] = lse
        return
    sub = block_m // n_sub
    carry = tuple(init_carry(sub, head_dim) for _ in range(n_sub))
    carry = lax.fori_loop(lo, mid, body(False), carry)
    carry = lax.fori_loop(mid, hi, body(True), carry)
    store_sub_blocks(carry, o_ref, lse_ref)


def store_sub_blocks(carry, o_ref, lse_ref):
    """Normalise each sub-block carry of a tuple and store it to its rows of o_ref [bm, H], lse_ref [bm]."""
    sub = o_ref.shape[0] // len(carry)
    for i, c in enumerate(carry):
        o, lse = finalize(c)
        o_ref[pl.ds(i * sub, sub), :] = o.astype(o_ref.dtype)
        lse_ref[pl.ds(i * sub, sub)] = lse


# ----------------------------------------------------------------------------------------------
# Exact mode: a schedule whose rounding of a query row does not depend on the step's other rows.

# Exact mode's split-K: a fixed number of key blocks per split. The auto plan (`split_plan`) sizes splits by
# the cache's capacity and the batch, and `ar` and a speculative method size their caches differently (the
# method's capacity margin: 8192 slots against 8320 at L=7936 + 256 new tokens), which moved the split
# boundaries and with them the rounding of every row. With fixed ranges a row's partials cover the same keys
# whatever the capacity or batch; splits a row does not reach add exact zeros in the merge. 8 blocks (1024 keys
# at SmolLM2's 128-key tile) fill about one wave at B=16, L=8K; at B=64 the extra partials are, by estimate, ~3% of
# the KV read (not timed apart: docs/performance.md).
EXACT_SPLIT_BLOCKS = 8


def exact_split_plan(num_blocks: int) -> tuple[int, int]:
    """(splits, blocks_per_split) of exact mode: EXACT_SPLIT_BLOCKS key blocks per split, whatever the launch
    (BlockSizes.num_splits is not read: a count of splits would move the boundaries with the capacity)."""
    return cdiv(num_blocks, EXACT_SPLIT_BLOCKS), EXACT_SPLIT_BLOCKS


def exact_sub_rows(groups: int) -> int:
    """Rows of exact mode's MMA tile: the one-token step's own tile, `row_block(G)` (16 up to G = 16)."""
    return row_block(groups, 64)


def _combine_kernel(o_ref, lse_ref, out_ref, lse_out_ref, *, P):
    """o_ref [P, bm, H] f32 split partials (each normalised over its keys), lse_ref [P, bm]; the merge of
    `combine_splits` with the sum over splits unrolled in split order, so each row's result is a fixed
    sequence of elementwise operations whatever the launch's shape."""
    lse = [lse_ref[p] for p in range(P)]
    top = lse[0]
    for x in lse[1:]:
        top = jnp.maximum(top, x)
    top = jnp.where(top == -jnp.inf, 0.0, top)   # every split empty: keep exp() finite
    w = [jnp.exp(x - top) for x in lse]
    num, den = w[0][:, None] * o_ref[0], w[0]
    for p in range(1, P):
        num, den = num + w[p][:, None] * o_ref[p], den + w[p]
    safe = jnp.where(den > 0, den, 1.0)
    out_ref[...] = (num / safe[:, None]).astype(out_ref.dtype)
    lse_out_ref[...] = jnp.where(den > 0, top + jnp.log(safe), -jnp.inf)


def combine_splits_exact(o: jax.Array, lse: jax.Array, *, out_dtype, interpret: bool = False, block_m: int = 16):
    """`combine_splits` for exact mode: o [P,B,K,Mp,H], lse [P,B,K,Mp] -> out [B,K,Mp,H] out_dtype, lse
    [B,K,Mp]. XLA's reduction over P may pick its order by the tensor's shape (so by the step's rows); this
    Pallas launch merges every row by the same unrolled sum. P = 1 is returned as is (already final)."""
    if o.shape[0] == 1:
        return o[0].astype(out_dtype), lse[0]
    P, B, K, Mp, H = o.shape
    bm = min(block_m, Mp)
    return pl.pallas_call(
        functools.partial(_combine_kernel, P=P),
        grid=(B, K, Mp // bm),
        in_specs=[pl.BlockSpec((P, None, None, bm, H), lambda b, h, m: (0, b, h, m, 0)),
                  pl.BlockSpec((P, None, None, bm), lambda b, h, m: (0, b, h, m))],
        out_specs=[pl.BlockSpec((None, None, bm, H), lambda b, h, m: (b, h, m, 0)),
                   pl.BlockSpec((None, None, bm), lambda b, h, m: (b, h, m))],
        out_shape=[jax.ShapeDtypeStruct((B, K, Mp, H), out_dtype), jax.ShapeDtypeStruct((B, K, Mp), jnp.float32)],
        compiler_params=BlockSizes(num_warps=4, num_stages=1).compiler_params(),
        interpret=interpret,
        name="combine_splits",
    )(o.astype(jnp.float32), lse)
