"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of a row's newest n-gram.

LongSpec's optional extra branch (`SpecConfig(lookup=G)`): a chain of G tokens, hung off the draft tree's root and
verified in the same target forward, proposed without any model from the row's own text (prompt + output).
Long-context generation copies a lot (identifiers in code, names and phrases in prose, and a small greedy
model's own loops), which a one-block drafter predicts less well than a string match does.

Rule, per row, for a sequence seq[0 .. n-1] (the accepted text and the round's root token, n >= 1):
  for m = max_n .. 1: the latest start t <= n - m - 1 with seq[t : t+m] == seq[n-m : n] (an earlier occurrence
  of the newest m tokens); the first m that has one wins, and the proposal is seq[t+m], seq[t+m+1], ...
  Positions past the end (t+m+k >= n) continue the proposal itself (proposal[t+m+k-n]): a repeat of period
  n-t-m keeps repeating. With no earlier occurrence of even the newest token the proposal repeats it.
Drafts only affect speed: verification keeps the output identical to plain decoding whatever they are.
"""
from __future__ import annotations

import jax.numpy as jnp

MAX_NGRAM = 3


def propose(seq, n, count: int, max_n: int = MAX_NGRAM):
    """seq int32[B, C] (entries >= n[b] are ignored), n int32[B] >= 1 -> int32[B, count] proposed tokens."""
    B, C = seq.shape
    n = jnp.asarray(n, jnp.int32)
    t = jnp.arange(C, dtype=jnp.int32)[None]
    start = jnp.full((B,), -1, jnp.int32)            # t + m of the winning match (first token to propose)
    for m in range(max_n, 0, -1):
        padded = jnp.pad(seq, ((0, 0), (0, m)))
        hit = t <= (n - m - 1)[:, None]               # an earlier window, the newest token not inside it
        for j in range(m):
            newest = jnp.take_along_axis(seq, jnp.clip(n - m + j, 0, C - 1)[:, None], axis=1)
            hit &= padded[:, j:j + C] == newest
        last = jnp.max(jnp.where(hit, t, -1), axis=1)
        start = jnp.where((start < 0) & (last >= 0), last + m, start)
    start = jnp.where(start < 0, n - 1, start)        # nothing matched: repeat the newest token
    out = []
    for k in range(count):
        i = start + k
        own = jnp.take_along_axis(seq, jnp.clip(i, 0, C - 1)[:, None], axis=1)[:, 0]
        if out:   # past the end: continue the proposal (index i - n < k)
            prev = jnp.stack(out, axis=1)
            rep = jnp.take_along_axis(prev, jnp.clip(i - n, 0, k - 1)[:, None], axis=1)[:, 0]
            own = jnp.where(i < n, own, rep)
        out.append(own)
    return jnp.stack(out, axis=1).astype(jnp.int32)
