"""LongSpec drafter: one decoder block over the target's last-layer KV cache, and its training.

The model functions import light; `train_drafter` (optax, orbax, tqdm, matplotlib) is loaded on first use.
"""
from .model import (DEFAULT_WINDOW, DrafterCache, attend, drafter_commit, drafter_fill, drafter_forward_train,
                    drafter_tree_step, init_drafter_cache, init_drafter_params)
from .positions import anchor_positions, cross_mask, noisy_cross_len, sample_anchor_positions, sample_lag
from .store import Drafter, load_drafter, read_shapes, save_drafter, write_shape

__all__ = ["DEFAULT_WINDOW", "Drafter", "DrafterCache", "anchor_positions", "attend", "cross_mask",
           "drafter_commit", "drafter_fill", "drafter_forward_train", "drafter_tree_step", "init_drafter_cache",
           "init_drafter_params",
           "load_drafter", "noisy_cross_len", "read_shapes", "sample_anchor_positions", "sample_lag", "save_drafter",
           "train_drafter", "write_shape"]


def __getattr__(name):
    if name == "train_drafter":
        from .train import train_drafter

        return train_drafter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
