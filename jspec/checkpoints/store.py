"""jspec checkpoints on disk: Orbax weights + config.json + Hugging Face tokenizer files.

Layout of a checkpoint directory:

    config.json     {"format": "jspec-checkpoint", "format_version": 1, "model": ModelConfig.to_dict(),
                     "params": {"layers.wq": {"shape": [...], "dtype": "bfloat16"}, ...},
                     "tokenizer": "tokenizer" | null, "source": str | null}
    params/         Orbax (StandardCheckpointHandler) pytree, every leaf in cfg.dtype
    tokenizer/      tokenizer.json, tokenizer_config.json, ... (absent when the source had none)

`save` is atomic: it writes everything into a temporary directory beside `out_dir` and renames it into
place, so a reader sees either nothing or a complete checkpoint. config.json is written last.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Any, Optional, Union

import numpy as np

from jspec.config import ModelConfig

from .layout import CheckpointError, check_params, numpy_dtype
from .orbax_io import restore_tree, save_tree, tree_metadata

FORMAT = "jspec-checkpoint"
FORMAT_VERSION = 1
_CONVERT_HINT = ("re-create it with `jspec convert --from-gguf FILE --out DIR --overwrite` (or --from-hf DIR), "
                 "or `jspec fetch smollm2-135m` for the default model")


def save(out_dir: str, params: dict, cfg: ModelConfig, tokenizer_src: Union[str, dict, None] = None, *,
         overwrite: bool = False, source: Optional[str] = None) -> str:
    """Write a checkpoint atomically.

    Args:
      out_dir: the checkpoint directory to create.
      params: our layout (numpy or jax arrays); every leaf is cast to cfg.dtype.
      cfg: the model config; its shapes are checked against params first.
      tokenizer_src: a Hugging Face directory whose tokenizer files are copied, or the tokenizer_info dict
        `read_gguf` returns, or None for no tokenizer.
      overwrite: replace an existing out_dir (the old one is removed only once the new one is complete).
      source: free text recorded in config.json (where the weights came from).
    Returns:
      The absolute path of out_dir.
    """
    out = os.path.abspath(out_dir)
    if os.path.lexists(out) and not overwrite:
        raise CheckpointError(f"{out} already exists; pass overwrite=True (--overwrite) to replace it")
    check_params(params, cfg)
    dtype = numpy_dtype(cfg.dtype)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private (0700); a checkpoint is a normal dir
        arrays = _to_cpu_arrays(params, dtype)
        save_tree(os.path.join(tmp, "params"), arrays)
        tokenizer = _write_tokenizer(tokenizer_src, os.path.join(tmp, "tokenizer"))
        meta = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "model": cfg.to_dict(),
            "params": {k: {"shape": list(a.shape), "dtype": cfg.dtype} for k, a in _flatten(arrays).items()},
            "tokenizer": "tokenizer" if tokenizer else None, "source": source,
        }
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(meta, f, indent=2)
            f.flush()
            os.fsync(f.fileno())  # config.json marks a complete checkpoint: make it durable before the rename
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load(ckpt_dir: str, dtype: Optional[str] = None, sharding: Any = None) -> tuple[dict, ModelConfig]:
    """Load a checkpoint written by `save`.

    Args:
      ckpt_dir: the checkpoint directory.
      dtype: cast the weights to this dtype ('bfloat16' | 'float16' | 'float32'); None keeps the stored one.
        The returned cfg.dtype says which.
      sharding: a `jax.sharding.Sharding` for every leaf, or a pytree of them shaped like params; None puts
        everything on the default device.
    Returns:
      (params, cfg): params as jax arrays in our layout.
    Raises:
      CheckpointError: the directory is missing, incomplete or corrupt (the message says how to fix it).
    """
    import jax

    cfg = load_config(ckpt_dir)
    if dtype is not None:
        numpy_dtype(dtype)  # validates the name
        cfg = dataclasses.replace(cfg, dtype=dtype)
    path = os.path.join(os.path.abspath(ckpt_dir), "params")
    if not os.path.isdir(path):
        raise CheckpointError(f"{ckpt_dir} has no params/ directory; the checkpoint is incomplete: {_CONVERT_HINT}")
    try:
        stored = tree_metadata(path)
    except Exception as e:
        raise CheckpointError(f"cannot read the weight metadata in {path} ({_first_line(e)}); the "
                              f"checkpoint is corrupt: {_CONVERT_HINT}") from e
    try:
        check_params(stored, cfg, source=f"{path} (stored weights)")
    except CheckpointError as e:
        raise CheckpointError(f"{e}; the checkpoint is inconsistent: {_CONVERT_HINT}") from None
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    if isinstance(sharding, jax.sharding.Sharding):
        sharding = jax.tree.map(lambda _: sharding, stored)
    target = jax.tree.map(lambda m, s: jax.ShapeDtypeStruct(tuple(m.shape), numpy_dtype(cfg.dtype), sharding=s),
                          stored, sharding)
    try:
        params = restore_tree(path, target)
    except Exception as e:  # tensorstore / zarr errors on truncated or damaged chunk files
        raise CheckpointError(f"cannot read the weights in {path}: the files are truncated or corrupt "
                              f"({_first_line(e)}); {_CONVERT_HINT}") from e
    return params, cfg


def load_config(ckpt_dir: str) -> ModelConfig:
    """The ModelConfig stored in `ckpt_dir`/config.json (cheap: reads no weights)."""
    if not os.path.isdir(ckpt_dir):
        raise CheckpointError(f"no checkpoint at {ckpt_dir}: the directory does not exist; {_CONVERT_HINT}")
    path = os.path.join(ckpt_dir, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{ckpt_dir} has no config.json, so it is not a jspec checkpoint (or its "
                              f"conversion was interrupted); {_CONVERT_HINT}")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); the checkpoint is corrupt: {_CONVERT_HINT}") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a jspec checkpoint config (no \"format\": \"{FORMAT}\"); "
                              f"point at a directory written by `jspec convert`")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{path} has format_version {meta['format_version']}, newer than this jspec "
                              f"understands ({FORMAT_VERSION}); upgrade jspec")
    try:
        return ModelConfig.from_dict(meta["model"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path} holds an invalid model config ({e}); {_CONVERT_HINT}") from e


def _write_tokenizer(src: Union[str, dict, None], out_dir: str) -> bool:
    from .tokenizer import copy_hf_tokenizer, write_gguf_tokenizer

    if src is None:
        return False
    if isinstance(src, dict):
        write_gguf_tokenizer(src, out_dir)
        return True
    if os.path.isdir(src):
        return copy_hf_tokenizer(src, out_dir)
    raise CheckpointError(f"tokenizer_src {src!r} is neither a directory nor read_gguf's tokenizer_info")


def _replace(tmp: str, out: str) -> None:
    """Rename tmp to out; an existing out is moved aside first and deleted only after the swap."""
    if not os.path.lexists(out):
        os.rename(tmp, out)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
    os.rmdir(old)
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _to_cpu_arrays(params: dict, dtype: np.dtype) -> dict:
    """Cast on the host and place on the CPU device: conversion never needs an accelerator's memory."""
    import jax

    cpu = jax.devices("cpu")[0]
    return jax.tree.map(lambda x: jax.device_put(np.asarray(x).astype(dtype, copy=False), cpu), params)


def _first_line(e: BaseException) -> str:
    """Orbax/TensorStore errors span many lines of JSON spec; the first says what went wrong."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out

