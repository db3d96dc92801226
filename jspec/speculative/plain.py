"""Plain decoding as the engine's degenerate method ("ar" with gamma = 0): no drafts, each round is one
full-attention target step over `last` (the verification of an empty chain), so a round emits exactly the
token plain decoding emits. It exists so that `serve` (continuous batching) can run plain decoding through
the same slots, refills and stats as the speculative methods; static batches keep `decoding.decode`.

Method interface: see streaming.py.
"""
from __future__ import annotations


def score_rows(spec):
    return ()


def tail_slots(spec):
    return 0


def init(spec, cfg, cache, scores, point):
    return ()


def begin_round(spec, cfg, state, lengths):
    return None


def draft_kwargs(spec, sel, j):
    return {}


def update(spec, state, cache, scores, point):
    return state
