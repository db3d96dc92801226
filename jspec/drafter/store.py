"""A trained drafter on disk: the block's weights (Orbax, bf16 by default) + config.json.

    config.json  {"format": "jspec-drafter", "format_version": 1, "model": <target ModelConfig>, "window": W,
                  "dtype": "bfloat16", "params": {name: shape}, "meta": {...}}
    params/      Orbax StandardCheckpointHandler pytree
    tuned.json   optional: the draft shapes measured fastest for this drafter, by batch size (`write_shape`,
                 `jspec tune --method longspec --save-shape`): {"format": "jspec-drafter-shapes", "by_batch":
                 [{"batch": B, "tree_widths": [...], ...provenance}, ...]}; `jspec.generate` drafts with
                 `Drafter.widths_for(batch)` when the caller names no shape

The embedding and LM head are not stored: they are the target's. `model` records the target config the
block was trained against (its shapes and RoPE); `load_drafter` returns it so callers can check it matches.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import NamedTuple, Optional

import jax
import numpy as np

from jspec.checkpoints.orbax_io import restore_tree, save_tree
from jspec.config import ModelConfig

FORMAT = "jspec-drafter"
FORMAT_VERSION = 1
SHAPES_FILE = "tuned.json"
SHAPES_FORMAT = "jspec-drafter-shapes"


class Drafter(NamedTuple):
    params: dict        # the block (layout in jspec/drafter/model.py)
    cfg: ModelConfig    # the target config it was trained for
    window: int         # self-attention window W (the ring's size)
    meta: dict          # free-form: target path, steps, flags, final loss
    shapes: tuple = ()  # ((batch, tree widths), ...) by batch: the tuned draft shapes (tuned.json), if any

    def widths_for(self, batch: int) -> Optional[tuple]:
        """The tree widths tuned at the largest batch <= `batch` (below every tuned batch: the smallest's), or
        None when this drafter carries no tuned shapes."""
        if not self.shapes:
            return None
        fits = [w for b, w in self.shapes if b <= batch]
        return fits[-1] if fits else self.shapes[0][1]


def save_drafter(path: str, dparams: dict, cfg: ModelConfig, *, window: int, dtype: str = "bfloat16",
                 meta: Optional[dict] = None) -> str:
    """Write the drafter atomically (temp dir + rename; an existing `path` is replaced). Returns the path."""
    out = os.path.abspath(path)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    np_dtype = _np_dtype(dtype)
    cpu = jax.devices("cpu")[0]
    arrays = {k: jax.device_put(np.asarray(jax.device_get(v)).astype(np_dtype), cpu) for k, v in dparams.items()}
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)   # mkdtemp makes it private (0700); the export is a normal directory
        save_tree(os.path.join(tmp, "params"), arrays)
        cfg_json = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": cfg.to_dict(), "window": window,
                    "dtype": dtype, "params": {k: list(a.shape) for k, a in arrays.items()}, "meta": meta or {}}
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg_json, f, indent=2, default=str)
        if os.path.lexists(out):
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load_drafter(path: str, *, dtype: Optional[str] = None) -> Drafter:
    """Load a drafter written by `save_drafter` (or the `drafter/` folder `train_drafter` exports).

    Args:
      path: the drafter directory.
      dtype: cast the weights ('bfloat16' | 'float16' | 'float32'); None keeps the stored dtype.
    """
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"{path} has no config.json: not a drafter exported by `jspec train-drafter`")
    with open(cfg_path) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{cfg_path} is not a jspec drafter (format {meta.get('format')!r}, expected {FORMAT!r})")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(f"{cfg_path} has format_version {meta['format_version']}, newer than this jspec reads")
    stored = _np_dtype(meta["dtype"])
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {k: jax.ShapeDtypeStruct(tuple(s), stored, sharding=sharding) for k, s in meta["params"].items()}
    params = restore_tree(os.path.abspath(os.path.join(path, "params")), target)
    if dtype is not None:
        params = jax.tree.map(lambda x: x.astype(_np_dtype(dtype)), params)
    return Drafter(params=params, cfg=ModelConfig.from_dict(meta["model"]), window=int(meta["window"]),
                   meta=meta.get("meta", {}), shapes=read_shapes(path))


def read_shapes(path: str) -> tuple:
    """((batch, tree widths), ...) sorted by batch from `path`/tuned.json; () when there is no such file.
    Raises ValueError when it exists but is not a valid shapes file."""
    file = os.path.join(path, SHAPES_FILE)
    if not os.path.isfile(file):
        return ()
    with open(file) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("format") != SHAPES_FORMAT:
        raise ValueError(f"{file} is not a jspec drafter shapes file (format {SHAPES_FORMAT!r} expected)")
    shapes = {}
    for e in doc.get("by_batch", []):
        try:
            b, w = int(e["batch"]), tuple(int(x) for x in e["tree_widths"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{file}: bad entry {e!r} (needs batch and tree_widths)") from None
        if b < 1 or not w or min(w) < 1:
            raise ValueError(f"{file}: bad entry {e!r} (batch >= 1, widths >= 1)")
        shapes[b] = w
    return tuple(sorted(shapes.items()))


def write_shape(path: str, batch: int, tree_widths, **provenance) -> str:
    """Record `tree_widths` as the drafter's tuned shape at `batch` in `path`/tuned.json (an entry for the same
    batch is replaced, others kept), with free-form provenance (tokens/s, speedup, device, source). Written
    atomically (temp file + rename). Returns the file's path."""
    widths = [int(w) for w in tree_widths]
    if int(batch) < 1 or not widths or min(widths) < 1:
        raise ValueError(f"batch {batch} and tree widths {widths} must be >= 1")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"{path} is not a drafter directory (no config.json)")
    file = os.path.join(path, SHAPES_FILE)
    doc = {"format": SHAPES_FORMAT, "by_batch": []}
    if read_shapes(path):   # an existing file must be valid before it is merged into
        with open(file) as f:
            doc = json.load(f)
    entries = [e for e in doc.get("by_batch", []) if int(e["batch"]) != int(batch)]
    entries.append({"batch": int(batch), "tree_widths": widths, **provenance})
    doc["by_batch"] = sorted(entries, key=lambda e: int(e["batch"]))
    fd, tmp = tempfile.mkstemp(prefix=".tuned.", suffix=".json", dir=path)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)   # mkstemp makes it private (0600); this is an ordinary file
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, file)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return file


def _np_dtype(name: str):
    import ml_dtypes

    return {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}[name]

