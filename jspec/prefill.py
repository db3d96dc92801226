"""Prompts into the KV cache, the first step of every path. Two parts:

  pad_prompts  host side: token lists -> one right-padded [B, T] int32 array (T rounded up to a multiple, to
               limit recompiles) + their lengths; what `prefill` takes.
  prefill      jitted: the padded prompts written into an empty KV cache in one forward; the logits of each
               prompt's last token. Every path starts here (`speculative.engine.init` too).

Decoding itself, plain ("ar") and speculative, is the speculative engine's (`jspec.speculative`).
Request checks (prompt lengths, cache capacity, token ids) live in the API (`jspec.api.check_request`).
"""
from __future__ import annotations

import functools

import jax
import numpy as np

from jspec import kv_cache, model
from jspec.attention import AttnImpl
from jspec.config import ModelConfig


def pad_prompts(prompts: list[list[int]], multiple: int = 64):
    """Right-pad token lists to one [B, T] int32 array (T rounded up to limit recompiles) + lengths."""
    lengths = np.array([len(p) for p in prompts], np.int32)
    T = max(1, int(-(-lengths.max() // multiple) * multiple)) if len(prompts) else 1
    tokens = np.zeros((len(prompts), T), np.int32)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = p
    return tokens, lengths


@functools.partial(jax.jit, static_argnames=("cfg", "impl"), donate_argnames=("cache",))
def prefill(params, cfg: ModelConfig, tokens, lengths, cache: kv_cache.KVCache, impl: AttnImpl = AttnImpl()):
    """Write right-padded prompts [B, T] (real lengths `lengths`) into an empty cache.

    Returns the logits of each prompt's last token f32[B, V] and the cache."""
    logits, cache, _ = model.forward(params, cfg, tokens, cache, n_new=lengths,
                                     logits_at=(lengths - 1)[:, None], impl=impl)
    return logits[:, 0], cache
