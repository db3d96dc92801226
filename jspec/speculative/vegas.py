"""Vegas: verification-guided sparse self-speculation (docs/methods.md).

The full-attention verification already computes how much every cached position matters; Vegas keeps, per
layer, the top-k positions of those scores (summed over the layer's query heads and the collected rows,
accepted and rejected drafts alike) and drafts the next round with attention restricted to them.

Which rows Collect-2-Query collects. The verified block is [last, d1..dg] (rows 0..gamma): row 0 is the
previous round's bonus/corrected token, the first token of the chain and always part of the output; its
output verifies d1. Row gamma is the last draft, whose output is the bonus token. The paper collects "the
first draft token and the bonus token ... the two tokens at maximum positional distance in the draft chain";
read by the row whose *output* they are (the only reading under which both exist in the block: the bonus
token has no input row), that is rows (0, gamma) -- the two ends of the block, gamma apart, and two distinct
rows even at gamma = 1. The overlap of consecutive rows' selections is high (paper, section B), so the
alternative (1, gamma) differs little; collect="all" (rows 0..gamma) is the ablation.

The selection point is the first slot of the verified block: top-k competes among earlier positions only,
and every position from there on -- `last`, the accepted drafts of that block and this round's drafts -- is
always attended (selection.with_tail): at most (gamma + 1) + (gamma - 1) = 2*gamma extra slots (with a
lookup chain of G, accepted after the drafts: 2*gamma + G).

First round. There is no verification yet: after the ordinary prefill the engine re-runs each prompt's last
token as a one-token full-attention step with score_rows=(0,) (a ragged prefill has no static row index for
"each prompt's last token") and restores that slot's K/V, so the cache and the first token are exactly plain
decoding's. Its scores give the first selection, with the selection point at that token's slot.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from jspec import selection
from jspec.model import Sparse


@struct.dataclass
class State:
    idx: jnp.ndarray      # int32[L, B, M] top-k positions before `point`, per layer
    n_valid: jnp.ndarray  # int32[L, B]
    point: jnp.ndarray    # int32[B] selection point (first slot of the verified block)


def score_rows(spec):
    if spec.options.collect == "all":
        return tuple(range(spec.gamma + 1))
    return tuple(sorted({0, spec.gamma}))


def tail_slots(spec):
    # A round emits up to depth + 1 = gamma + lookup + 1 tokens after the point, then gamma - 1 drafts are
    # written; select_page > 1: the tail starts at the page-aligned start, up to select_page - 1 slots earlier
    return spec.depth + spec.gamma + spec.options.select_page - 1


def _select(spec, scores, point):
    if spec.options.select_page > 1:   # whole aligned pages (selection.topk_pages_before); the tail from the page start
        idx, n, start = selection.topk_pages_before(scores, point, spec.k(point), slots=spec.slots,
                                                    page=spec.options.select_page, method=spec.options.topk)
        return State(idx=idx, n_valid=n, point=start)
    idx, n = selection.topk_before(scores, point, spec.k(point), slots=spec.slots, method=spec.options.topk)
    return State(idx=idx, n_valid=n, point=point)


def init(spec, cfg, cache, scores, point):
    return _select(spec, scores, point)


def begin_round(spec, cfg, state, lengths):
    # Tail = [point, lengths + gamma - 1): filled for the last draft step; step j counts lengths + j - point.
    idx, n = selection.with_tail(state.idx, state.n_valid, state.point, lengths + spec.gamma - 1,
                                 tail_slots=tail_slots(spec))
    return Sparse(idx=idx, n_valid=n - (spec.gamma - 1))


def draft_kwargs(spec, sel, j):
    return {"sparse": Sparse(idx=sel.idx, n_valid=sel.n_valid + j)}


def update(spec, state, cache, scores, point):
    return _select(spec, scores, point)
