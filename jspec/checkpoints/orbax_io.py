"""Orbax I/O of a flat or nested dict of arrays: the one copy the model store and the drafter store use.

Orbax is imported on first use (it is slow to import and `jspec generate` on a loaded model never needs it).
"""
from __future__ import annotations


def save_tree(path: str, tree) -> None:
    """Write `tree` (a pytree of arrays) to the Orbax directory `path` (which must not exist yet)."""
    ocp = _ocp()
    _checkpointer().save(path, args=ocp.args.StandardSave(tree))


def restore_tree(path: str, target):
    """Read the pytree at `path` into the shapes, dtypes and shardings of `target` (jax.ShapeDtypeStruct leaves)."""
    ocp = _ocp()
    return _checkpointer().restore(path, args=ocp.args.StandardRestore(target))


def tree_metadata(path: str):
    """The stored pytree's metadata (shape and dtype per leaf) without reading any weights."""
    return _checkpointer().metadata(path).item_metadata.tree


def _ocp():
    import orbax.checkpoint as ocp

    return ocp


def _checkpointer():
    ocp = _ocp()
    return ocp.Checkpointer(ocp.StandardCheckpointHandler())
