"""Static configuration: frozen, hashable dataclasses usable as `jax.jit` static arguments.

`ModelConfig` describes one decoder-only transformer of the Llama family (Llama 3.x, SmolLM2), Qwen2/2.5
(q/k/v bias) or Qwen3 (q/k RMSNorm). `SamplingConfig` describes how logits become tokens.

The parameter layout (every format translation lives in `jspec/checkpoints/`) is a plain nested dict, layers
stacked on a leading L axis (the forward unrolls the layer loop, model.py):

    embed        [V, D]
    final_norm   [D]
    lm_head      [D, V]            (absent when cfg.tie_embeddings)
    layers:
      attn_norm  [L, D]            mlp_norm [L, D]
      wq [L, D, N, H]   wk [L, D, K, H]   wv [L, D, K, H]   wo [L, N, H, D]
      bq [L, N, H]      bk [L, K, H]      bv [L, K, H]      (only when cfg.qkv_bias)
      q_norm [L, H]     k_norm [L, H]                       (only when cfg.qk_norm)
      w_gate [L, D, F]  w_up [L, D, F]    w_down [L, F, D]

That is the stored layout (checkpoints). The runtime layout, the only one `model.forward` runs (what `jspec.load`
and `model.init_params` hand out; `model.fuse_projections` converts): wq/wk/wv become wqkv [L, D, K, G+2, H]
(per KV head: its G = N/K query heads, then k, then v) and w_gate/w_up become w_gu [L, D, 2, F].

RoPE uses the Hugging Face "rotate half" convention (the first and second halves of H form the pairs).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

ARCHS = ("llama", "qwen2", "qwen3")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3.x "llama3" frequency scaling (Hugging Face `rope_scaling` with rope_type="llama3")."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    arch: str                   # "llama" | "qwen2" | "qwen3"
    vocab_size: int             # V
    d_model: int                # D
    n_layers: int               # L
    n_heads: int                # N
    n_kv_heads: int             # K
    head_dim: int               # H
    ffn_dim: int                # F
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_position: int = 8192
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "bfloat16"     # weights and KV cache; softmax and norms always run in float32

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"unsupported architecture {self.arch!r}; supported: {', '.join(ARCHS)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.n_heads=} must be a multiple of {self.n_kv_heads=}")

    @property
    def qkv_bias(self) -> bool:
        return self.arch == "qwen2"

    @property
    def qk_norm(self) -> bool:
        return self.arch == "qwen3"

    @property
    def group(self) -> int:
        """G = N / K query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies over all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * _itemsize(self.dtype)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        if d.get("rope_scaling") is not None:
            d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        return cls(**d)


def _itemsize(dtype: str) -> int:
    return {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """temperature == 0 means greedy (argmax, its own branch). top_k == 0 and top_p == 1 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0:   # (NaN too)
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0: greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0: no top-k filter)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1: no top-p filter)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# Exact-match presets. The real default model's config is also read from its checkpoint; these shapes exist
# so speed work can run on random weights of the sizes that matter.
PRESETS: dict[str, ModelConfig] = {
    "smollm2-135m": ModelConfig(
        arch="llama", vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
        ffn_dim=1536, rope_theta=100000.0, norm_eps=1e-5, tie_embeddings=True, max_position=8192,
        bos_token_id=1, eos_token_ids=(2,)),
    "llama-3.1-8b": ModelConfig(
        arch="llama", vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
        ffn_dim=14336, rope_theta=500000.0, rope_scaling=RopeScaling(), norm_eps=1e-5,
        tie_embeddings=False, max_position=131072, bos_token_id=128000, eos_token_ids=(128001, 128009)),
    "qwen2.5-7b": ModelConfig(
        arch="qwen2", vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4, head_dim=128,
        ffn_dim=18944, rope_theta=1000000.0, norm_eps=1e-6, tie_embeddings=False, max_position=131072,
        eos_token_ids=(151643, 151645)),
    "qwen3-8b": ModelConfig(
        arch="qwen3", vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128,
        ffn_dim=12288, rope_theta=1000000.0, norm_eps=1e-6, tie_embeddings=False, max_position=131072,
        eos_token_ids=(151645,)),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
