"""Decode-sized dense layers as single launches: a layer's GEMMs with their norms, RoPE, SwiGLU and residual adds.

At decode sizes (M = B*T tokens <= a few hundred) a transformer layer's dense part is launch-latency-bound,
not bandwidth-bound: at SmolLM2's B=64 draft step the four GEMMs read ~7 MB of weights, a few microseconds
of HBM time, but each is a launch of its own, and the norms, RoPE, slices and residual adds around them are
~8 more small launches (profile in docs/performance.md). Here each GEMM carries its neighbours:

    qkv_rope(x, norm_w, wqkv)    RMSNorm -> x @ wqkv (+ bias) (-> per-head RMSNorm) -> RoPE on the q and k heads
                                 [M, K*(G+2)*H]; the bias is Qwen2's, the per-head norm Qwen3's
    glu(x, norm_w, w_gu)         RMSNorm -> silu(x @ w_gate) * (x @ w_up)              [M, F]
    residual(a, w, x)            x + a @ w (f32 accumulation, rounded once)             [M, D]
    head(x, norm_w, w)           RMSNorm -> x @ w, float32 logits (exact mode's LM head) [M, V]

so a layer is 4 of these plus the attention (and the cache write) instead of ~12 launches.

Every weight is the model's stacked [L, ...] array read at a runtime `layer` operand (like the attention
kernels read the stacked cache): slicing w[i] for a custom call would copy it, and one compiled kernel
serves all layers. The grid is (row blocks, column blocks); a program owns block_n output columns (one head
for qkv_rope, so RoPE's two halves are two [.., H/2] accumulators) and walks the contraction in static
power-of-two pieces (576 -> 512 + 64), unrolled. RMSNorm scales each piece by the row's rsqrt(mean square),
taken over the pieces first.

In whole generation loops no launch config measured beats cuBLAS + XLA's fusions (docs/performance.md), so
the model uses them only on request (AttnImpl.dense_rows, and exact mode: AttnImpl.exact). What they offer
instead: a row's result does not depend on how many rows the launch has (every dot a fixed 16-row tile, a
fixed contraction order, however many rows a program or the launch has), unlike cuBLAS, whose algorithm and so rounding change with M. A
one-token ar step and a (gamma+1)-token verification then compute the same bf16 dense outputs; exact mode
pairs them with attention kernels of the same property (docs/methods.md, "Lossless").

Numerics follow jspec.model's XLA path: the GEMM result is rounded to the activation dtype before RoPE /
SwiGLU / the residual add (as XLA's einsum output is), elementwise steps run in f32 and round per step.
Supported: rows M a multiple of 16; contraction (<= 2048) and column sizes multiples of 16; head_dim 64, 128.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from . import _common as C

MODES = ("qkv_rope", "glu", "residual", "head")
# Every dot is SUB_ROWS rows (Triton's smallest MMA tile): a program of more rows runs them as tiles of that size.
SUB_ROWS = 16
# (block_m, block_n, max_chunk, num_warps) per mode: block_m caps the rows per program (`_rows_per_program`).
# One [64, D] dot per program was slower than 16-row programs in whole loops; programs of two 16-row tiles,
# which read each weight piece once for both, were faster than one in long verifications, and four or eight
# slower again; pieces of <= 256 were the fastest (docs/performance.md: "Exactness and its cost", "Tried and
# reverted").
# qkv_rope's block_n is one head.
TUNED = {"qkv_rope": (32, 64, 256, 4), "glu": (32, 32, 256, 4), "residual": (32, 32, 256, 4),
         "residual_long": (32, 32, 256, 4), "head": (32, 32, 256, 4)}
# Rows per program grow only while the launch keeps at least this many programs (two per SM of an H100/H200).
MIN_PROGRAMS = 256
# Largest contraction the unrolled pieces are used for (measured up to SmolLM2's F = 1536); longer ones keep
# XLA's GEMMs (a model of Llama's size is bandwidth-, not launch-bound, at decode sizes).
MAX_CONTRACTION = 2048


def _r(z, dtype):
    """Round an f32 value through `dtype` (what XLA does between two elementwise ops of that dtype)."""
    return z.astype(dtype).astype(jnp.float32)


def _chunks(size: int, cap: int) -> list[tuple[int, int]]:
    """(start, length) pieces of a contraction of `size`: powers of two <= cap, largest first (576 -> 512, 64)."""
    out, start = [], 0
    while start < size:
        n = min(cap, C.prev_pow2(size - start))
        out.append((start, n))
        start += n
    return out


def _dense_kernel(layer_ref, x_ref, nw_ref, w_ref, aux_ref, inv_ref, b_ref, hn_ref, o_ref, *, mode, eps, chunks,
                  block_n, ncols, groups, norm, w_transposed=False, bias=False, head_norm=False):
    """x_ref [bm, Kd]; nw_ref [L, Kd] norm weights (a placeholder without norm); w_ref [L, Kd, Nc]; aux_ref: the
    residual block [bm, bn] (residual), row positions [bm] (qkv_rope) or unused; inv_ref [H/2] RoPE inverse
    frequencies (qkv_rope); o_ref [bm, bn]. w_transposed: w_ref is [L, Nc, Kd] (the head's tied embedding table;
    any mode, for bench/kernels.py's comparison of the two weight orientations).
    qkv_rope only: b_ref [L, Nc] the q/k/v biases in wqkv's column order (read when `bias`); hn_ref [L, 2, H] the
    per-head RMSNorm weights of the q heads and of the k head (read when `head_norm`); placeholders otherwise.

    The program's rows are computed in SUB_ROWS-row tiles, each by the same operations (its own norm, one
    [SUB_ROWS, piece] x [piece, bn] dot per contraction piece, accumulated in piece order, its epilogue), so a
    row's result does not depend on how many rows the program or the launch has. Each weight piece is loaded
    once per program and used by every tile: more rows per program, fewer reads of the weights. The contraction
    is unrolled over static `chunks` (all loads can be in flight at once: at decode sizes a program is
    latency-bound)."""
    bm, kd = x_ref.shape
    layer = layer_ref[()]
    n = pl.program_id(1)
    dt = o_ref.dtype
    tiles = [pl.ds(t * SUB_ROWS, SUB_ROWS) for t in range(bm // SUB_ROWS)]
    if mode == "qkv_rope":   # a program = one head: its two halves are the rotated pair
        half = block_n // 2
        cols = (n * block_n, n * block_n + half)
    elif mode == "glu":      # gate columns n*bn.., up columns ncols + n*bn..
        half = block_n
        cols = (n * block_n, ncols + n * block_n)
    else:
        half = block_n
        cols = (n * block_n,)

    if norm:   # each tile's rsqrt(mean square), over the pieces in order
        rstd = [lax.rsqrt(sum(jnp.sum(jnp.square(x_ref[r, pl.ds(c0, cn)].astype(jnp.float32)), axis=1)
                              for c0, cn in chunks) / kd + eps) for r in tiles]

    def piece(r, i, c0, cn):   # tile r's (normalised) activations over contraction piece c0:c0+cn
        xc = x_ref[r, pl.ds(c0, cn)]
        if not norm:
            return xc
        return ((xc.astype(jnp.float32) * rstd[i][:, None]) *
                nw_ref[layer, pl.ds(c0, cn)].astype(jnp.float32)[None, :]).astype(xc.dtype)

    accs = [[None] * len(cols) for _ in tiles]
    for c0, cn in chunks:
        for j, col in enumerate(cols):
            if w_transposed:
                wp = w_ref[layer, pl.ds(pl.multiple_of(col, half), half), pl.ds(c0, cn)]
                dots = [C.dot_nt(piece(r, i, c0, cn), wp) for i, r in enumerate(tiles)]
            else:
                wp = w_ref[layer, pl.ds(c0, cn), pl.ds(pl.multiple_of(col, half), half)]
                dots = [jnp.dot(piece(r, i, c0, cn), wp, preferred_element_type=jnp.float32)
                        for i, r in enumerate(tiles)]
            for i, d in enumerate(dots):
                accs[i][j] = d if accs[i][j] is None else accs[i][j] + d

    for i, r in enumerate(tiles):
        acc = accs[i]
        if mode == "head":
            o_ref[r, :] = acc[0]
        elif mode == "qkv_rope":
            a1, a2 = (_r(a, dt) for a in acc)
            role = n % (groups + 2)          # < groups: a q head; groups: the k head; groups + 1: the v head
            if bias:
                a1 = _r(a1 + b_ref[layer, pl.ds(cols[0], half)].astype(jnp.float32)[None, :], dt)
                a2 = _r(a2 + b_ref[layer, pl.ds(cols[1], half)].astype(jnp.float32)[None, :], dt)
            if head_norm:   # RMSNorm over the head's H values (both halves); the v head is left as it is
                rms = lax.rsqrt((jnp.sum(a1 * a1, axis=1) + jnp.sum(a2 * a2, axis=1)) / (2 * half) + eps)[:, None]
                which = jnp.minimum(role // groups, 1)   # 0: q_norm, 1: k_norm (v: unused)
                w1 = hn_ref[layer, which, pl.ds(0, half)].astype(jnp.float32)[None, :]
                w2 = hn_ref[layer, which, pl.ds(half, half)].astype(jnp.float32)[None, :]
                normed = role <= groups
                a1 = jnp.where(normed, _r((a1 * rms) * w1, dt), a1)
                a2 = jnp.where(normed, _r((a2 * rms) * w2, dt), a2)
            ang = aux_ref[r].astype(jnp.float32)[:, None] * inv_ref[...][None, :]
            cos, sin = jnp.cos(ang), jnp.sin(ang)
            rotate = role <= groups      # q heads and the k head; the v head passes through
            o_ref[r, pl.ds(0, half)] = jnp.where(rotate, a1 * cos - a2 * sin, a1).astype(dt)
            o_ref[r, pl.ds(half, half)] = jnp.where(rotate, a2 * cos + a1 * sin, a2).astype(dt)
        elif mode == "glu":
            g, u = (_r(a, dt) for a in acc)
            silu = _r(g * _r(jax.nn.sigmoid(g), dt), dt)
            o_ref[r, :] = (silu * u).astype(dt)
        else:
            o_ref[r, :] = (aux_ref[r, :].astype(jnp.float32) + _r(acc[0], dt)).astype(dt)


def _rows_per_program(M: int, col_blocks: int, cap: int) -> int:
    """Rows per program: the most (a power of two <= cap dividing M) that still leaves MIN_PROGRAMS programs,
    else SUB_ROWS. Any choice gives every row the same result (SUB_ROWS tiles): this only trades weight
    re-reads (one per program row) against programs in flight."""
    b = cap
    while b > SUB_ROWS:
        if M % b == 0 and (M // b) * col_blocks >= MIN_PROGRAMS:
            return b
        b //= 2
    return SUB_ROWS


def _block(size: int, cap: int) -> int:
    """Largest power of two <= cap dividing size (>= 16), or 0."""
    b = cap
    while b >= 16:
        if size % b == 0:
            return b
        b //= 2
    return 0


def check_shapes(mode, x, w, layer, *, head_dim=None, groups=None, w_transposed=False, bias=None, head_norm=None):
    """Validates a launch; NotImplementedError for shapes the kernel does not tile (callers fall back)."""
    if mode not in MODES:
        raise ValueError(f"{mode=} must be one of {MODES}")
    if x.ndim != 2 or w.ndim != 3:
        raise ValueError(f"expected x [M, Kd] and stacked w [L, Kd, Nc], got {x.shape=} {w.shape=}")
    if x.shape[1] != w.shape[2 if w_transposed else 1]:
        raise ValueError(f"contraction mismatch: {x.shape=} {w.shape=}")
    C.check_layer(w, layer)
    M, kd = x.shape
    nc = w.shape[1 if w_transposed else 2]
    if M % 16 or kd % 16 or kd > MAX_CONTRACTION:
        raise NotImplementedError(f"rows {M} and contraction {kd} must be multiples of 16, {kd=} <= "
                                  f"{MAX_CONTRACTION}")
    if (bias is not None or head_norm is not None) and mode != "qkv_rope":
        raise ValueError(f"bias and head_norm apply to mode='qkv_rope' only, got {mode=}")
    if mode == "qkv_rope":
        if head_dim not in C.SUPPORTED_HEAD_DIMS or nc % (head_dim * (groups + 2)):
            raise NotImplementedError(f"{head_dim=} / {w.shape=} do not tile into heads of {groups}+2")
        if bias is not None and tuple(bias.shape) != (w.shape[0], nc):
            raise ValueError(f"bias must be [L, Nc] = {(w.shape[0], nc)}, got {bias.shape}")
        if head_norm is not None and tuple(head_norm.shape) != (w.shape[0], 2, head_dim):
            raise ValueError(f"head_norm must be [L, 2, H] = {(w.shape[0], 2, head_dim)}, got {head_norm.shape}")
    elif mode == "glu":
        if nc % 2 or not _block(nc // 2, 32):
            raise NotImplementedError(f"gate/up columns {nc} must be 2 x a multiple of 16")
    elif not _block(nc, 32):
        raise NotImplementedError(f"columns {nc} must be a multiple of 16")
    if x.dtype not in C.SUPPORTED_DTYPES or w.dtype != x.dtype:
        raise NotImplementedError(f"x / w dtypes {x.dtype} / {w.dtype} must match and be bf16, f16 or f32")


def dense_kernel(x, w, layer, **kwargs):
    """One fused decode-sized dense step (module docstring), Pallas; arguments as `_dense_call`."""
    C.check_layer(w, layer)   # a concrete layer is checked here, before jit makes it a tracer
    return _dense_call(x, w, layer, **kwargs)


@functools.partial(jax.jit, static_argnames=("mode", "eps", "head_dim", "groups", "block_m", "block_n", "max_chunk", "num_warps",
                                             "num_stages", "interpret", "w_transposed"))
def _dense_call(x, w, layer, *, mode, norm_w=None, eps=1e-5, aux=None, inv_freq=None, head_dim=None,
                groups=None, bias=None, head_norm=None, block_m=None, block_n=None, max_chunk=None, num_warps=None,
                num_stages=1, interpret=False, w_transposed=False):
    """The jitted launch of `dense_kernel`.

    Args:
      x: [M, Kd] activations (the residual stream for qkv_rope / glu; attention output or SwiGLU for residual).
      w: [L, Kd, Nc] stacked weights (qkv_rope: the fused [L, D, K*(G+2)*H]; glu: [L, D, 2F], gate then up;
        residual: [L, Kd, D]; head: [1, D, V]; with w_transposed each as [L, Nc, Kd], e.g. the tied embedding
        [1, V, D]); layer: int
        or traced int32 scalar.
      norm_w: [L, Kd] RMSNorm weights (qkv_rope, glu, head); eps: its epsilon.
      aux: residual: the stream [M, D] to add to; qkv_rope: int32[M] RoPE positions.
      inv_freq: f32[H/2] RoPE inverse frequencies (qkv_rope); head_dim, groups: H and G (qkv_rope).
      bias: optional [L, Nc] q/k/v biases in wqkv's column order, added before the head norm and RoPE (qkv_rope,
        Qwen2); head_norm: optional [L, 2, H] RMSNorm weights of each q head and of the k head, with `eps`, after
        the bias and before RoPE (qkv_rope, Qwen3).
      block_m: rows per program (at most; None: `_rows_per_program` with TUNED's cap); block_n: output columns per program (qkv_rope: always one head);
        max_chunk: longest contraction piece;
        num_warps, num_stages: Triton launch parameters. None: TUNED.
    Returns:
      [M, Nc] (qkv_rope, residual) or [M, Nc / 2] (glu), x.dtype; [M, Nc] float32 (head).
    """
    check_shapes(mode, x, w, layer, head_dim=head_dim, groups=groups, w_transposed=w_transposed, bias=bias,
                 head_norm=head_norm)
    C.check_platform(interpret)
    M, kd = x.shape
    L, nc = w.shape[0], w.shape[1 if w_transposed else 2]
    tuned = TUNED["residual_long" if mode == "residual" and kd > 1024 else mode]
    block_n, max_chunk, num_warps = (tuned[j + 1] if v is None else v
                                     for j, v in enumerate((block_n, max_chunk, num_warps)))
    if mode == "qkv_rope":
        block_n, ncols = head_dim, nc
    else:
        ncols = nc // 2 if mode == "glu" else nc
        block_n = _block(ncols, block_n)
    block_m = _rows_per_program(M, ncols // block_n, tuned[0]) if block_m is None else _block(M, block_m)
    norm = mode != "residual"
    if norm and (norm_w is None or norm_w.shape != (L, kd)):
        raise ValueError(f"{mode} needs norm_w [L, Kd] = {(L, kd)}, got {None if norm_w is None else norm_w.shape}")
    if mode == "residual" and (aux is None or aux.shape != (M, nc)):
        raise ValueError(f"residual needs aux [M, Nc] = {(M, nc)}, got {None if aux is None else aux.shape}")
    if mode == "qkv_rope" and (aux is None or aux.shape != (M,) or inv_freq is None):
        raise ValueError("qkv_rope needs aux = int32[M] positions and inv_freq [H/2]")
    # An operand a mode does not read is a 16-element placeholder (not an [L, Kd] or [M] array per launch).
    def unused(shape, dtype):
        return jnp.zeros(shape, dtype), pl.BlockSpec(shape, lambda m, n: (0,) * len(shape))

    if norm:
        nw, nw_spec = norm_w, pl.BlockSpec((L, kd), lambda m, n: (0, 0))
    else:
        nw, nw_spec = unused((1, 16), x.dtype)
    if mode == "residual":
        aux_spec = pl.BlockSpec((block_m, block_n), lambda m, n: (m, n))
    elif mode == "qkv_rope":
        aux, aux_spec = aux.astype(jnp.int32), pl.BlockSpec((block_m,), lambda m, n: (m,))
    else:
        aux, aux_spec = unused((16,), jnp.int32)
    if mode == "qkv_rope":
        inv = jnp.asarray(inv_freq, jnp.float32)
        inv_spec = pl.BlockSpec((inv.shape[0],), lambda m, n: (0,))
    else:
        inv, inv_spec = unused((16,), jnp.float32)
    if bias is not None:
        b, b_spec = bias, pl.BlockSpec(bias.shape, lambda m, n: (0, 0))
    else:
        b, b_spec = unused((1, 16), x.dtype)
    if head_norm is not None:
        hn, hn_spec = head_norm, pl.BlockSpec(head_norm.shape, lambda m, n: (0, 0, 0))
    else:
        hn, hn_spec = unused((1, 1, 16), x.dtype)
    kernel = functools.partial(_dense_kernel, mode=mode, eps=float(eps), chunks=tuple(_chunks(kd, max_chunk)), block_n=block_n,
                               ncols=ncols, groups=groups, norm=norm, w_transposed=w_transposed, bias=bias is not None,
                               head_norm=head_norm is not None)
    return pl.pallas_call(
        kernel,
        grid=(M // block_m, ncols // block_n),
        in_specs=[
            C.LAYER_SPEC,
            pl.BlockSpec((block_m, kd), lambda m, n: (m, 0)),
            nw_spec,
            pl.BlockSpec(w.shape, lambda m, n: (0, 0, 0)),
            aux_spec,
            inv_spec,
            b_spec,
            hn_spec,
        ],
        out_specs=pl.BlockSpec((block_m, block_n), lambda m, n: (m, n)),
        out_shape=jax.ShapeDtypeStruct((M, ncols), jnp.float32 if mode == "head" else x.dtype),
        compiler_params=C.BlockSizes(num_warps=num_warps, num_stages=num_stages).compiler_params(),
        interpret=interpret,
        name=f"dense_{mode}",
    )(jnp.reshape(jnp.asarray(layer, jnp.int32), (1,)), x, nw, w, aux, inv, b, hn)


def dense_reference(x, w, layer, *, mode, norm_w=None, eps=1e-5, aux=None, inv_freq=None, head_dim=None,
                    groups=None, w_transposed=False, bias=None, head_norm=None, **_):
    """The same step in float32 jnp (HIGHEST precision, no intermediate rounding): the kernels' ground truth."""
    f32 = jnp.float32
    wl = w[layer].astype(f32)
    wl = wl.T if w_transposed else wl
    h = x.astype(f32)
    if mode != "residual":
        h = h * lax.rsqrt(jnp.mean(h * h, axis=1, keepdims=True) + eps) * norm_w[layer].astype(f32)[None]
    y = jnp.dot(h, wl, precision=lax.Precision.HIGHEST)
    if mode == "head":
        return y
    if mode == "residual":
        return (aux.astype(f32) + y).astype(x.dtype)
    if mode == "glu":
        g, u = jnp.split(y, 2, axis=1)
        return (jax.nn.silu(g) * u).astype(x.dtype)
    M = x.shape[0]
    if bias is not None:
        y = y + bias[layer].astype(f32)[None]
    y = y.reshape(M, -1, groups + 2, head_dim)
    roles = jnp.arange(groups + 2)[None, None, :, None]
    if head_norm is not None:   # q heads by head_norm[layer, 0], the k head by [layer, 1], v unchanged
        hw = jnp.where(roles < groups, head_norm[layer, 0].astype(f32), head_norm[layer, 1].astype(f32))
        normed = y * lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + eps) * hw
        y = jnp.where(roles <= groups, normed, y)
    ang = aux.astype(f32)[:, None] * jnp.asarray(inv_freq, f32)[None, :]
    cos, sin = jnp.cos(ang)[:, None, None], jnp.sin(ang)[:, None, None]
    y1, y2 = jnp.split(y, 2, axis=-1)
    rot = jnp.concatenate([y1 * cos - y2 * sin, y2 * cos + y1 * sin], axis=-1)
    return jnp.where(roles <= groups, rot, y).reshape(M, -1).astype(x.dtype)


def dense(x, w, layer, *, mode, implementation=None, **kwargs):
    """`dense_kernel` ("pallas"), `dense_reference` ("xla"), or the kernel with fallback (None)."""
    return C.dispatch(implementation, dense_kernel, dense_reference, x, w, layer, mode=mode, **kwargs)
