"""`jspec convert`: a Hugging Face directory or a GGUF file -> a jspec (Orbax) checkpoint."""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

from .layout import DTYPES, CheckpointError


def convert(*, out: str, from_hf: Optional[str] = None, from_gguf: Optional[str] = None, dtype: str = "bfloat16",
            overwrite: bool = False, progress: bool = True) -> str:
    """Convert one source model into a checkpoint directory at `out`.

    Args:
      out: the checkpoint directory to create (atomically; see checkpoints.store.save).
      from_hf: a Hugging Face model directory (config.json + safetensors). Exactly one of from_hf/from_gguf.
      from_gguf: a .gguf file; its tokenizer metadata becomes Hugging Face tokenizer files.
      dtype: storage dtype of the weights: 'bfloat16' (default), 'float16' or 'float32'.
      overwrite: replace an existing `out`.
      progress: show a tqdm bar over the source tensors.
    Returns:
      The absolute path of the checkpoint.
    """
    if (from_hf is None) == (from_gguf is None):
        raise CheckpointError("give exactly one source: from_hf=DIR (--from-hf) or from_gguf=FILE (--from-gguf)")
    if dtype not in DTYPES:
        raise CheckpointError(f"unsupported dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    # Check before the (slow) read, so a typo costs nothing; save() checks again.
    if os.path.lexists(out) and not overwrite:
        raise CheckpointError(f"{os.path.abspath(out)} already exists; pass overwrite=True (--overwrite) to replace it")
    from .store import save

    if from_hf is not None:
        from .hf import read_hf

        params, cfg = read_hf(from_hf, dtype=dtype, progress=progress)
        tokenizer_src, source = from_hf, f"hf:{os.path.abspath(from_hf)}"
    else:
        from .gguf import read_gguf

        params, cfg, tokenizer_src = read_gguf(from_gguf, dtype=dtype, progress=progress)
        source = f"gguf:{os.path.abspath(from_gguf)}"
    cfg = dataclasses.replace(cfg, dtype=dtype)
    return save(out, params, cfg, tokenizer_src, overwrite=overwrite, source=source)
