"""MagicDec-style Quest draft: query-aware page selection (Tang et al. 2024, "Quest"; docs/methods.md).

Per page of `page_size` slots the cache keeps per-channel min and max keys per layer and KV head. Each draft
step, in each layer, scores the complete pages with that step's own queries,
`sum_heads sum_h max(q*min, q*max)` (an upper bound of the page's best logit), and attends over the
budget // page_size best pages (expanded to token positions: page size 1 in the kernel) plus every slot
after the last complete page (the partial page and this round's drafts: selection.with_tail).

The draft step's queries exist only inside the layer loop, so the selection runs there through
model.forward's `selector` hook: (layer, q) -> (idx, n_valid).

Summaries: computed from the whole cache once after prefill, then after every round only the pages the
newly accepted tokens can have completed are recomputed: ceil((depth + 1) / page_size) pages per sequence
from the one holding the round's first slot, depth = gamma + lookup (see `update`). A page counts once all
its slots are accepted (< lengths), so rolled-back junk is never summarised for good.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from jspec import selection


@struct.dataclass
class State:
    mins: jnp.ndarray  # [L, B, P, K, H] per-page min keys
    maxs: jnp.ndarray  # [L, B, P, K, H]


@struct.dataclass
class RoundSel:
    mins: jnp.ndarray
    maxs: jnp.ndarray
    n_complete: jnp.ndarray  # int32[B] pages fully accepted at the start of the round
    n_pages: jnp.ndarray     # int32[B] pages to keep
    lengths: jnp.ndarray     # int32[B] first draft slot of the round


def score_rows(spec):
    return ()


def tail_slots(spec):
    # Partial page (<= page_size - 1 slots) + the drafts before draft step j (<= gamma - 1).
    return spec.options.page_size + spec.gamma - 2


def init(spec, cfg, cache, scores, point):
    mins, maxs = selection.page_minmax(cache.k, spec.options.page_size)
    return State(mins=mins, maxs=maxs)


def begin_round(spec, cfg, state, lengths):
    return RoundSel(mins=state.mins, maxs=state.maxs, n_complete=lengths // spec.options.page_size,
                    n_pages=spec.k(lengths) // spec.options.page_size, lengths=lengths)


def draft_kwargs(spec, sel, j):
    page = spec.options.page_size
    start = sel.n_complete * page

    def selector(layer, q):
        idx, n = selection.quest_select(q[:, 0], sel.mins[layer], sel.maxs[layer], sel.n_complete, sel.n_pages,
                                        max_pages=spec.slots // page, page=page)
        return selection.with_tail(idx, n, start, sel.lengths + j, tail_slots=tail_slots(spec))

    return {"selector": selector}


def update(spec, state, cache, scores, point):
    """`point` is the first slot of the verified block: pages from the one holding it may have completed.

    A round writes `last` and the accepted drafts at slots point .. point + n (n <= depth = gamma + lookup:
    the lookup tokens can be accepted after the gamma drafts), so lengths go from point to point + n + 1.
    The pages it completes are point // P .. (point + n + 1) // P - 1, at most
    floor((point % P + depth + 1) / P) <= ceil((depth + 1) / P) of them (point % P <= P - 1): a block that
    straddles a page boundary is covered by the ceiling, no extra page needed."""
    count = -(-(spec.depth + 1) // spec.options.page_size)
    mins, maxs = selection.update_pages(state.mins, state.maxs, cache.k, point // spec.options.page_size, count=count,
                                        page=spec.options.page_size)
    return State(mins=mins, maxs=maxs)
