"""Tensor parallelism over the GPUs of one host (docs/architecture.md): a 1-D device mesh, heads sharded.

Only the *inputs* are placed; the jitted prefill/decode/speculative functions run unchanged and XLA's SPMD
partitioner inserts the collectives (Megatron-style: one all-reduce after `wo` and one after `w_down` per
layer). The layout, with tp the mesh axis (default "tp"):

    wq, wk, wv  [L, D, N|K, H]  heads on tp        bq, bk, bv  [L, N|K, H]  heads on tp
    wo          [L, N, H, D]    heads on tp        (row-parallel: its output is summed over tp)
    w_gate, w_up [L, D, F]      F on tp            w_down [L, F, D]  F on tp (row-parallel)
    wqkv [L, D, K, G+2, H], w_gu [L, D, 2, F]: the same, fused (the runtime layout), K / F on tp
    lm_head     [D, V]          V on tp when tp divides V (the logits stay vocab-sharded), else replicated
    embed, norms, q_norm/k_norm replicated
    cache k, v  [L, B, S, K, H] K on tp            lengths replicated

Query head n reads KV head n // G, so sharding N and K into tp equal blocks keeps each query head on the
device of its KV head as long as tp divides K (then it divides N = G K). The Pallas kernels are custom calls
the partitioner cannot split, so `AttnImpl(mesh=mesh)` runs them per shard through `shard_map`
(jspec/attention.py); the pure-XLA attention needs no hint.

    mesh = make_mesh(4, cfg=cfg)
    params = shard_params(params, cfg, mesh)
    cache = init_cache(cfg, mesh, batch=B, capacity=S)      # or shard_cache(kv_cache.init(...), mesh)
    logits, cache = prefill.prefill(params, cfg, tokens, lengths, cache, impl=AttnImpl(mesh=mesh))
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jspec import kv_cache
from jspec.config import ModelConfig


class ShardingError(ValueError):
    """A mesh or model that cannot be sharded as asked; the message names the numbers."""


def make_mesh(n_devices: Optional[int] = None, axis: str = "tp", *, cfg: Optional[ModelConfig] = None) -> Mesh:
    """A 1-D mesh over the first `n_devices` local devices (default: all of them).

    Args:
      n_devices: tensor-parallel degree tp.
      axis: the mesh axis name the shardings use.
      cfg: optional; when given, also checks that tp divides its heads (see `check_divisible`).
    """
    devices = jax.devices()
    n = len(devices) if n_devices is None else int(n_devices)
    if n < 1:
        raise ShardingError(f"n_devices={n} must be >= 1")
    if n > len(devices):
        raise ShardingError(
            f"n_devices={n} but only {len(devices)} {devices[0].platform} device(s) are available"
            + (" (on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax)"
               if devices[0].platform == "cpu" else ""))
    if cfg is not None:
        check_divisible(cfg, n)
    return Mesh(np.asarray(devices[:n]), (axis,))


def check_divisible(cfg: ModelConfig, tp: int) -> None:
    """Raise ShardingError unless tp divides the query heads N, the KV heads K and the FFN width F."""
    bad = [f"{name}={size}" for name, size in
           (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads), ("ffn_dim", cfg.ffn_dim)) if size % tp]
    if bad:
        raise ShardingError(f"cannot shard the model over tp={tp} devices: {' and '.join(bad)} "
                            f"{'is' if len(bad) == 1 else 'are'} not divisible by {tp} (tp must divide the query "
                            f"heads, the KV heads and the FFN width); tp can be one of {_divisors(cfg)}")


def _divisors(cfg: ModelConfig) -> list[int]:
    return [d for d in range(1, cfg.n_kv_heads + 1)
            if cfg.n_heads % d == 0 and cfg.n_kv_heads % d == 0 and cfg.ffn_dim % d == 0]


def tp_axis(mesh: Mesh) -> str:
    """The tensor-parallel axis: "tp" if the mesh has one, else its only axis."""
    if "tp" in mesh.axis_names:
        return "tp"
    if len(mesh.axis_names) == 1:
        return mesh.axis_names[0]
    raise ShardingError(f"mesh axes {mesh.axis_names} have no 'tp' axis to shard heads over")


def tp_size(mesh: Mesh) -> int:
    return mesh.shape[tp_axis(mesh)]


def param_specs(cfg: ModelConfig, tp: str = "tp", tp_size: int = 1, stored: bool = False) -> dict:
    """PartitionSpecs shaped like the parameter pytree of `cfg` (layouts in config.py): the fused runtime
    layout, or with `stored` the checkpoint layout (separate wq/wk/wv, w_gate/w_up)."""
    col = {"wq": P(None, None, tp, None), "wk": P(None, None, tp, None), "wv": P(None, None, tp, None),
           "wqkv": P(None, None, tp, None, None), "w_gu": P(None, None, None, tp),
           "bq": P(None, tp, None), "bk": P(None, tp, None), "bv": P(None, tp, None),
           "wo": P(None, tp, None, None),                      # row-parallel over heads
           "w_gate": P(None, None, tp), "w_up": P(None, None, tp),
           "w_down": P(None, tp, None)}                        # row-parallel over F
    proj = ["wq", "wk", "wv", "w_gate", "w_up"] if stored else ["wqkv", "w_gu"]
    names = ["attn_norm", "mlp_norm", "wo", "w_down"] + proj
    if cfg.qkv_bias:
        names += ["bq", "bk", "bv"]
    if cfg.qk_norm:
        names += ["q_norm", "k_norm"]
    specs = {"embed": P(), "final_norm": P(), "layers": {n: col.get(n, P()) for n in names}}
    if not cfg.tie_embeddings:
        # Vocab-parallel head: each device computes its slice of the logits; argmax/softmax reduce over tp.
        specs["lm_head"] = P(None, tp) if cfg.vocab_size % tp_size == 0 else P()
    return specs


def param_shardings(cfg: ModelConfig, mesh: Mesh, stored: bool = False) -> dict:
    """NamedShardings shaped like the parameter pytree, fused runtime layout or `stored` (the checkpoint layout:
    pass those to `jspec.checkpoints.store.load(sharding=...)`)."""
    axis = tp_axis(mesh)
    check_divisible(cfg, mesh.shape[axis])
    specs = param_specs(cfg, axis, mesh.shape[axis], stored)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def cache_sharding(mesh: Mesh) -> kv_cache.KVCache:
    """NamedShardings shaped like a KVCache: k, v on their K axis, lengths replicated."""
    axis = tp_axis(mesh)
    kv = NamedSharding(mesh, P(None, None, None, axis, None))
    return kv_cache.KVCache(k=kv, v=kv, lengths=NamedSharding(mesh, P()))


def shard_params(params, cfg: ModelConfig, mesh: Mesh):
    """Place `params` (arrays or numpy, either layout) on the mesh; shape mismatches with `cfg` raise."""
    shardings = param_shardings(cfg, mesh, stored="wqkv" not in params.get("layers", {}))
    if jax.tree.structure(params) != jax.tree.structure(shardings):
        raise ShardingError(f"params do not match the layout of cfg: got {jax.tree.structure(params)}, "
                            f"expected {jax.tree.structure(shardings)}")
    return jax.device_put(params, shardings)


def shard_cache(cache: kv_cache.KVCache, mesh: Mesh) -> kv_cache.KVCache:
    """Place a KV cache on the mesh (K heads on tp)."""
    K = cache.k.shape[3]
    if K % tp_size(mesh):
        raise ShardingError(f"cache n_kv_heads={K} % tp={tp_size(mesh)} != 0")
    return jax.device_put(cache, cache_sharding(mesh))


def init_cache(cfg: ModelConfig, mesh: Mesh, *, batch: int, capacity: int, dtype=None) -> kv_cache.KVCache:
    """`kv_cache.init` created directly in its sharded layout (no full-size buffer on one device)."""
    check_divisible(cfg, tp_size(mesh))
    return _init_cache_fn(cfg, mesh, batch, capacity, None if dtype is None else str(np.dtype(dtype)))()


@functools.lru_cache(maxsize=8)
def _init_cache_fn(cfg, mesh, batch, capacity, dtype):
    return jax.jit(lambda: kv_cache.init(cfg, batch=batch, capacity=capacity, dtype=dtype),
                   out_shardings=cache_sharding(mesh))

