"""Plain decoding as the engine's degenerate method ("ar" with gamma = 0): no drafts, each round is one
full-attention target step over `last` (the verification of an empty chain), so a round emits exactly the
token plain decoding emits: the same greedy tokens, and for sampling the same tokens for the same seed (the
engine splits an "ar" round's key as `decoding.decode` splits its step's). `jspec.generate` runs "ar" through
the engine like every other method, static batches and `serve`'s slots alike.

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
