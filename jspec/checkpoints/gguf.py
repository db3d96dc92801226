"""Read a GGUF file (llama.cpp's format) into our layout, dequantizing with the `gguf` package.

Two llama.cpp conventions are undone here:
  * For general.architecture "llama", llama.cpp's converter permutes the rows of attn_q / attn_k so that
    each head's rotary pairs are interleaved (GPT-J style RoPE). Our RoPE rotates halves (the Hugging Face
    convention), so we apply the inverse permutation, exactly as transformers' own GGUF loader does
    (`LlamaTensorProcessor._reverse_permute_weights`). qwen2 / qwen3 use NeoX RoPE and are not permuted.
  * Llama 3.x "llama3" RoPE scaling is not stored as metadata but as a `rope_freqs` tensor of per-frequency
    divisors; we recover the RopeScaling that reproduces it.
"""
from __future__ import annotations

import itertools
import math
import os
import re
from typing import Optional

import numpy as np

from jspec.config import ModelConfig, RopeScaling

from .layout import CheckpointError, Collector, map_name, numpy_dtype, progress_bar, short_float

ARCHS = ("llama", "qwen2", "qwen3")

# Tensor types we read. Every one is exercised by tests/test_checkpoints_gguf.py.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")

_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm", "ffn_norm.weight": "mlp_norm",
    "attn_q.weight": "wq", "attn_k.weight": "wk", "attn_v.weight": "wv", "attn_output.weight": "wo",
    "attn_q.bias": "bq", "attn_k.bias": "bk", "attn_v.bias": "bv",
    "attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm",
    "ffn_gate.weight": "w_gate", "ffn_up.weight": "w_up", "ffn_down.weight": "w_down",
}
_TOP_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "final_norm", "output.weight": "lm_head"}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def read_gguf(path: str, *, dtype: Optional[str] = None,
              progress: bool = False) -> tuple[dict, ModelConfig, Optional[dict]]:
    """Read a llama / qwen2 / qwen3 GGUF file.

    Args:
      path: the .gguf file.
      dtype: cast each dequantized tensor to this dtype while reading; None keeps float32.
      progress: show a tqdm bar over tensors.
    Returns:
      (params, cfg, tokenizer_info): params in our layout (numpy, layers stacked on a leading L axis);
      cfg from the file's metadata; tokenizer_info = {"architecture": str, "fields": {"tokenizer.*": value}}
      (the file's tokenizer metadata, which `checkpoints.tokenizer.write_gguf_tokenizer` turns into
      Hugging Face tokenizer files), or None if the file has no tokenizer.
    Raises:
      CheckpointError: not a GGUF file, unsupported architecture or tensor type, missing/extra tensors.
    """
    import gguf

    reader = _open(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHS)}")
    tensors = {t.name: t for t in reader.tensors}
    bad = sorted({t.tensor_type.name for t in reader.tensors} - set(SUPPORTED_TYPES))
    if bad:
        raise CheckpointError(f"{path}: tensor type(s) {', '.join(bad)} are not supported; supported: "
                              f"{', '.join(SUPPORTED_TYPES)}. Re-quantize the model to one of these.")
    fields = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    cfg = _config(path, arch, meta, fields, tensors)

    # Every source tensor must land somewhere: classify all names before dequantizing anything.
    unused = [n for n in tensors if n != "rope_freqs.weight" and _our_name(n)[0] is None]
    if unused:
        raise CheckpointError(f"{path}: tensors with no place in our layout: {', '.join(unused[:6])}; this "
                              f"variant of {arch} is not supported")
    collector = Collector(cfg, path, numpy_dtype(dtype) if dtype else None)
    with progress_bar(len(tensors), f"reading {os.path.basename(path)}", progress) as bar:
        for name, t in tensors.items():
            bar.update(1)
            if name == "rope_freqs.weight":
                continue  # already folded into cfg.rope_scaling
            leaf, layer = _our_name(name)
            x = gguf.quants.dequantize(t.data, t.tensor_type)
            # ggml lists dimensions fastest-first; numpy wants them slowest-first ([out, in] for a matrix).
            x = x.reshape(tuple(int(d) for d in reversed(t.shape)))
            if arch == "llama" and leaf in ("wq", "wk"):
                x = unpermute_rows(x, cfg.n_heads if leaf == "wq" else cfg.n_kv_heads)
            collector.put(leaf, layer, x, name)
    tokenizer_info = {"architecture": arch, "fields": fields} if "tokenizer.ggml.model" in fields else None
    return collector.finish(), cfg, tokenizer_info


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's `permute` of Q/K rows: per head, interleaved pairs -> rotate-half order.

    llama.cpp: w.reshape(n_head, 2, H // 2, in).swapaxes(1, 2).reshape(w.shape); this is its inverse.
    """
    h = w.shape[0] // n_head
    return w.reshape(n_head, h // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's own permutation (convert_hf_to_gguf.py LlamaModel.permute); used to write test files."""
    h = w.shape[0] // n_head
    return w.reshape(n_head, 2, h // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(theta: float, head_dim: int, s: RopeScaling) -> np.ndarray:
    """The per-frequency divisors llama.cpp stores as `rope_freqs` (convert_hf_to_gguf.py, LlamaModel)."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen = s.original_max_position / s.low_freq_factor
    high_wavelen = s.original_max_position / s.high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(s.factor)
        else:
            smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
            out.append(1 / ((1 - smooth) / s.factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _fit_rope_scaling(factors: np.ndarray, theta: float, head_dim: int, path: str) -> Optional[RopeScaling]:
    """The RopeScaling whose llama3 divisors equal `factors`, searching the values Llama 3.x uses."""
    factors = np.asarray(factors, dtype=np.float32).reshape(-1)
    if np.all(factors == 1.0):
        return None
    factor = short_float(float(factors.max()))
    # Llama 3.1 / 3.2 / 3.3 all use (1, 4, 8192); the rest of the grid is a safety margin.
    for orig, low, high in itertools.product((8192, 4096, 16384, 32768, 2048), (1.0, 2.0), (4.0, 8.0, 2.0)):
        cand = RopeScaling(factor=factor, low_freq_factor=low, high_freq_factor=high, original_max_position=orig)
        if factors.shape == (head_dim // 2,) and np.allclose(
                llama3_rope_factors(theta, head_dim, cand), factors, rtol=1e-4, atol=0):
            return cand
    raise CheckpointError(f"{path}: the rope_freqs tensor matches no llama3 RoPE scaling jspec knows; "
                          f"this rope scaling is not supported")


def _config(path: str, arch: str, meta: dict, tok: dict, tensors: dict) -> ModelConfig:
    def get(key, default=None, required=False):
        full = f"{arch}.{key}"
        if full not in meta:
            if required:
                raise CheckpointError(f"{path}: GGUF metadata lacks {full!r}")
            return default
        return meta[full]

    scaling_type = get("rope.scaling.type")
    if scaling_type not in (None, "none"):
        raise CheckpointError(f"{path}: rope scaling type {scaling_type!r} is not supported")
    d, n = int(get("embedding_length", required=True)), int(get("attention.head_count", required=True))
    head_dim = int(get("attention.key_length", d // n))
    theta = short_float(get("rope.freq_base", 10000.0))
    scaling = None
    if "rope_freqs.weight" in tensors:
        if arch != "llama":
            raise CheckpointError(f"{path}: a rope_freqs tensor in a {arch} model is not supported")
        import gguf

        t = tensors["rope_freqs.weight"]
        scaling = _fit_rope_scaling(gguf.quants.dequantize(t.data, t.tensor_type), theta, head_dim, path)
    if "token_embd.weight" not in tensors:
        raise CheckpointError(f"{path}: the file has no token_embd.weight tensor")
    vocab = int(get("vocab_size", int(tensors["token_embd.weight"].shape[-1])))
    eos = [tok.get(f"tokenizer.ggml.{k}") for k in ("eos_token_id", "eot_token_id", "eom_token_id")]
    return ModelConfig(
        arch=arch, vocab_size=vocab, d_model=d,
        n_layers=int(get("block_count", required=True)),
        n_heads=n, n_kv_heads=int(get("attention.head_count_kv", n)), head_dim=head_dim,
        ffn_dim=int(get("feed_forward_length", required=True)),
        rope_theta=theta, rope_scaling=scaling,
        norm_eps=short_float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        # llama.cpp writes output.weight only when the LM head is not the embedding.
        tie_embeddings="output.weight" not in tensors,
        max_position=int(get("context_length", 8192)),
        bos_token_id=None if tok.get("tokenizer.ggml.bos_token_id") is None else int(tok["tokenizer.ggml.bos_token_id"]),
        eos_token_ids=tuple(dict.fromkeys(int(i) for i in eos if i is not None)),
    )


def _our_name(name: str) -> tuple[Optional[str], Optional[int]]:
    return map_name(name, _TOP_NAMES, _LAYER_RE, _LAYER_NAMES)


def _open(path: str):
    import gguf

    if not os.path.isfile(path):
        raise CheckpointError(f"{path} does not exist or is not a file; --from-gguf needs a .gguf file")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError/struct errors on foreign or truncated files
        raise CheckpointError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e}); "
                              f"check the download") from e
