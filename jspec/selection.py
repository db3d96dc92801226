"""KV selection policies for sparse self-drafting: which cache positions a draft step attends to.

Every policy returns a compact index list per (layer,) sequence: `idx[..., M]` int32 with the real entries in
`idx[..., :n_valid]` (distinct, each < the draft token's slot) and zeros after them, the layout
`attention.sparse` and `pallas_kernels/sparse_attention` take (page size 1). `M` is static (the budget),
`n_valid` dynamic, so selections change every round without recompiling.

    streaming      sink first positions + the most recent ones (MagicDec-style, query-independent)
    topk_before    top-k of aggregated verification scores before a point (Vegas, docs/methods.md)
    page_minmax / update_pages / page_scores / quest_select   Quest: per-page min/max keys, query-aware
    with_tail      append every position from the selection point up to the draft token (always kept)
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def streaming(lengths, k, *, sink: int, slots: int):
    """Sink + sliding window: positions [0, sink) and [lengths - (k - sink), lengths).

    Args:
      lengths: int32[B] context length (the window ends just before it).
      k: int32[B] (or scalar) selection size including the sink, sink <= k <= slots.
      sink, slots: static ints; slots = M, the index array width.
    Returns:
      idx int32[B, slots], n_valid int32[B] = min(k, lengths) (a short context is selected whole).
    """
    lengths = jnp.asarray(lengths, jnp.int32)
    k = jnp.broadcast_to(jnp.asarray(k, jnp.int32), lengths.shape)
    c = jnp.arange(slots, dtype=jnp.int32)[None]
    full = (lengths >= k)[:, None]
    # Slot c < sink holds position c; slot c >= sink holds lengths - k + c, so slot k-1 is lengths-1.
    idx = jnp.where(full & (c >= sink), (lengths - k)[:, None] + c, c)
    n = jnp.minimum(k, lengths)
    return jnp.where(c < n[:, None], idx, 0), n


def topk_before(scores, point, k, *, slots: int, method: str = "sort"):
    """Per-layer top-k positions of aggregated scores among positions < point (Vegas step 2).

    Args:
      scores: f32[L, B, S] aggregated verification scores (summed over heads and the collected rows).
      point: int32[B] selection point: the first position of the verified block; only earlier positions
        compete (the block itself and everything after it is kept by `with_tail`).
      k: int32[B] (or scalar) how many to keep (<= slots).
      slots: static M.
      method: "sort" (lax.top_k) or "select" (pallas_kernels.topk_select: a threshold-search kernel on a GPU,
        lax.top_k where it cannot run); both keep the same set.
    Returns:
      idx int32[L, B, slots] ("sort": descending score, ties: lower position first; "select": ascending
      position), n_valid int32[L, B] = min(k, point).
    """
    L, B, S = scores.shape
    if method == "select":
        from pallas_kernels.topk_select import topk_select

        idx, n = topk_select(scores, jnp.broadcast_to(jnp.asarray(point, jnp.int32), (L, B)),
                             jnp.broadcast_to(jnp.asarray(k, jnp.int32), (L, B)), slots=slots)
        return idx, n
    if method != "sort":
        raise ValueError(f"{method=} must be 'sort' or 'select'")
    m = min(slots, S)
    pos = jnp.arange(S, dtype=jnp.int32)
    point = jnp.asarray(point, jnp.int32)
    s = jnp.where(pos[None, None, :] < point[None, :, None], scores.astype(jnp.float32), -jnp.inf)
    _, idx = lax.top_k(s, m)
    if m < slots:
        idx = jnp.pad(idx, ((0, 0), (0, 0), (0, slots - m)))
    k = jnp.broadcast_to(jnp.asarray(k, jnp.int32), point.shape)
    n = jnp.broadcast_to(jnp.minimum(jnp.minimum(k, point), m)[None], (L, B))
    c = jnp.arange(slots, dtype=jnp.int32)
    return jnp.where(c < n[..., None], idx.astype(jnp.int32), 0), n


def topk_pages_before(scores, point, k, *, slots: int, page: int, method: str = "sort"):
    """`topk_before` in aligned pages of `page` slots (a page's score is the sum of its slots'): the top
    k // page pages among those that end at or before the page-aligned start (point // page) * page, expanded
    to their slots. Each draft step then gathers whole runs of `page` consecutive cache rows, and the top-k
    runs over S / page scores.

    Args:
      scores, point, k, method: as in `topk_before`; slots: static M, a multiple of `page`.
    Returns:
      idx int32[L, B, slots] (whole pages, ascending within each), n_valid int32[L, B] (a multiple of page),
      start int32[B] = (point // page) * page: the slots [start, point) of the partial page are not among the
      selected ones, so the caller attends everything from `start` on (as from the selection point).
    """
    if slots % page:
        raise ValueError(f"{slots=} must be a multiple of {page=}")
    L, B, S = scores.shape
    n_pages = S // page
    pages = scores[..., :n_pages * page].astype(jnp.float32).reshape(L, B, n_pages, page).sum(-1)
    start = (jnp.asarray(point, jnp.int32) // page) * page
    pidx, pn = topk_before(pages, start // page, jnp.asarray(k, jnp.int32) // page, slots=slots // page,
                           method=method)
    idx = (pidx[..., None] * page + jnp.arange(page, dtype=jnp.int32)).reshape(L, B, slots)
    n = pn * page
    return jnp.where(jnp.arange(slots, dtype=jnp.int32) < n[..., None], idx, 0), n, start


def with_tail(idx, n_valid, start, end, *, tail_slots: int):
    """Append the contiguous positions [start, end) after the first n_valid entries of idx.

    Used for the positions after the selection point, which every draft step must see: the tokens accepted
    since the last selection and those drafted earlier in this round (`attention.sparse` itself only adds
    the draft token's own slot). Requires every selected position < start, so no duplicates arise.

    Args:
      idx: int32[..., B, M]; n_valid: int32[..., B]; start, end: int32[B] with end - start <= tail_slots.
    Returns:
      idx int32[..., B, M + tail_slots], n_valid + (end - start). Entries past the count are 0.
    """
    M = idx.shape[-1]
    c = jnp.arange(M + tail_slots, dtype=jnp.int32)
    padded = jnp.pad(idx, [(0, 0)] * (idx.ndim - 1) + [(0, tail_slots)])
    n = n_valid[..., None]
    tail = start[:, None] + c - n                                  # broadcasts over a leading L axis
    out = jnp.where(c < n, padded, tail)
    n_out = n_valid + (end - start)
    return jnp.where(c < n_out[..., None], out, 0), n_out


# ------------------------------------------------------------------------------------------------- Quest

def page_minmax(k_all, page: int):
    """Per-channel min and max keys of every page of `page` slots (Quest's page summary).

    Args:
      k_all: [L, B, S, K, H] key cache.
    Returns:
      mins, maxs [L, B, S // page, K, H] (cache dtype). A page's summary is meaningful once all its
      slots hold accepted tokens; callers only score complete pages.
    """
    L, B, S, K, H = k_all.shape
    n = S // page
    kp = k_all[:, :, :n * page].reshape(L, B, n, page, K, H)
    return kp.min(axis=3), kp.max(axis=3)


def update_pages(mins, maxs, k_all, first_page, *, count: int, page: int):
    """Recompute the summaries of pages first_page .. first_page + count - 1 (per sequence) from k_all.

    After a round only pages touched by the newly accepted tokens can have completed, so a static
    `count = ceil((depth + 1) / page)` pages per round (depth = gamma + lookup: the most tokens a round can
    accept) keeps the summaries exact at O(depth) cost.
    """
    L, B, S, K, H = k_all.shape
    n_pages = mins.shape[2]
    pages = first_page[:, None] + jnp.arange(count, dtype=jnp.int32)[None]        # [B, count]
    pos = (pages[:, :, None] * page + jnp.arange(page, dtype=jnp.int32)).reshape(B, count * page)
    kg = jnp.take_along_axis(k_all, jnp.clip(pos, 0, S - 1)[None, :, :, None, None], axis=2)
    kg = kg.reshape(L, B, count, page, K, H)
    b = jnp.arange(B)[:, None]
    # Pages past the end of the summary array (near capacity) are dropped.
    mins = mins.at[:, b, pages].set(kg.min(axis=3), mode="drop")
    maxs = maxs.at[:, b, pages].set(kg.max(axis=3), mode="drop")
    return mins, maxs


def page_scores(q, mins, maxs):
    """Quest's upper bound of each page's attention logit, summed over the query heads of the layer.

    score[b, p] = sum_{n, h} max(q[b, n, h] * min[b, p, kv(n), h], q[b, n, h] * max[b, p, kv(n), h])
    computed as relu(q)·max + min(q, 0)·min (equal, because min <= max), i.e. two matmuls.

    Args:
      q: [B, N, H] one draft token's queries (RoPE applied); mins, maxs: [B, P, K, H].
    Returns:
      f32[B, P].
    """
    B, N, H = q.shape
    K = mins.shape[2]
    qg = q.astype(jnp.float32).reshape(B, K, N // K, H)
    pos, neg = jnp.maximum(qg, 0).sum(axis=2), jnp.minimum(qg, 0).sum(axis=2)     # [B, K, H]
    hi = jnp.einsum("BKH,BPKH->BP", pos, maxs.astype(jnp.float32))
    lo = jnp.einsum("BKH,BPKH->BP", neg, mins.astype(jnp.float32))
    return hi + lo


def quest_select(q, mins, maxs, n_complete, n_pages, *, max_pages: int, page: int):
    """Top pages by `page_scores` among the complete ones, expanded to token positions.

    Args:
      q: [B, N, H]; mins, maxs: [B, P, K, H]; n_complete: int32[B] complete pages (pages >= it are not
        scored); n_pages: int32[B] (or scalar) how many pages to keep (<= max_pages).
    Returns:
      idx int32[B, max_pages * page] (best page first), n_valid int32[B].
    """
    B = q.shape[0]
    P = mins.shape[1]
    m = min(max_pages, P)
    s = page_scores(q, mins, maxs)
    s = jnp.where(jnp.arange(P)[None] < n_complete[:, None], s, -jnp.inf)
    _, top = lax.top_k(s, m)                                                        # [B, m]
    if m < max_pages:
        top = jnp.pad(top, ((0, 0), (0, max_pages - m)))
    idx = (top[:, :, None] * page + jnp.arange(page, dtype=jnp.int32)).reshape(B, max_pages * page)
    n_pages = jnp.broadcast_to(jnp.asarray(n_pages, jnp.int32), (B,))
    n = jnp.minimum(jnp.minimum(n_pages, n_complete), m) * page
    c = jnp.arange(max_pages * page, dtype=jnp.int32)
    return jnp.where(c < n[:, None], idx.astype(jnp.int32), 0), n
