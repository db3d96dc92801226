"""Plain decoding as the engine's degenerate method ("ar" with gamma = 0): no drafts, each round is one
full-attention target step over `last` (the verification of an empty chain), so a round emits exactly the
token plain decoding emits: the same greedy tokens, and for sampling the same tokens for the same seed (one
key split per round, as a plain decoding loop splits one per step; tests/reference_decode.py is such a loop).
`jspec.generate` runs "ar" through the engine like every other method, static batches and `serve`'s slots
alike: there is no other decoding loop.

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
