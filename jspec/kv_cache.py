"""Fixed-capacity KV cache: an immutable pytree updated in place (buffers donated by the jitted callers).

    k, v     [L, B, S_max, K, H]   cfg.dtype (bf16 by default)
    lengths  int32[B]              valid positions per sequence (rows may differ: ragged batches)

Sequence b's tokens sit at slots 0 .. lengths[b]-1 of its row (left-aligned), at the RoPE position of the
slot index, so a rollback after a rejected draft only moves `lengths`: O(1), nothing is erased. Slots at or
beyond `lengths` may hold stale entries; every attention path masks them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jspec.config import ModelConfig


@struct.dataclass
class KVCache:
    k: jax.Array        # [L, B, S, K, H]
    v: jax.Array        # [L, B, S, K, H]
    lengths: jax.Array  # int32[B]

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def batch(self) -> int:
        return self.k.shape[1]


def init(cfg: ModelConfig, *, batch: int, capacity: int, dtype=None) -> KVCache:
    """An empty cache for `batch` sequences of at most `capacity` tokens each."""
    if capacity <= 0 or batch <= 0:
        raise ValueError(f"{batch=} and {capacity=} must be positive")
    dtype = jnp.dtype(dtype or cfg.dtype)
    shape = (cfg.n_layers, batch, capacity, cfg.n_kv_heads, cfg.head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), lengths=jnp.zeros((batch,), jnp.int32))


def write(k_all: jax.Array, v_all: jax.Array, layer, slots: jax.Array, k_new: jax.Array, v_new: jax.Array):
    """Scatter one layer's new entries into the stacked buffers.

    Args:
      k_all, v_all: [L, B, S, K, H] buffers (threaded through the layers so XLA updates them in place).
      layer: int32 scalar layer index.
      slots: int32[B, T] destination slot of each new token (out-of-range slots are dropped).
      k_new, v_new: [B, T, K, H].
    """
    b = jnp.arange(slots.shape[0], dtype=jnp.int32)[:, None]
    k_all = k_all.at[layer, b, slots].set(k_new.astype(k_all.dtype), mode="drop")
    v_all = v_all.at[layer, b, slots].set(v_new.astype(v_all.dtype), mode="drop")
    return k_all, v_all


def rollback(cache: KVCache, lengths: jax.Array) -> KVCache:
    """Forget every entry at or beyond `lengths[b]` (O(1): only the lengths move)."""
    return cache.replace(lengths=jnp.minimum(lengths.astype(jnp.int32), cache.lengths))

