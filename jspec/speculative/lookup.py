"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of a row's newest n-gram.

An optional extra draft for every speculative method (`SpecConfig(lookup=G)`): G tokens proposed without any model
from the row's own text (prompt + output), verified in the same target forward. LongSpec hangs them off its
draft tree's root as a chain of their own; the self-speculative methods (streaming, quest, vegas) append them
to their gamma-token draft chain, proposed from the text *and* the drafts, so a round that accepts every draft
can go on accepting up to G more tokens without another draft step.
Long-context generation copies a lot (identifiers in code, names and phrases in prose, and a small greedy
model's own loops), which a one-block drafter predicts less well than a string match does.

Rule, per row, for a sequence seq[0 .. n-1] (the accepted text and the round's root token, n >= 1):
  for m = max_n .. 1: the latest start t <= n - m - 1 with seq[t : t+m] == seq[n-m : n] (an earlier occurrence
  of the newest m tokens); the first m that has one wins, and the proposal is seq[t+m], seq[t+m+1], ...
  Positions past the end (t+m+k >= n) continue the proposal itself (proposal[t+m+k-n]): a repeat of period
  n-t-m keeps repeating. With no earlier occurrence of even the newest token the proposal repeats it.
Drafts only affect speed: verification keeps the output plain decoding's whatever they are (greedy: equal in
exact arithmetic, in bf16 up to near-tie rounding; sampled: the same distribution; docs/methods.md).
"""
from __future__ import annotations

import jax.numpy as jnp

MAX_NGRAM = 3


def record(prompt_tokens, capacity: int):
    """The token record: int32[B, capacity], each row's prompt (right-padded int32[B, P]) at its cache slots.
    The rounds write their accepted text into it (`commit`); slots at and past a row's length are junk."""
    B, P = prompt_tokens.shape
    rec = jnp.zeros((B, capacity), jnp.int32)
    return rec.at[:, :min(P, capacity)].set(prompt_tokens[:, :capacity].astype(jnp.int32))


def commit(rec, base, tokens, n_new):
    """The record with tokens[b, :n_new[b]] (int32[B, N]) written at slots base[b] .. base[b] + n_new[b] - 1."""
    B, N = tokens.shape
    j = jnp.arange(N, dtype=jnp.int32)[None]
    slot = jnp.where(j < n_new[:, None], base[:, None] + j, rec.shape[1])      # the rest: dropped
    return rec.at[jnp.arange(B)[:, None], slot].set(tokens.astype(jnp.int32), mode="drop")


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
