"""Plain decoding written out as the tests' reference, independent of the speculative engine: a host loop of
one jitted `model.forward` step per token.

`decode` continues after `prefill.prefill`: tokens int32[B, max_new_tokens] padded with -1, n_out int32[B]
and the cache. A row ends after emitting a stop token (kept) or max_new_tokens tokens; a finished row no
longer advances (its cache length stays put). Keys are split as the engine's "ar" splits them (one split
before the first token, one per step), so sampled runs are comparable token for token.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jspec import model, sampling
from jspec.attention import AttnImpl


@functools.partial(jax.jit, static_argnames=("cfg", "impl"), donate_argnames=("cache",))
def _step(params, cfg, cache, cur, done, impl):
    """Feed cur int32[B]; rows marked done keep their cache length. Returns (logits f32[B, V], cache)."""
    old = cache.lengths
    logits, cache, _ = model.forward(params, cfg, cur[:, None], cache, impl=impl)
    return logits[:, 0], cache.replace(lengths=jnp.where(done, old, cache.lengths))


def decode(params, cfg, samp, cache, first_logits, key, *, max_new_tokens, stop_tokens=(), impl=AttnImpl()):
    B = first_logits.shape[0]
    out = np.full((B, max_new_tokens), -1, np.int32)
    n_out = np.zeros(B, np.int32)
    done = np.zeros(B, bool)
    logits = first_logits
    for i in range(max_new_tokens):
        key, sub = jax.random.split(key)
        tok = np.asarray(sampling.next_token(logits, samp, sub))
        out[~done, i] = tok[~done]
        n_out += ~done
        done |= np.isin(tok, stop_tokens) | (i + 1 == max_new_tokens)
        if done.all():
            break
        logits, cache = _step(params, cfg, cache, jnp.asarray(np.where(done, 0, tok)), jnp.asarray(done), impl)
    return out, n_out, cache
