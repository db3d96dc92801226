"""Prompt input to the cache, and the old plain-decoding loop. Three parts:

  pad_prompts  host side: token lists -> one right-padded [B, T] int32 array (T rounded up to a multiple, to
               limit recompiles) + their lengths; what `prefill` takes.
  prefill      jitted: the padded prompts written into an empty KV cache in one forward; the logits of each
               prompt's last token. Every path starts here (`speculative.engine.init` too).
  decode       jitted: the old "ar" loop, one `lax.while_loop` that decodes every sequence of the batch until it
               emits a stop token or reaches `max_new_tokens`, with no host sync per step. `jspec.generate` runs
               "ar" through the speculative engine (`speculative/ar.py`); this loop stays only for the pending
               GPU A/B of the two (`generate(_ar_loop="decode")`, `jspec bench` method `ar:loop=decode`).

Request checks (prompt lengths, cache capacity, token ids) live in the API (`jspec.api.check_request`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jspec import kv_cache, model, sampling
from jspec.attention import AttnImpl
from jspec.config import ModelConfig, SamplingConfig
from jspec.errors import InputError  # noqa: F401  (re-exported: jspec.decoding.InputError)


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


@struct.dataclass
class _State:
    step: jax.Array      # scalar int32: tokens emitted so far (per row, at most)
    cache: kv_cache.KVCache
    cur: jax.Array       # int32[B] last emitted token
    out: jax.Array       # int32[B, max_new]
    n_out: jax.Array     # int32[B]
    done: jax.Array      # bool[B]
    key: jax.Array


@functools.partial(jax.jit, static_argnames=("cfg", "samp", "max_new_tokens", "stop_tokens", "impl"),
                   donate_argnames=("cache",))
def decode(params, cfg: ModelConfig, samp: SamplingConfig, cache: kv_cache.KVCache, first_logits, key, *,
           max_new_tokens: int, stop_tokens: tuple = (), impl: AttnImpl = AttnImpl()):
    """Decode after `prefill`. Returns (tokens int32[B, max_new_tokens] padded with -1, n_out int32[B], cache).

    `jspec.generate` runs "ar" through the speculative engine instead (no drafts, the same tokens); this loop
    stays, reachable there as `_ar_loop="decode"`, until a GPU shows the engine at least as fast (issue 28).

    A row stops after emitting a stop token (which is kept) or `max_new_tokens`; finished rows still ride
    along in the batch (static shapes) but their cache lengths no longer move and their attention no longer
    reads their cache (`model.forward(live=)`)."""
    B = first_logits.shape[0]
    key, sub = jax.random.split(key)
    first = sampling.next_token(first_logits, samp, sub)
    stops = jnp.asarray(stop_tokens if stop_tokens else (-1,), jnp.int32)
    is_stop = lambda t: jnp.any(t[:, None] == stops[None], axis=1)
    out = jnp.full((B, max_new_tokens), -1, jnp.int32).at[:, 0].set(first)
    st = _State(step=jnp.int32(1), cache=cache, cur=first, out=out, n_out=jnp.ones((B,), jnp.int32),
                done=is_stop(first) | (max_new_tokens <= 1), key=key)

    def cond(st):
        return (st.step < max_new_tokens) & ~jnp.all(st.done)

    def body(st):
        key, sub = jax.random.split(st.key)
        old = st.cache.lengths
        logits, cache, _ = model.forward(params, cfg, st.cur[:, None], st.cache, impl=impl, live=~st.done)
        cache = cache.replace(lengths=jnp.where(st.done, old, cache.lengths))
        tok = sampling.next_token(logits[:, 0], samp, sub)
        tok = jnp.where(st.done, -1, tok)
        out = st.out.at[:, st.step].set(tok)
        n_out = st.n_out + (~st.done).astype(jnp.int32)
        done = st.done | is_stop(tok) | (n_out >= max_new_tokens)
        return _State(step=st.step + 1, cache=cache, cur=jnp.maximum(tok, 0), out=out, n_out=n_out, done=done,
                      key=key)

    st = jax.lax.while_loop(cond, body, st)
    return st.out, st.n_out, st.cache
