"""LongSpec drafter: one decoder block over the target's last-layer KV cache, and its store (what inference
needs).

Training (`jspec.offline.train_drafter`, `jspec train-drafter`) and its text (`jspec.offline.selfgen`,
`jspec.offline.training_text`) are offline tools on top of the public API (`jspec.api`) in `jspec/offline/`;
this package imports neither, so the API can import the drafter.
"""
from .model import (DEFAULT_WINDOW, DrafterCache, attend, drafter_commit, drafter_fill, drafter_forward_train,
                    drafter_tree_step, init_drafter_cache, init_drafter_params)
from .positions import anchor_positions, cross_mask, noisy_cross_len, sample_anchor_positions, sample_lag
from .store import Drafter, load_drafter, read_shapes, save_drafter, write_shape

__all__ = ["DEFAULT_WINDOW", "Drafter", "DrafterCache", "anchor_positions", "attend", "cross_mask",
           "drafter_commit", "drafter_fill", "drafter_forward_train", "drafter_tree_step", "init_drafter_cache",
           "init_drafter_params",
           "load_drafter", "noisy_cross_len", "read_shapes", "sample_anchor_positions", "sample_lag", "save_drafter",
           "write_shape"]
