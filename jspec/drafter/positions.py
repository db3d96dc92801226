"""LongSpec's two training regimes (paper section 3.2): anchor-offset position indices and noisy
cross-attention. Both are drawn on the host from a numpy Generator seeded by (seed, step), so a resumed run
sees exactly the positions and lags an uninterrupted one would.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

MAX_SINK = 4   # sink s in [0, MAX_SINK]: the paper reserves the first 4 tokens as attention sinks
MAX_LAG = 4    # lag p in [1, MAX_LAG]


def anchor_positions(seq_len: int, sink: int, offset: int) -> np.ndarray:
    """Positions [0 .. s) ∪ [s + o .. o + L): the first `sink` tokens keep their indices, the rest jump by
    `offset`, so a short training sequence puts its later tokens at long-context distances from the sinks.

    >>> anchor_positions(8, 2, 100).tolist()
    [0, 1, 102, 103, 104, 105, 106, 107]
    """
    t = np.arange(seq_len, dtype=np.int64)
    return np.where(t < sink, t, t + offset).astype(np.int32)


def sample_anchor_positions(rng: np.random.Generator, batch: int, seq_len: int, max_position: int,
                            *, max_sink: int = MAX_SINK) -> np.ndarray:
    """Per row: s ~ U{0..max_sink}, o ~ U{0..max_position - seq_len}; returns int32[batch, seq_len], every
    position < max_position (the target's trained context).

    Draw order (kept stable so tests can recompute it): all sinks, then all offsets.
    """
    if seq_len > max_position:
        raise ValueError(f"{seq_len=} exceeds the target's {max_position=}")
    sinks = rng.integers(0, max_sink + 1, size=batch)
    offsets = rng.integers(0, max_position - seq_len + 1, size=batch)
    return np.stack([anchor_positions(seq_len, int(s), int(o)) for s, o in zip(sinks, offsets)])


def sample_lag(rng: np.random.Generator, *, max_lag: int = MAX_LAG) -> int:
    """The step's verification lag p ~ U{1..max_lag} (one per step, as in the paper)."""
    return int(rng.integers(1, max_lag + 1))


def noisy_cross_len(batch: int, seq_len: int, lag):
    """Cross-attention visibility for lag p: query t sees target slots j <= t - p, i.e. j < t - p + 1.

    At inference the drafter's first draft after a verification sees the target's KV up to the previous
    token (p = 1) and its k-th chained draft lags by k; training with a random p covers those cases.
    Returns int32[batch, seq_len] (the `cross_len` of `drafter_forward_train`); rows t < p see nothing.
    """
    t = jnp.arange(seq_len, dtype=jnp.int32)
    return jnp.broadcast_to(jnp.maximum(t - jnp.asarray(lag, jnp.int32) + 1, 0), (batch, seq_len))


def cross_mask(cross_len, n_keys: int):
    """The dense bool[B, T, S] mask that `cross_len` stands for (tests, inspection)."""
    j = jnp.arange(n_keys, dtype=jnp.int32)
    return j[None, None, :] < cross_len[:, :, None]
