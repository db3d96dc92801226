"""`SpecConfig`: the speculative method and its knobs (frozen, hashable: a static jit argument)."""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax.numpy as jnp

from jspec.decoding import InputError

METHODS = ("streaming", "quest", "vegas")
SCORE_MODES = ("weights", "logits")
COLLECT = ("c2q", "all")


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """Self-speculative decoding with a sparse-attention draft (the target drafts for itself).

    method:     "streaming" (sink + recent window), "quest" (query-aware page selection) or "vegas"
                (top-k of the previous verification's attention scores). DESIGN.md section 4.
    gamma:      draft tokens per round (one full-attention verification each).
    budget:     KV slots each draft step's selection holds (the same number across methods in comparisons);
                the static width of the index arrays. Tokens after the selection point (see `with_tail` in
                jspec/selection.py) come on top: at most 2*gamma for vegas, gamma-1 for streaming,
                page_size+gamma-2 for quest.
    sink:       streaming: the first `sink` positions are always kept (attention sinks).
    page_size:  quest: tokens per page (min/max summaries per page; budget // page_size pages are kept).
    ratio:      optional dynamic budget: k = clamp(ceil(ratio * context), min_tokens, max_tokens or budget)
                (Vegas' knob; applies to every method so budgets stay comparable). None: k = budget.
    min_tokens, max_tokens: the clamp of the ratio rule; max_tokens (default budget) is then the static width.
    score_mode: vegas ranking: "weights" (softmax weights exp(s - lse), default) or "logits" (raw scale*q.k).
    collect:    vegas rows whose scores are collected: "c2q" (Collect-2-Query: rows 0 and gamma of the
                verified block, see jspec/speculative/vegas.py) or "all" (all gamma + 1 rows; ablation).
    """

    method: str = "vegas"
    gamma: int = 4
    budget: int = 512
    sink: int = 4
    page_size: int = 16
    ratio: Optional[float] = None
    min_tokens: int = 256
    max_tokens: Optional[int] = None
    score_mode: str = "weights"
    collect: str = "c2q"

    def __post_init__(self):
        if self.method not in METHODS:
            raise InputError(f"unknown speculative method {self.method!r}; available: {', '.join(METHODS)} "
                             f"(and 'ar' for plain decoding)")
        if self.gamma < 1:
            raise InputError(f"gamma={self.gamma} must be >= 1 (draft tokens per round)")
        if self.budget < 1:
            raise InputError(f"budget={self.budget} must be >= 1 KV slot")
        if self.sink < 0:
            raise InputError(f"sink={self.sink} must be >= 0")
        if self.method == "streaming" and self.budget < self.sink:
            raise InputError(f"budget={self.budget} must be >= sink={self.sink} (the window is budget - sink)")
        if self.page_size < 1:
            raise InputError(f"page_size={self.page_size} must be >= 1")
        if self.method == "quest" and self.slots < self.page_size:
            raise InputError(f"budget={self.slots} must hold at least one page of page_size={self.page_size}")
        if self.score_mode not in SCORE_MODES:
            raise InputError(f"score_mode={self.score_mode!r} must be one of {SCORE_MODES}")
        if self.collect not in COLLECT:
            raise InputError(f"collect={self.collect!r} must be one of {COLLECT}")
        if self.ratio is not None:
            if not 0.0 < self.ratio <= 1.0:
                raise InputError(f"ratio={self.ratio} must be in (0, 1]")
            if self.max_tokens is not None and self.max_tokens < 1:
                raise InputError(f"max_tokens={self.max_tokens} must be >= 1")
            if not 1 <= self.min_tokens <= self.slots:
                raise InputError(f"min_tokens={self.min_tokens} must be in [1, max_tokens={self.slots}]")
            if self.method == "streaming" and self.min_tokens < self.sink:
                raise InputError(f"min_tokens={self.min_tokens} must be >= sink={self.sink}")

    @property
    def slots(self) -> int:
        """Static width M of the selection (the largest k the budget rule can produce)."""
        if self.ratio is not None and self.max_tokens is not None:
            return self.max_tokens
        return self.budget

    def k(self, context):
        """Selection size per sequence for a context of `context` tokens (int32[B] -> int32[B])."""
        context = jnp.asarray(context, jnp.int32)
        if self.ratio is None:
            return jnp.full(context.shape, self.budget, jnp.int32)
        k = jnp.ceil(self.ratio * context.astype(jnp.float32)).astype(jnp.int32)
        return jnp.clip(k, self.min_tokens, self.slots)

    def capacity_margin(self) -> int:
        """Cache slots needed beyond prompt + max_new_tokens: a round writes up to gamma + 1 slots ahead."""
        return self.gamma + 1

    def describe(self) -> dict:
        return dataclasses.asdict(self)

