"""Teacher-forced verification rounds: the machinery under `jspec profile-heads` and `jspec fidelity`.

The target runs over real text as if every draft were accepted: after a dense prefill of the context, one
verification block of T = gamma + 1 tokens at a time (rows 0..T-1 at slots start..start+T-1), each layer's
attention computed as an XLA masked f32 softmax over the cache slots the row reads (correctness over speed;
docs/methods.md "Dustin", profiling and fidelity). The same pass reads the attention signals Dustin selects
from:

    hist    the target-historical signal A_T: the rows {0, T-1} of a block (Vegas' Collect-2-Query rows),
            softmax over the whole cache, from the row's own queries (a sparse row's too, as the estimation
            pass of a real Dustin round computes them); it selects for the *next* block
    draft   the draft-lookahead signal A_D of a self-speculative drafter: rows 0..T-2 (the draft steps run
            [last, d1 .. d_{gamma-1}]), softmax over what the draft step reads (`Probe.draft_support`):
            "oracle" the whole cache (an upper bound for any drafter), "streaming" sink + recent window,
            "quest" pages by min/max keys, "vegas" the previous block's per-layer top-k. The draft steps'
            queries are taken as the dense target's at those rows (an approximation: a real draft step's
            deeper layers see its own sparse attention)
    mass    the dense attention of every layer, head and row of the block: what ARR is measured against

`longspec_draft` gives the LongSpec drafter's signal instead: its cross-attention over the target's last
layer while it drafts the block teacher-forced.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jspec import kv_cache, model, selection
from jspec.config import ModelConfig
from jspec.drafter.model import attend, drafter_fill, drafter_tree_step
from jspec.errors import InputError

DRAFT_SUPPORTS = ("oracle", "streaming", "quest", "vegas")


@dataclasses.dataclass(frozen=True)
class Probe:
    """What a round computes besides the logits (static: one compiled program per Probe).

    T: rows per block (gamma + 1). per_head: signals per (layer, head) [B, L, N, S] (profiling) instead of
    summed with head weights [B, S] (fidelity). draft: compute the draft signal. mass: the dense attention
    summed over layers, heads and rows (ARR's reference). draft_support / draft_budget / draft_sink /
    draft_page: the modelled self-speculative draft step's reads. quest_page / quest_max_pages: the Quest
    verification baseline (0 pages: no row uses it).
    """

    T: int
    per_head: bool = False
    draft: bool = False
    mass: bool = False
    draft_support: str = "oracle"
    draft_budget: int = 512
    draft_sink: int = 4
    draft_page: int = 16
    quest_page: int = 16
    quest_max_pages: int = 0

    def __post_init__(self):
        if self.draft_support not in DRAFT_SUPPORTS:
            raise InputError(f"draft support {self.draft_support!r} unknown: {', '.join(DRAFT_SUPPORTS)}")
        if self.T < 2:
            raise InputError(f"a verification block needs T >= 2 rows (gamma >= 1), got T={self.T}")

    @property
    def hist_rows(self) -> tuple:
        return (0, self.T - 1)

    @property
    def draft_rows(self) -> tuple:
        return tuple(range(self.T - 1))


class Reads(NamedTuple):
    """What each row of a block reads before the block: `sel` bool[B, S] one set for every layer, head and
    row (Dustin, its ablations, streaming, dense); rows with `quest_pages[b] > 0` read instead, per layer and
    row, their best quest_pages pages by Quest's min/max bound plus the partial last page. The block's own
    rows (the causal tail) are always read."""

    sel: jax.Array          # bool[B, S]
    quest_pages: jax.Array  # int32[B]


def dense_reads(B: int, S: int) -> Reads:
    return Reads(sel=jnp.ones((B, S), bool), quest_pages=jnp.zeros((B,), jnp.int32))


# ------------------------------------------------------------------------------------------------ prompts

def calibration_prompts(tokenizer, texts_dir: Optional[str], n_tokens: int, count: int) -> tuple[list, list]:
    """`count` windows of `n_tokens` tokens, code and prose in turn, cut from `texts_dir` (*.py files are code,
    other text files prose; as `jspec bench --texts`) completed from the running Python's standard library and
    pydoc topics. Returns (token lists, source names). InputError for a missing folder or too-short texts."""
    from jspec.bench import text_sources
    if texts_dir is not None and not os.path.isdir(texts_dir):
        raise InputError(f"--texts {texts_dir!r} is not a folder")
    try:
        code, prose = text_sources(texts_dir)
    except FileNotFoundError as e:
        raise InputError(f"--texts {texts_dir}: {e}") from None
    encoded: dict = {}
    rows, names = [], []
    for i in range(count):
        files = (code, prose)[i % 2]
        ids = None
        for k in range(len(files)):   # the next file of this kind long enough, round robin
            name, text = files[(i // 2 + k) % len(files)]
            if name not in encoded:
                encoded[name] = tokenizer.encode(text, add_special_tokens=False)
            if len(encoded[name]) >= n_tokens:
                ids = encoded[name]
                break
        if ids is None:
            kind = ("code", "prose")[i % 2]
            raise InputError(f"no {kind} text of {n_tokens} tokens (the longest has "
                             f"{max(len(encoded[n]) for n, _ in files)}); give longer texts (--texts) or a "
                             f"shorter context")
        span = len(ids) - n_tokens
        start = (i // 2 * 7919 + i * 104729) % (span + 1)   # spread: two rows of one file are not one window
        rows.append(list(ids[start:start + n_tokens]))
        names.append(name)
    return rows, names


# ------------------------------------------------------------------------------------------------ attention

def _weights(q, k, visible):
    """softmax(q.k / sqrt(H)) over the visible slots, f32. q [B, T, N, H]; k [B, S, K, H]; visible bool[B, T, S]
    -> f32[B, N, T, S] (0 where hidden)."""
    B, T, N, H = q.shape
    K = k.shape[2]
    s = jnp.einsum("BTKGH,BSKH->BKGTS", q.astype(jnp.float32).reshape(B, T, K, N // K, H), k.astype(jnp.float32))
    s = s.reshape(B, N, T, -1) * (H ** -0.5)
    vis = visible[:, None]
    mx = jnp.max(jnp.where(vis, s, -jnp.inf), axis=-1, keepdims=True)
    e = jnp.where(vis, jnp.exp(s - jnp.where(jnp.isfinite(mx), mx, 0.0)), 0.0)
    den = e.sum(-1, keepdims=True)
    return e / jnp.where(den > 0, den, 1.0)


def quest_reads(q, k, start, n_pages, *, page: int, max_pages: int):
    """Quest's reads per row: the n_pages complete pages (of `page` slots before `start`) with the best
    min/max bound sum_{n,h} max(q*min, q*max) for that row's queries (selection.page_scores), plus the partial
    page [start // page * page, start). q [B, R, N, H]; k [B, S, K, H]; start, n_pages int32[B] ->
    bool[B, R, S]."""
    B, R, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    mins, maxs = selection.page_minmax(k[None], page)
    mins, maxs = mins[0].astype(jnp.float32), maxs[0].astype(jnp.float32)      # [B, P, K, H]
    P = mins.shape[1]
    qg = q.astype(jnp.float32).reshape(B, R, K, N // K, H)
    s = (jnp.einsum("BRKH,BPKH->BRP", jnp.maximum(qg, 0).sum(3), maxs)
         + jnp.einsum("BRKH,BPKH->BRP", jnp.minimum(qg, 0).sum(3), mins))
    complete = start // page
    s = jnp.where(jnp.arange(P)[None, None] < complete[:, None, None], s, -jnp.inf)
    m = min(max_pages, P)
    _, top = jax.lax.top_k(s, m)                                                 # [B, R, m]
    keep = jnp.arange(m)[None, None] < jnp.minimum(n_pages, complete)[:, None, None]
    # top holds distinct pages per row, so a plain scatter of `keep` marks exactly the kept ones
    chosen = jnp.zeros((B, R, P), bool).at[jnp.arange(B)[:, None, None], jnp.arange(R)[None, :, None], top].set(keep)
    slot = jnp.arange(S)
    in_page = jnp.pad(jnp.repeat(chosen, page, axis=-1), ((0, 0), (0, 0), (0, S - P * page)))
    partial = (slot >= complete[:, None] * page) & (slot < start[:, None])
    return in_page | partial[:, None]


def _draft_support(probe: Probe, q, k, start, prev_scores):
    """bool[B, R, S] what a modelled draft step reads before the block (rows = probe.draft_rows)."""
    B, R = q.shape[:2]
    S = k.shape[1]
    slot = jnp.arange(S)[None]
    before = slot < start[:, None]
    if probe.draft_support == "oracle":
        sup = before
    elif probe.draft_support == "streaming":
        sup = before & ((slot < probe.draft_sink) | (slot >= start[:, None] - (probe.draft_budget - probe.draft_sink)))
    elif probe.draft_support == "quest":
        n = jnp.full((B,), probe.draft_budget // probe.draft_page, jnp.int32)
        return quest_reads(q, k, start, n, page=probe.draft_page, max_pages=probe.draft_budget // probe.draft_page)
    else:   # vegas: the previous block's per-layer top-k before its first slot, then everything from there on
        point = start - probe.T
        s = jnp.where(slot < point[:, None], prev_scores, -jnp.inf)
        kk = min(probe.draft_budget, S)
        _, top = jax.lax.top_k(s, kk)
        ok = jnp.arange(kk)[None] < jnp.minimum(probe.draft_budget, point)[:, None]
        sup = jnp.zeros((B, S), bool).at[jnp.arange(B)[:, None], top].set(ok) | ((slot >= point[:, None]) & before)
    return jnp.broadcast_to(sup[:, None], (B, R, S))


# ------------------------------------------------------------------------------------------------ rounds

@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def prefill(params, cache, tokens, *, cfg: ModelConfig):
    """The context through the ordinary dense forward (no logits kept beyond one row)."""
    B = tokens.shape[0]
    _, cache, _ = model.forward(params, cfg, tokens, cache, logits_at=jnp.zeros((B, 1), jnp.int32))
    return cache


@functools.partial(jax.jit, static_argnames=("cfg", "probe"), donate_argnames=("cache",))
def round_step(params, cache, tokens, targets, reads: Reads, head_t, head_d, prev_scores, *, cfg: ModelConfig,
               probe: Probe):
    """One teacher-forced block: `tokens` int32[B, T] at slots lengths..lengths+T-1, `targets` int32[B, T] the
    true next tokens. head_t / head_d f32[L, N]: each (layer, head)'s weight in the summed signals (ignored
    per_head). prev_scores f32[L, B, S]: the previous block's per-layer scores (draft support "vegas").

    Returns (out, cache): out has top1 int32[B, T], nll f32[B, T] (-log p(target)), recovered f32[B] (mean over
    layers, heads, rows of the row's dense attention mass on what it read: its own ARR), hist [B, S] or
    [B, L, N, S]; with draft support "vegas" scores f32[L, B, S] (the hist rows summed over each layer's heads:
    the next block's prev_scores); with probe.draft, draft [B, S] or [B, L, N, S]; with probe.mass, mass
    f32[B, S] (dense weights summed over layers, heads, rows at slots before the block) and tail f32[B] (the
    same sum over the block's own slots).
    """
    B, T = tokens.shape
    S = cache.capacity
    start = cache.lengths
    slot = jnp.arange(S)
    before = slot[None] < start[:, None]                                                  # [B, S]
    row = jnp.arange(T)
    tail = (slot[None, None] >= start[:, None, None]) & (slot[None, None] <= (start[:, None] + row)[:, :, None])
    causal = before[:, None] | tail                                                       # [B, T, S] dense
    got = {"recovered": [], "hist": [], "draft": [], "mass": [], "tail": [], "scores": []}

    def signal(i, x, heads):   # x [B, N, S] -> per head, or weighted by heads[i] and summed
        return x if probe.per_head else jnp.einsum("BNS,N->BS", x, heads[i])

    def hook(i, q, k_all, v_all, kv_len):
        k, v = k_all[i], v_all[i]
        w = _weights(q, k, causal)                                                        # [B, N, T, S]
        read = jnp.broadcast_to((reads.sel & before)[:, None], (B, T, S))
        if probe.quest_max_pages:
            qr = quest_reads(q, k, start, reads.quest_pages, page=probe.quest_page, max_pages=probe.quest_max_pages)
            read = jnp.where((reads.quest_pages > 0)[:, None, None], qr, read)
        visible = read | tail
        got["recovered"].append(jnp.sum(w * visible[:, None], axis=(1, 2, 3)))
        hist = w[:, :, probe.hist_rows].sum(2)                                            # [B, N, S]
        got["hist"].append(signal(i, hist, head_t))
        if probe.draft_support == "vegas":
            got["scores"].append(hist.sum(1))
        if probe.draft:
            dr = probe.draft_rows
            if probe.draft_support == "oracle":
                wd = w[:, :, dr]
            else:
                prev = None if prev_scores is None else prev_scores[i]
                sup = _draft_support(probe, q[:, dr], k, start, prev) | tail[:, :len(dr)]
                wd = _weights(q[:, dr], k, sup)
            got["draft"].append(signal(i, jnp.where(before[:, None], wd.sum(2), 0.0), head_d))
        if probe.mass:
            got["mass"].append(jnp.where(before, w.sum((1, 2)), 0.0))
            got["tail"].append(jnp.sum(w * tail[:, None], axis=(1, 2, 3)))
        return attend(q, k, v, visible)

    logits, cache, _ = model.forward(params, cfg, tokens, cache, attend=hook)
    lse = jax.nn.logsumexp(logits, axis=-1)
    out = {"top1": jnp.argmax(logits, axis=-1).astype(jnp.int32),
           "nll": lse - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0],
           "recovered": sum(got["recovered"]) / (cfg.n_layers * cfg.n_heads * T)}
    for name in ("hist", "draft"):
        if got[name]:
            out[name] = jnp.stack(got[name], axis=1) if probe.per_head else sum(got[name])
    if got["scores"]:
        out["scores"] = jnp.stack(got["scores"])                                          # [L, B, S]
    if probe.mass:
        out["mass"], out["tail"] = sum(got["mass"]), sum(got["tail"])
    return out, cache


@functools.partial(jax.jit, static_argnames=("cfg", "window"))
def longspec_draft(dparams, params, tokens_all, start, block, target_k, *, cfg: ModelConfig, window: int):
    """The LongSpec drafter's draft-lookahead signal for one block, teacher-forced.

    The drafter drafts the block's tokens [last, d1 .. d_{gamma-1}] = block[:, :-1] as one chain from its
    ring of the tokens before `start` (tokens_all int32[B, C], start int32[B]); each step's cross-attention
    reads the target's last-layer keys target_k [B, S, K, H] at slots < start. Returns f32[B, N, S]: per
    drafter head, the cross-attention weights summed over the steps (0 at and after start).
    """
    B, T = block.shape
    n = T - 1
    K, H = cfg.n_kv_heads, cfg.head_dim
    S = target_k.shape[1]
    dcache = drafter_fill(dparams, params, cfg, tokens_all, start, window=window, dtype=target_k.dtype)
    before = jnp.arange(S)[None] < start[:, None]
    vis = jnp.broadcast_to(before[:, None], (B, n, S))
    seen = []

    def cross_fn(qx):
        seen.append(qx)
        return jnp.zeros_like(qx)        # only the queries are wanted; the drafter's logits are discarded

    zeros = jnp.zeros((B, n, K, H), target_k.dtype)
    steps = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (B, n))
    chain = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (B, n, n))
    drafter_tree_step(dparams, params, cfg, block[:, :n], steps, dcache, zeros, zeros, steps, chain, cross_fn=cross_fn)
    w = _weights(seen[0], target_k, vis)                                                  # [B, N, n, S]
    return w.sum(2)


def new_cache(cfg: ModelConfig, B: int, capacity: int, dtype=None) -> kv_cache.KVCache:
    return kv_cache.init(cfg, batch=B, capacity=capacity, dtype=dtype)


def tile_cache(cache: kv_cache.KVCache, times: int) -> kv_cache.KVCache:
    """The cache with every row repeated `times` times, variant-major: row v * B + b is prompt b."""
    return kv_cache.KVCache(k=jnp.tile(cache.k, (1, times, 1, 1, 1)), v=jnp.tile(cache.v, (1, times, 1, 1, 1)),
                            lengths=jnp.tile(cache.lengths, times))


def heads_mask(cfg: ModelConfig, heads) -> np.ndarray:
    """f32[L, N]: 1 at the given (layer, head) pairs; heads=None: every head."""
    m = np.zeros((cfg.n_layers, cfg.n_heads), np.float32)
    if heads is None:
        m[:] = 1.0
    for layer, h in heads or ():
        m[layer, h] = 1.0
    return m
