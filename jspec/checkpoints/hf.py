"""Read a Hugging Face model directory (config.json + safetensors, single-file or sharded) into our layout."""
from __future__ import annotations

import json
import os
import re
from typing import Optional

import numpy as np

from jspec.config import ModelConfig, RopeScaling

from .layout import CheckpointError, Collector, map_name, numpy_dtype, progress_bar

# model_type -> the one `architectures` entry we accept for it.
SUPPORTED = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# Hugging Face per-layer names (after "model.layers.{i}.") -> our leaf names.
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "post_attention_layernorm.weight": "mlp_norm",
    "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv", "self_attn.o_proj.weight": "wo",
    "self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk", "self_attn.v_proj.bias": "bv",
    "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    "mlp.gate_proj.weight": "w_gate", "mlp.up_proj.weight": "w_up", "mlp.down_proj.weight": "w_down",
}
_TOP_NAMES = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Buffers some exporters save that carry no information (RoPE frequencies are recomputed from the config).
_HARMLESS_RE = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


def read_hf(src_dir: str, *, dtype: Optional[str] = None, progress: bool = False) -> tuple[dict, ModelConfig]:
    """Read a Hugging Face Llama / Qwen2 / Qwen3 directory.

    Args:
      src_dir: directory with config.json and model.safetensors or model-*.safetensors (+ index json).
      dtype: cast each tensor to this dtype while reading ('bfloat16' | 'float16' | 'float32'); None keeps
        the stored dtype.
      progress: show a tqdm bar over tensors.
    Returns:
      (params, cfg): params in our layout (numpy arrays, layers stacked on a leading L axis), cfg built
      from config.json (and generation_config.json's eos ids).
    Raises:
      CheckpointError: unsupported model type, missing/extra/misshapen tensors, unreadable files.
    """
    cfg = hf_config(src_dir)
    files = _safetensors_files(src_dir)
    collector = Collector(cfg, src_dir, numpy_dtype(dtype) if dtype else None)
    from safetensors import safe_open

    names = []  # (file, tensor name), in file order
    for path in files:
        try:
            with safe_open(path, "np") as f:
                names += [(path, k) for k in f.keys()]
        except Exception as e:  # SafetensorError on a truncated or foreign file
            raise CheckpointError(f"{path} is not a readable safetensors file ({e}); re-download it") from e
    # Classify every name before reading any data, so an unsupported variant fails fast.
    seen, unused = set(), []
    for _, name in names:
        if name in seen:
            raise CheckpointError(f"{src_dir}: tensor {name!r} appears in more than one file")
        seen.add(name)
        if not _HARMLESS_RE.search(name) and _our_name(name)[0] is None:
            unused.append(name)
    if unused:
        shown = ", ".join(unused[:6]) + (f" (and {len(unused) - 6} more)" if len(unused) > 6 else "")
        raise CheckpointError(f"{src_dir}: tensors with no place in our layout: {shown}. This is a variant of "
                              f"{cfg.arch} that jspec does not support.")
    embed = lm_head = None
    with progress_bar(len(names), f"reading {os.path.basename(os.path.normpath(src_dir))}", progress) as bar:
        for path in files:
            with safe_open(path, "np") as f:
                for name in f.keys():
                    bar.update(1)
                    leaf, layer = _our_name(name)
                    if leaf is None:  # a harmless buffer
                        continue
                    x = f.get_tensor(name)
                    if leaf == "lm_head" and cfg.tie_embeddings:
                        lm_head = x  # checked against the embedding below: tied means it must be a copy
                        continue
                    if leaf == "embed" and cfg.tie_embeddings:
                        embed = x
                    collector.put(leaf, layer, x, name)
    if lm_head is not None and (embed is None or lm_head.shape != embed.shape or not np.array_equal(lm_head, embed)):
        raise CheckpointError(f"{src_dir}: config.json says tie_word_embeddings=true, but lm_head.weight differs "
                              f"from model.embed_tokens.weight; fix tie_word_embeddings in config.json")
    return collector.finish(), cfg


def hf_config(src_dir: str) -> ModelConfig:
    """ModelConfig from `src_dir`/config.json (and generation_config.json, for the full set of eos ids)."""
    path = os.path.join(src_dir, "config.json")
    if not os.path.isdir(src_dir):
        raise CheckpointError(f"{src_dir} is not a directory; --from-hf needs a Hugging Face model directory")
    hf = _read_json(path, required=True)
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED:
        raise CheckpointError(f"{path}: model_type {model_type!r} is not supported; supported: "
                              f"{', '.join(SUPPORTED)}")
    archs = hf.get("architectures") or [SUPPORTED[model_type]]
    if archs != [SUPPORTED[model_type]]:
        raise CheckpointError(f"{path}: architectures {archs} is not supported for model_type {model_type!r}; "
                              f"expected [{SUPPORTED[model_type]!r}]")
    for flag in ("attention_bias", "mlp_bias", "use_sliding_window"):
        # qwen2 always has q/k/v bias (and may say attention_bias: true); everything else must be bias-free.
        if hf.get(flag) and not (flag == "attention_bias" and model_type == "qwen2"):
            raise CheckpointError(f"{path}: {flag}=true is not supported by jspec's {model_type} model")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{path}: hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")

    d, n = _req(hf, path, "hidden_size"), _req(hf, path, "num_attention_heads")
    # transformers >= 5 nests rope_theta/rope_scaling under rope_parameters; older configs keep them flat.
    rope = hf.get("rope_parameters") or {}
    theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    gen = _read_json(os.path.join(src_dir, "generation_config.json"), required=False) or {}
    return ModelConfig(
        arch=model_type,
        vocab_size=_req(hf, path, "vocab_size"),
        d_model=d,
        n_layers=_req(hf, path, "num_hidden_layers"),
        n_heads=n,
        n_kv_heads=hf.get("num_key_value_heads") or n,
        head_dim=hf.get("head_dim") or d // n,
        ffn_dim=_req(hf, path, "intermediate_size"),
        rope_theta=float(theta),
        rope_scaling=_rope_scaling(scaling, path),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position=int(hf.get("max_position_embeddings", 8192)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=_ids(hf.get("eos_token_id"), gen.get("eos_token_id")),
    )


def _rope_scaling(s: Optional[dict], path: str) -> Optional[RopeScaling]:
    if not s:
        return None
    kind = s.get("rope_type", s.get("type"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise CheckpointError(f"{path}: rope scaling type {kind!r} is not supported (only 'llama3')")
    return RopeScaling(factor=float(s["factor"]), low_freq_factor=float(s["low_freq_factor"]),
                       high_freq_factor=float(s["high_freq_factor"]),
                       original_max_position=int(s["original_max_position_embeddings"]))


def _ids(*values) -> tuple[int, ...]:
    """Union of eos ids, in order of first appearance; each value may be None, an int or a list."""
    out: list[int] = []
    for v in values:
        for i in ([] if v is None else [v] if isinstance(v, int) else v):
            if int(i) not in out:
                out.append(int(i))
    return tuple(out)


def _our_name(name: str) -> tuple[Optional[str], Optional[int]]:
    return map_name(name, _TOP_NAMES, _LAYER_RE, _LAYER_NAMES)


def _safetensors_files(src_dir: str) -> list[str]:
    index = os.path.join(src_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        weight_map = _read_json(index, required=True).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no 'weight_map'; the download is incomplete or corrupt")
        files = [os.path.join(src_dir, f) for f in dict.fromkeys(weight_map.values())]
        absent = [f for f in files if not os.path.exists(f)]
        if absent:
            raise CheckpointError(f"{index} lists shards that are not there: {', '.join(absent)}; "
                                  f"download the missing files")
        return files
    files = sorted(os.path.join(src_dir, f) for f in os.listdir(src_dir) if f.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"{src_dir} has no .safetensors files (pickled pytorch_model.bin is not supported; "
                              f"save the model with safe_serialization=True)")
    return files


def _read_json(path: str, required: bool) -> Optional[dict]:
    if not os.path.exists(path):
        if required:
            raise CheckpointError(f"{path} does not exist; a Hugging Face model directory needs it")
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); the download is corrupt") from e


def _req(hf: dict, path: str, key: str) -> int:
    if key not in hf:
        raise CheckpointError(f"{path} lacks {key!r}")
    return int(hf[key])
