"""MagicDec-style streaming draft: the target drafts with attention over the `sink` first tokens and the most
recent ones (query-independent, no selection state). docs/methods.md.

Method interface (every method module, driven by jspec/speculative/engine.py; LongSpec adds the two optional
hooks `prepare` and `tree_round`, which replace `init` and the chain round, so it needs only `score_rows` and
`update` of the list below):
    score_rows(spec) -> tuple        verification query rows whose scores the method needs (static)
    tail_slots(spec) -> int          static bound on positions after the selection point (selection.with_tail)
    init(spec, cfg, cache, scores, point) -> state          after prefill (scores f32[L, B, S] or None)
    begin_round(spec, cfg, state, lengths) -> sel           once per round, before drafting
    draft_kwargs(spec, sel, j) -> dict                      model.forward keywords for draft step j
    update(spec, state, cache, scores, point) -> state      after verification and rollback
"""
from __future__ import annotations

import jax.numpy as jnp

from jspec import selection
from jspec.model import Sparse


def score_rows(spec):
    return ()


def tail_slots(spec):
    # The window ends at the round's first draft slot; draft step j also needs the j slots drafted before it.
    return spec.gamma - 1


def init(spec, cfg, cache, scores, point):
    return ()


def begin_round(spec, cfg, state, lengths):
    """Sink + window over the accepted prefix [0, lengths), the same set for every layer."""
    idx, n = selection.streaming(lengths, spec.k(lengths), sink=spec.options.sink, slots=spec.slots)
    # Fill the tail up to the last draft step's needs; step j counts only its first j entries (draft_kwargs).
    idx, n = selection.with_tail(idx, n, lengths, lengths + spec.gamma - 1, tail_slots=tail_slots(spec))
    n = n - (spec.gamma - 1)
    L = cfg.n_layers
    return Sparse(idx=jnp.broadcast_to(idx, (L,) + idx.shape), n_valid=jnp.broadcast_to(n, (L,) + n.shape))


def draft_kwargs(spec, sel, j):
    """Draft step j (slot lengths + j) also sees the j tokens drafted before it in this round."""
    return {"sparse": Sparse(idx=sel.idx, n_valid=sel.n_valid + j)}


def update(spec, state, cache, scores, point):
    return state
