"""Dustin (draft-augmented sparse verification): the selection core, as pure functions.

The method and where our choices fill the paper's gaps: docs/methods.md, "Dustin". This module picks
positions, computes the signals from given queries and keys, and measures selections; the engine runs it as a
verification policy (jspec/speculative/sparse_verify.py). Profiling (`jspec profile-heads`) lives elsewhere.

    select_verify       I_verify per sequence: sink + local window, tier 1 top-m by the draft-lookahead
                        signal A_D, tier 2 the rest by the target-historical signal A_T (docs/methods.md)
    attention_recovery  ARR: the softmax attention mass that falls on the selected positions (section 4)
    softmax_weights     dense softmax(q.k / sqrt(d)) over the valid cache positions (GQA), for ARR
    head_weights        the same on a few heads, summed: the target-historical signal A_T (and LongSpec's A_D)
    selected_weights    a sparse draft step's weights over the entries it read, on a few heads: A_D
    Profile             what offline profiling chose for one target (and drafter): budget, tiers, SRH heads;
                        `write_profile` / `read_profile` store it as JSON and refuse a profile made for another model

Index layout: the one `jspec.selection` uses and the sparse kernels take: `idx[B, budget]` int32 with the
selected positions in `idx[b, :n_valid[b]]`, ascending and distinct, and 0 in every slot after them (padding the
caller ignores). `budget` is static, `n_valid` dynamic, so selections change every round without recompiling.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from jspec.errors import InputError
from pallas_kernels.head_weights import head_weights_kernel, kv_groups


def _check(budget, sink, window, m, page):
    """Validate the static arguments; return (m, pages of budget, sink pages, max window pages, tier-1 pages)."""
    for name, v in (("budget", budget), ("sink", sink), ("window", window), ("page", page)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{name} must be a Python int (a static argument), got {v!r}")
    if page < 1:
        raise ValueError(f"page must be >= 1, got {page}")
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if sink < 0 or window < 0:
        raise ValueError(f"sink and window must be >= 0, got sink={sink}, window={window}")
    if budget % page:
        raise ValueError(f"budget={budget} must be a multiple of page={page}: pages are selected whole")
    free = budget - sink - window
    if free < 0:
        raise ValueError(
            f"budget={budget} < sink + window = {sink} + {window}: the protected sink prefix and local window "
            f"alone would not fit in the budget, leaving no room (and a negative number of slots) for the "
            f"draft/target tiers; raise the budget or shrink sink/window")
    if m is None:
        m = free // 2
    if not isinstance(m, int) or isinstance(m, bool):
        raise ValueError(f"m must be a Python int or None, got {m!r}")
    if m < 0:
        raise ValueError(f"m (tier-1 size) must be >= 0, got {m}")
    if m > free:
        raise ValueError(f"m={m} > budget - sink - window = {free}: tier 1 cannot take more than the slots left "
                         f"after the sink and the window")
    kp = budget // page
    sink_pages = -(-sink // page)
    # A window of w positions ending anywhere touches at most 1 + ceil((w - 1) / P) aligned pages.
    win_pages = 0 if window == 0 else 1 + -(-(window - 1) // page)
    if sink_pages + win_pages > kp:
        raise ValueError(
            f"with page={page}, the sink ({sink_pages} page(s)) and the window (up to {win_pages} page(s), it "
            f"need not be page-aligned) can cover {sink_pages + win_pages} pages > budget / page = {kp}; raise "
            f"the budget to at least {(sink_pages + win_pages) * page}")
    return m, kp, sink_pages, m // page


def _ranks(score, cand):
    """Rank of each unit among the candidates: descending score, ties to the lower index; non-candidates last."""
    n = score.shape[-1]
    pos = jnp.arange(n, dtype=jnp.int32)
    # lexsort: the last key is primary. NaN scores sort after every number (rank as the worst candidates).
    order = jnp.lexsort((pos, -score, ~cand))
    return jnp.zeros(n, jnp.int32).at[order].set(pos)


def _top_sort(score, cand, n):
    """The n best candidates (bool mask) by a full sort of the row: the reference for `_top_select`."""
    return cand & (_ranks(score, cand) < n)


def _order_key(score, cand):
    """uint32 keys ranking units as `_ranks` does: candidates by score (-0.0 == +0.0, NaN below every number)
    at keys >= 1, non-candidates at 0."""
    bits = lax.bitcast_convert_type(jnp.where(score == 0, 0.0, score), jnp.uint32)
    key = jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))   # order-preserving image of f32
    return jnp.where(cand, jnp.where(jnp.isnan(score), jnp.uint32(1), key), jnp.uint32(0))


def _kth_key(key, n, bits=4):
    """max{t : count(key >= t) >= n} over uint32 keys[S] (all ones when n == 0; 0 when n > S): the n-th largest
    key, found `bits` bits at a time from the top; each step counts the keys >= 2^bits - 1 candidate thresholds
    at once (one pass over the row), so 32 / bits passes in all."""
    t = jnp.uint32(0)
    digits = jnp.arange(1, 2 ** bits, dtype=jnp.uint32)[:, None]
    for shift in range(32 - bits, -1, -bits):
        counts = (key[None] >= (t | (digits << shift))).sum(-1, dtype=jnp.int32)   # non-increasing in the digit
        t = t | ((counts >= n).sum(dtype=jnp.uint32) << shift)
    return t


def _top_select(score, cand, n):
    """`_top_sort`'s mask without a sort: the keys above the n-th largest, then the ties at it by position."""
    key = _order_key(score, cand)
    t = _kth_key(key, n)
    above = key > t
    tie = key == t
    need = n - above.sum(dtype=jnp.int32)
    return cand & (above | (tie & (jnp.cumsum(tie, dtype=jnp.int32) <= need)))


_TOP = {"select": _top_select, "sort": _top_sort}


def _select_row(draft, target, length, *, budget, sink, window, page, kp, sink_pages, m_pages, method):
    """One sequence: f32[S] scores (S a multiple of page), scalar length -> (idx int32[budget], n_valid)."""
    S = draft.shape[0]
    n_pages = S // page
    slot = jnp.arange(S, dtype=jnp.int32)
    valid = slot < length
    # Page scores: the sum over the page's valid slots only (a partial last page is not inflated by garbage).
    d = jnp.where(valid, draft, 0.0).reshape(n_pages, page).sum(-1)
    t = jnp.where(valid, target, 0.0).reshape(n_pages, page).sum(-1)
    p = jnp.arange(n_pages, dtype=jnp.int32)
    pvalid = p * page < length
    win_start = jnp.maximum(length - window, 0) // page
    prot = pvalid & ((p < sink_pages) | ((window > 0) & (p >= win_start)))
    n_prot = prot.sum(dtype=jnp.int32)
    left = kp - n_prot                      # >= 0: _check bounds the protected pages by kp
    n1 = jnp.minimum(m_pages, left)
    cand = pvalid & ~prot
    top = _TOP[method]
    none = jnp.zeros_like(cand)
    # Static skips, the same selection: m = 0 leaves tier 1 empty; a tier 1 that always takes every free page
    # (draft-only: left <= kp - the fewest pages the sink and window protect when length > budget) leaves tier 2
    # empty. Profiles choose these ends (docs/methods.md), and each tier is a threshold search over the row.
    fewest_left = kp - sink_pages - -(-window // page)
    tier1 = top(d, cand, n1) if m_pages else none
    tier2 = top(t, cand & ~tier1, left - n1) if m_pages < fewest_left else none
    sparse = prot | tier1 | tier2
    # Dense verification when everything fits (length <= budget). The tiers would pick every valid page then
    # too (ceil(length / P) <= kp); the explicit branch states the rule.
    chosen = jnp.where(length <= budget, pvalid, sparse)
    mask = jnp.repeat(chosen, page) & valid
    n_valid = mask.sum(dtype=jnp.int32)
    dest = jnp.where(mask, jnp.cumsum(mask, dtype=jnp.int32) - 1, budget)   # ascending compaction
    idx = jnp.zeros(budget, jnp.int32).at[dest].set(slot, mode="drop")
    return idx, n_valid


@functools.partial(jax.jit, static_argnames=("budget", "sink", "window", "page", "kp", "sink_pages", "m_pages",
                                             "method"))
def _select(draft, target, lengths, *, budget, sink, window, page, kp, sink_pages, m_pages, method):
    B, S = draft.shape
    pad = (-S) % page
    if pad:
        draft = jnp.pad(draft, ((0, 0), (0, pad)))
        target = jnp.pad(target, ((0, 0), (0, pad)))
    row = functools.partial(_select_row, budget=budget, sink=sink, window=window, page=page, kp=kp,
                            sink_pages=sink_pages, m_pages=m_pages, method=method)
    return jax.vmap(row)(draft, target, lengths)


def select_verify(draft_score, target_score, lengths, *, budget: int, sink: int = 4, window: int = 64,
                  m: int | None = None, page: int = 1, method: str = "select"):
    """Choose I_verify, the cache positions the target verifies against (docs/methods.md).

    Per sequence b, with `lengths[b]` cached positions (positions >= lengths[b] are invalid and never chosen,
    whatever their scores):
      - if lengths[b] <= budget: every valid position (dense verification);
      - otherwise: the sink prefix [0, sink) and the local window [lengths - window, lengths) (protected), then
        tier 1: the top-m remaining positions by `draft_score`, then tier 2: the best remaining positions by
        `target_score` until `budget` are chosen. Ties go to the lower position.

    Pages (page = P > 1): the unit is an aligned page of P slots [pP, pP + P). A page's score is the sum of its
    valid slots' scores; the sink and the window are expanded to every page they touch; tier 1 takes m // P
    pages (CHOICE: m counts slots, rounded down to whole pages), capped by what the protected pages leave;
    tier 2 fills the remaining budget / P pages. A partially valid last page contributes only its valid slots,
    so n_valid may fall short of the budget by less than P.

    Args:
      draft_score, target_score: f32[B, S] the A_D and A_T signals per cache position (any scale: tiers are
        rank-based). NaN ranks below every number.
      lengths: int32[B] valid cache length per sequence, 0 <= lengths <= S.
      budget: static int K, the index width; a multiple of `page`, >= sink + window (and, with pages, >= the
        pages the sink and an unaligned window can touch, times P).
      sink, window: static ints s and w (CHOICE defaults 4 and 64).
      m: static tier-1 size in positions, 0 <= m <= budget - sink - window; None: (budget - sink - window) // 2.
        m = 0 is target-only, m = budget - sink - window draft-only.
      page: static page size P.
      method: how the tiers are ranked, both giving the same selection: "select" (a threshold search for the
        tier's last key: 8 counting passes over the row, no sort) or "sort" (a full sort of the row per tier).
    Returns:
      idx int32[B, budget]: the chosen positions in idx[b, :n_valid[b]], ascending, distinct, < lengths[b];
        every slot after n_valid[b] holds 0 (padding, to be masked by the caller).
      n_valid int32[B]: min(lengths, budget) at page 1.
    Raises:
      ValueError on a bad static argument (budget < sink + window, budget not a multiple of page, m out of
      range, negative sizes, an unknown method).
    Jittable (the static arguments are Python ints); no host round trip.
    """
    m, kp, sink_pages, m_pages = _check(budget, sink, window, m, page)
    if method not in _TOP:
        raise ValueError(f"{method=} must be one of {sorted(_TOP)}")
    draft_score = jnp.asarray(draft_score, jnp.float32)
    target_score = jnp.asarray(target_score, jnp.float32)
    if draft_score.ndim != 2 or draft_score.shape != target_score.shape:
        raise ValueError(f"draft_score and target_score must both be [B, S], got {draft_score.shape} and "
                         f"{target_score.shape}")
    lengths = jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), draft_score.shape[:1])
    return _select(draft_score, target_score, lengths, budget=budget, sink=sink, window=window, page=page,
                   kp=kp, sink_pages=sink_pages, m_pages=m_pages, method=method)


def attention_recovery(weights, idx, n_valid):
    """Attention Recovery Rate: the mean softmax mass on the selected positions (docs/methods.md).

    Axis convention (batch first, as `softmax_weights` returns it): weights f32[B, ..., S], already normalised
    over S; the middle axes are whatever is averaged (layers, heads, query rows, e.g. [B, L, N, T, S]).
    Args:
      weights: f32[B, ..., S].
      idx, n_valid: a `select_verify` result, int32[B, K] and int32[B] (entries past n_valid are ignored).
    Returns:
      f32[B]: per sequence, the mean over the middle axes of sum_{j in idx[b, :n_valid[b]]} weights[b, ..., j].
      Take `.mean()` for one number over the batch.
    """
    weights = jnp.asarray(weights, jnp.float32)
    idx = jnp.asarray(idx, jnp.int32)
    B, S = weights.shape[0], weights.shape[-1]
    K = idx.shape[-1]
    keep = jnp.arange(K)[None] < jnp.asarray(n_valid, jnp.int32)[:, None]            # [B, K]
    # A one-hot selection mask over S (distinct indices), so no gather over the middle axes is needed.
    sel = jnp.zeros((B, S), jnp.float32).at[jnp.arange(B)[:, None], jnp.where(keep, idx, S)].set(1.0, mode="drop")
    w = weights.reshape(B, -1, S)
    return jnp.einsum("brs,bs->br", w, sel).mean(-1)


def softmax_weights(q, k, lengths):
    """Dense attention weights softmax(q.k / sqrt(H)) over the valid cache positions, for ARR.

    Args:
      q: [B, T, N, H] queries (e.g. the verified rows).
      k: [B, S, K, H] cached keys; GQA: q-head n reads kv head n // (N // K).
      lengths: int32[B] valid positions; positions >= lengths get weight 0. No causal mask inside the
        rows: every row sees every valid position (mask the rows' own block via `lengths` if needed).
    Returns:
      f32[B, N, T, S], each row summing to 1 over the valid positions (all 0 where lengths == 0).
    """
    q = jnp.asarray(q, jnp.float32)
    k = jnp.asarray(k, jnp.float32)
    B, T, N, H = q.shape
    _, S, K, _ = k.shape
    if N % K:
        raise ValueError(f"q heads N={N} must be a multiple of kv heads K={K}")
    G = N // K
    s = jnp.einsum("btkgh,bskh->bkgts", q.reshape(B, T, K, G, H), k).reshape(B, N, T, S) / jnp.sqrt(
        jnp.float32(H))
    valid = (jnp.arange(S)[None] < jnp.asarray(lengths, jnp.int32).reshape(-1, 1))[:, None, None, :]
    s = jnp.where(valid, s, -jnp.inf)
    mx = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.where(valid, jnp.exp(s - jnp.where(jnp.isfinite(mx), mx, 0.0)), 0.0)
    den = e.sum(-1, keepdims=True)
    return e / jnp.where(den > 0, den, 1.0)


def _logsumexp(s):
    """log(sum(exp(s))) over the last axis in one reduction (a running max and the sum rescaled to it, as flash
    attention keeps them); -inf where every entry is -inf."""
    def combine(x, y):
        m = jnp.maximum(x[0], y[0])
        rescale = lambda mx, total: jnp.where(mx == -jnp.inf, 0.0, total * jnp.exp(mx - m))   # noqa: E731
        return m, rescale(*x) + rescale(*y)

    m, total = lax.reduce((s, jnp.ones_like(s)), (jnp.float32(-jnp.inf), jnp.float32(0.0)), combine,
                          (s.ndim - 1,))
    return (m + jnp.log(total))[..., None]


# The Pallas kernel for `head_weights` (pallas_kernels/head_weights.py) where it runs, else this XLA version. At
# Llama-3-8B shapes (32K, B=16, 4 KV groups over 2 layers) it took 0.23 ms against XLA's 0.66 ms, 2.9x, on an H100
# (`bench/kernels.py --only verify`, kernels_verify_probe_h100.json; docs/performance.md, Dustin).
PROBE_KERNEL = True


def head_weights(q, k, lengths, heads, *, layer=None, kernel: Optional[bool] = None, interpret: bool = False):
    """A signal from a few heads: sum over the rows and the chosen q-heads of softmax(q.k / sqrt(H)) over the
    valid positions; the target-historical A_T (verification rows over the prefix) and LongSpec's A_D (the
    drafter's cross-attention over the target's last layer). Equals `softmax_weights(q, k, lengths)[:, heads]`
    summed over heads and rows (up to float rounding), but reads only the KV groups of the chosen heads, each
    once and in its own dtype (q.k products accumulated in f32), and normalises each row in one pass over its
    scores.

    Args:
      q: [B, R, N, H] query rows; k: [B, S, K, H] one layer's keys, or the stacked [L, B, S, K, H] cache with
        `layer` (read in place by the kernel); lengths: int32[B] valid positions.
      heads: static tuple of q-head indices.
      kernel: the Pallas kernel (None: `PROBE_KERNEL`), falling back to this XLA version where it cannot run
        (a CPU backend without `interpret`, an unsupported shape).
    Returns:
      f32[B, S] (0 at positions >= lengths; all 0 where lengths == 0).
    """
    if PROBE_KERNEL if kernel is None else kernel:
        try:
            return head_weights_kernel(q, k, lengths, tuple(heads), layer=layer, interpret=interpret)
        except NotImplementedError:
            pass
    if layer is not None:
        k = k[layer]
    B, R, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    dtype = jnp.promote_types(q.dtype, k.dtype)
    valid = (jnp.arange(S)[None] < jnp.asarray(lengths, jnp.int32)[:, None])[:, None, None, :]   # [B, 1, 1, S]
    out = jnp.zeros((B, S), jnp.float32)
    for g, ns in kv_groups(heads, N, K):   # one small einsum per KV group: its keys are read once
        qg = q[:, :, jnp.asarray(ns)].astype(dtype)                                      # [B, R, n, H]
        s = jnp.einsum("brnh,bsh->bnrs", qg, k[:, :, g].astype(dtype), preferred_element_type=jnp.float32)
        s = jnp.where(valid, s * H ** -0.5, -jnp.inf)
        out = out + jnp.where(valid, jnp.exp(s - _logsumexp(s)), 0.0).sum(axis=(1, 2))
    return out


def selected_weights(q, k, idx, n_valid, own, heads):
    """A self-speculative draft step's A_D on a few heads: its softmax weights over the entries it read,
    idx[b, :n_valid[b]] plus its own token at slot own[b], summed over the chosen q-heads and scattered back to
    cache positions (0 at every slot it did not read, and its own token's weight left out).

    Args:
      q: [B, 1, N, H] the draft token's queries; k: [B, S, K, H] one layer's keys.
      idx: int32[B, M] selected positions; n_valid: int32[B]; own: int32[B] the draft token's slot.
      heads: static tuple of q-head indices.
    Returns:
      f32[B, S].
    """
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    M = idx.shape[1]
    pos = jnp.concatenate([idx, own[:, None]], axis=1)                                  # [B, M + 1]
    ok = (jnp.arange(M + 1)[None] < n_valid[:, None]) | (jnp.arange(M + 1)[None] == M)
    per_pos = jnp.zeros((B, M + 1), jnp.float32)
    for g, ns in kv_groups(heads, N, K):
        kg = jnp.take_along_axis(k[:, :, g], pos[:, :, None], axis=1).astype(jnp.float32)     # [B, M + 1, H]
        s = jnp.einsum("bnh,bmh->bnm", q[:, 0, jnp.asarray(ns)].astype(jnp.float32), kg) * H ** -0.5
        s = jnp.where(ok[:, None], s, -jnp.inf)
        per_pos = per_pos + jax.nn.softmax(s, axis=-1).sum(1)
    per_pos = jnp.where(jnp.arange(M + 1)[None] < M, per_pos, 0.0)   # the selection only
    return jnp.zeros((B, S), jnp.float32).at[jnp.arange(B)[:, None], pos].add(per_pos)


PROFILE_FORMAT = "jspec-dustin-profile/1"
# The target's shape a profile is tied to: its heads are indices into these layers and heads.
_MODEL_KEYS = ("arch", "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim")


def model_signature(cfg) -> dict:
    """The ModelConfig fields a profile must match (a profile names layers and heads of one architecture)."""
    return {k: getattr(cfg, k) for k in _MODEL_KEYS}


@dataclasses.dataclass(frozen=True)
class Profile:
    """What offline profiling (`jspec profile-heads`, the paper's Algorithm 1) chose for one target + drafter.

    model: `model_signature` of the target it was made for. drafter: "self" (the self-speculative drafts of
    streaming / quest / vegas) or "longspec" (a trained drafter block). budget, sink, window, m, page: the
    `select_verify` arguments. target_heads: the (layer, q_head) pairs of the target whose attention gives the
    target-historical signal A_T (the Semantic Retrieval Heads). draft_heads: the (layer, q_head) pairs whose
    draft attention gives A_D -- target layers for "self", the drafter's own layers for "longspec".
    dense_layers: target layers verified densely. arr: the Attention Recovery Rate reached on the calibration
    prompts; curves: ARR against the number of SRHs and against m (for plots), free-form.
    """

    model: dict
    drafter: str
    budget: int
    sink: int = 4
    window: int = 64
    m: Optional[int] = None
    page: int = 1
    target_heads: tuple = ()
    draft_heads: tuple = ()
    dense_layers: tuple = ()
    arr: Optional[float] = None
    curves: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.drafter not in ("self", "longspec"):
            raise InputError(f"profile drafter must be 'self' or 'longspec', got {self.drafter!r}")
        _check(self.budget, self.sink, self.window, self.m, self.page)
        for name in ("target_heads", "draft_heads"):
            pairs = tuple(tuple(int(x) for x in hp) for hp in getattr(self, name))
            if any(len(hp) != 2 for hp in pairs):
                raise InputError(f"profile {name} must be (layer, q_head) pairs, got {getattr(self, name)!r}")
            object.__setattr__(self, name, pairs)
        object.__setattr__(self, "dense_layers", tuple(int(x) for x in self.dense_layers))

    def check_model(self, cfg, where: str = "profile") -> None:
        """Raise InputError unless this profile was made for a model shaped like `cfg`."""
        mine, theirs = self.model, model_signature(cfg)
        diff = {k: (mine.get(k), v) for k, v in theirs.items() if mine.get(k) != v}
        if diff:
            shown = ", ".join(f"{k}: profile {a!r}, model {b!r}" for k, (a, b) in diff.items())
            raise InputError(f"{where} was made for another model ({shown}); run `jspec profile-heads` for this one")
        for layer, head in self.target_heads:
            if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
                raise InputError(f"{where}: target head (layer {layer}, head {head}) outside the model's "
                                 f"{cfg.n_layers} layers x {cfg.n_heads} heads")
        for layer in self.dense_layers:
            if not 0 <= layer < cfg.n_layers:
                raise InputError(f"{where}: dense layer {layer} outside the model's {cfg.n_layers} layers")


def write_profile(path: str, profile: Profile) -> str:
    """Write `profile` as JSON atomically (temp file + rename: never a half-written file); return the path."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = dict(format=PROFILE_FORMAT, **dataclasses.asdict(profile))
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
    return path


def read_profile(src, cfg=None) -> Profile:
    """A Profile from a JSON path or its dict; with `cfg`, also check it was made for that model.

    Raises InputError for a missing or unreadable file, another format, unknown or missing fields, or (with
    cfg) a profile made for another model."""
    where = "profile"
    if not isinstance(src, dict):
        where = f"profile {src}"
        try:
            with open(src) as f:
                src = json.load(f)
        except FileNotFoundError:
            raise InputError(f"{where} not found") from None
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"{where} is not readable JSON: {e}") from None
    if not isinstance(src, dict) or src.get("format") != PROFILE_FORMAT:
        got = src.get("format") if isinstance(src, dict) else type(src).__name__
        raise InputError(f"{where} is not a Dustin profile (format {got!r}, expected {PROFILE_FORMAT!r})")
    fields = {f.name for f in dataclasses.fields(Profile)}
    body = {k: v for k, v in src.items() if k != "format"}
    if set(body) - fields:
        raise InputError(f"{where} has unknown field(s) {sorted(set(body) - fields)}")
    try:
        prof = Profile(**body)
    except TypeError as e:   # a required field missing
        raise InputError(f"{where}: {e}") from None
    except ValueError as e:
        raise InputError(f"{where}: {e}") from None
    if cfg is not None:
        prof.check_model(cfg, where)
    return prof
