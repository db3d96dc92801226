"""The one in-memory parameter layout (see `jspec/config.py`) and the translation into it.

Both source formats (Hugging Face safetensors and GGUF) store each projection as a 2-D Linear weight in
`[out, in]` order (GGUF's reader already reverses ggml's dimension order, so its numpy arrays agree with
Hugging Face's). `Collector` takes those per-layer tensors under *our* leaf names, checks each shape
against the config, reshapes it into our layout, and at the end stacks the layers and checks that every
leaf was filled. Readers keep their own bookkeeping of which *source* tensors they consumed.
"""
from __future__ import annotations

from typing import Callable, Optional

import ml_dtypes
import numpy as np

from jspec.config import ModelConfig


class CheckpointError(Exception):
    """A checkpoint is missing, corrupt or cannot be converted. The message says what is wrong and how to fix it."""


LAYER_LEAVES = ("attn_norm", "mlp_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "q_norm", "k_norm",
                "w_gate", "w_up", "w_down")
TOP_LEAVES = ("embed", "final_norm", "lm_head")

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def numpy_dtype(name: str) -> np.dtype:
    """'bfloat16' | 'float16' | 'float32' -> numpy dtype (bfloat16 through ml_dtypes)."""
    try:
        return np.dtype(DTYPES[name])
    except KeyError:
        raise CheckpointError(f"unsupported dtype {name!r}; choose one of: {', '.join(DTYPES)}") from None


def param_shapes(cfg: ModelConfig) -> dict:
    """The nested dict of leaf shapes `cfg` implies (the layout in jspec/config.py's docstring)."""
    V, D, L, N, K, H, F = (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                           cfg.head_dim, cfg.ffn_dim)
    layers = {
        "attn_norm": (L, D), "mlp_norm": (L, D),
        "wq": (L, D, N, H), "wk": (L, D, K, H), "wv": (L, D, K, H), "wo": (L, N, H, D),
        "w_gate": (L, D, F), "w_up": (L, D, F), "w_down": (L, F, D),
    }
    if cfg.qkv_bias:
        layers.update(bq=(L, N, H), bk=(L, K, H), bv=(L, K, H))
    if cfg.qk_norm:
        layers.update(q_norm=(L, H), k_norm=(L, H))
    shapes = {"embed": (V, D), "final_norm": (D,), "layers": layers}
    if not cfg.tie_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def _transforms(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], Callable[[np.ndarray], np.ndarray]]]:
    """Our leaf name -> (source shape in Hugging Face [out, in] order, function into our per-layer shape)."""
    V, D, N, K, H, F = cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    same = lambda x: x  # noqa: E731
    return {
        "embed": ((V, D), same),
        "final_norm": ((D,), same),
        "lm_head": ((V, D), lambda x: x.T),
        "attn_norm": ((D,), same),
        "mlp_norm": ((D,), same),
        # y = x @ W.T in torch, so W.T is our [in, out] matrix; the out axis then splits into heads.
        "wq": ((N * H, D), lambda x: x.T.reshape(D, N, H)),
        "wk": ((K * H, D), lambda x: x.T.reshape(D, K, H)),
        "wv": ((K * H, D), lambda x: x.T.reshape(D, K, H)),
        "wo": ((D, N * H), lambda x: x.T.reshape(N, H, D)),
        "bq": ((N * H,), lambda x: x.reshape(N, H)),
        "bk": ((K * H,), lambda x: x.reshape(K, H)),
        "bv": ((K * H,), lambda x: x.reshape(K, H)),
        "q_norm": ((H,), same),
        "k_norm": ((H,), same),
        "w_gate": ((F, D), lambda x: x.T),
        "w_up": ((F, D), lambda x: x.T),
        "w_down": ((D, F), lambda x: x.T),
    }


class Collector:
    """Gathers source tensors into our layout; `finish()` stacks layers and checks completeness.

    Args:
      cfg: the model config the tensors must match.
      source: a name for error messages (a path).
      dtype: cast every tensor to this numpy dtype as it arrives (bounds peak memory); None keeps it.
    """

    def __init__(self, cfg: ModelConfig, source: str, dtype: Optional[np.dtype] = None):
        self.cfg, self.source, self.dtype = cfg, source, dtype
        self.expected = param_shapes(cfg)
        self.transforms = _transforms(cfg)
        self.top: dict[str, np.ndarray] = {}
        self.layers: dict[str, list] = {k: [None] * cfg.n_layers for k in self.expected["layers"]}

    def put(self, leaf: str, layer: Optional[int], x: np.ndarray, src_name: str) -> None:
        """Store source tensor `src_name` (Hugging Face [out, in] orientation) as `leaf` of `layer`."""
        if leaf not in self.transforms:
            raise KeyError(leaf)
        wanted = self.expected["layers"] if layer is not None else self.expected
        if leaf not in wanted:
            raise CheckpointError(
                f"{self.source}: tensor {src_name!r} has no place in a {self.cfg.arch} model with this "
                f"config (no {leaf!r} parameter); the checkpoint and its config disagree")
        if layer is not None and not 0 <= layer < self.cfg.n_layers:
            raise CheckpointError(f"{self.source}: tensor {src_name!r} names layer {layer}, but the config has "
                                  f"{self.cfg.n_layers} layers")
        shape, fn = self.transforms[leaf]
        if tuple(x.shape) != shape:
            raise CheckpointError(f"{self.source}: tensor {src_name!r} has shape {tuple(x.shape)}, but the config "
                                  f"implies {shape}; the weights and config.json disagree")
        y = fn(x)
        if self.dtype is not None:
            y = y.astype(self.dtype)
        y = np.ascontiguousarray(y)
        if layer is None:
            if leaf in self.top:
                raise CheckpointError(f"{self.source}: tensor {src_name!r} appears twice")
            self.top[leaf] = y
        else:
            if self.layers[leaf][layer] is not None:
                raise CheckpointError(f"{self.source}: tensor {src_name!r} appears twice")
            self.layers[leaf][layer] = y

    def finish(self) -> dict:
        """Stack the layers; raise CheckpointError naming every leaf that was never filled."""
        missing = [k for k in self.expected if k != "layers" and k not in self.top]
        missing += [f"layers.{k}[{i}]" for k, per in self.layers.items() for i, x in enumerate(per) if x is None]
        if missing:
            shown = ", ".join(missing[:8]) + (f" (and {len(missing) - 8} more)" if len(missing) > 8 else "")
            raise CheckpointError(f"{self.source}: the checkpoint lacks tensors for: {shown}")
        params = dict(self.top)
        params["layers"] = {}
        for k in list(self.layers):
            params["layers"][k] = np.stack(self.layers.pop(k))  # pop: free the per-layer copies as we go
        check_params(params, self.cfg, self.source)
        return params


def check_params(params: dict, cfg: ModelConfig, source: str = "params") -> None:
    """Raise CheckpointError unless `params` has exactly the leaves and shapes `cfg` implies."""
    expected = param_shapes(cfg)
    problems = []
    for key in sorted(set(expected) | set(params)):
        if key == "layers":
            continue
        if key not in params:
            problems.append(f"missing {key}")
        elif key not in expected:
            problems.append(f"unexpected {key}")
        elif tuple(params[key].shape) != expected[key]:
            problems.append(f"{key} has shape {tuple(params[key].shape)}, expected {expected[key]}")
    got_layers, want_layers = params.get("layers", {}), expected["layers"]
    for key in sorted(set(want_layers) | set(got_layers)):
        if key not in got_layers:
            problems.append(f"missing layers.{key}")
        elif key not in want_layers:
            problems.append(f"unexpected layers.{key}")
        elif tuple(got_layers[key].shape) != want_layers[key]:
            problems.append(f"layers.{key} has shape {tuple(got_layers[key].shape)}, expected {want_layers[key]}")
    if problems:
        raise CheckpointError(f"{source} does not match the model config: " + "; ".join(problems))


def short_float(x: float) -> float:
    """The shortest decimal that is the same float32 (GGUF stores 1e-5 as 9.99999974e-06; show 1e-05)."""
    return float(str(np.float32(x)))


def progress_bar(total: int, desc: str, enabled: bool):
    """A tqdm bar over tensors (a no-op when disabled); use as a context manager."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tensor", disable=not enabled)


def map_name(name: str, top_names: dict, layer_re, layer_names: dict):
    """(our leaf name, layer index or None) of a source tensor name, or (None, None) if it is not ours.

    top_names: source name -> leaf for whole-model tensors; layer_re: a regex whose groups are (layer index,
    per-layer suffix); layer_names: per-layer suffix -> leaf."""
    if name in top_names:
        return top_names[name], None
    m = layer_re.match(name)
    if m and m.group(2) in layer_names:
        return layer_names[m.group(2)], int(m.group(1))
    return None, None
