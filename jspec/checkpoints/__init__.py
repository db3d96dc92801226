"""Checkpoint conversion and storage: Hugging Face safetensors dirs and GGUF files -> Orbax checkpoints.

    params, cfg = read_hf("path/to/hf_dir")            # numpy, our layout (jspec/config.py)
    params, cfg, tok = read_gguf("model.gguf")
    convert(out="ckpt", from_gguf="model.gguf")         # atomic; weights in bfloat16
    params, cfg = load("ckpt")                          # jax arrays
    ckpt = resolve("smollm2-135m")                      # fetches + converts the default model once
"""
from .convert import convert
from .fetch import fetch_default, resolve
from .gguf import read_gguf
from .hf import read_hf
from .layout import CheckpointError
from .store import load, load_config, save

__all__ = ["CheckpointError", "convert", "fetch_default", "load", "load_config", "read_gguf", "read_hf", "resolve",
           "save"]
