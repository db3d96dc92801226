"""Sparse verification (Dustin and its baselines) as a policy that composes with every drafter; lossy.

`SpecConfig.verify` (a `Verify`) says how a round's drafts are verified. "dense" is the lossless default and
never reaches this module (the engine's program is then unchanged). Otherwise every verification reads, per
sequence, only `budget` cache slots plus the round's own new tokens (docs/methods.md, "Dustin"):

    dustin     sink + local window, then tier 1: the top-m slots by the draft-lookahead signal A_D, tier 2:
               the best of the rest by the target-historical signal A_T (`jspec.dustin.select_verify`); one
               set for every layer, `dense_layers` read everything
    streaming  sink + the newest budget - sink slots
    quest      per layer, the budget // P best pages of P slots by Quest's min/max-key bound summed over the
               verified rows' queries, plus the partial last page (page summaries kept in State)

Signals, from forwards the round runs anyway (no extra model pass):
    A_D  self-speculative drafts (streaming / quest / vegas): each draft step's softmax weights on the draft
         heads over the entries that step read (0 elsewhere), summed over the round's steps
         (`dustin.selected_weights`); LongSpec: the drafter's cross-attention weights on its draft heads over
         the target's positions, summed over the tree's levels and nodes (`dustin.head_weights`).
    A_T  the verification's own queries on the target heads (rows 0 and T - 1 of the verified block), softmax
         over the whole prefix [0, base), summed (`dustin.head_weights`): a scores-only pass over the KV groups
         of those heads, the paper's restricted recomputation. Computed in every verification, dense or sparse,
         so it stays fresh although a sparse verification reads only its I_verify (CHOICE; `decay` keeps an
         exponentially decayed sum instead, `refresh` adds a dense verification every R rounds).
    The first verification is dense (there is no A_T yet), and so is any round where every live sequence's
    context fits in the budget: that verification is then the lossless one, token for token.

Heads without a profile (`default_heads`, CHOICE, not measured): A_T from all q-heads of the layers at 2/3 and
5/6 of the depth (the sources find the target's signal robust in deep layers), A_D from all q-heads of the
layers at 1/6 and 1/3 (the draft signal is informative early); LongSpec: every head of its cross-attention.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jspec import dustin, model, selection
from jspec.attention import AttnImpl
from jspec.errors import InputError


@struct.dataclass
class State:
    a_t: jax.Array        # f32[B, S] the target-historical signal (zeros when the policy does not use it)
    rounds: jax.Array     # int32[] verifications so far
    mins: object = None   # quest: [L, B, P, K, H] per-page min / max keys
    maxs: object = None


def active(spec) -> bool:
    return not spec.verify.lossless


def default_heads(n_layers: int, n_heads: int) -> tuple:
    """((layer, q_head) target heads, (layer, q_head) self-draft heads) when no profile names them."""
    def every_head(layers):
        return tuple((l, h) for l in sorted(set(layers)) for h in range(n_heads))
    L = n_layers
    return every_head((2 * L // 3, 5 * L // 6)), every_head((L // 6, L // 3))


def heads(spec, cfg) -> tuple:
    """(target heads, draft heads) as {layer: (q heads)}: the Verify's, else the defaults. LongSpec's draft heads
    are its cross-attention's (layer 0 of the drafter block)."""
    v = spec.verify
    target, draft = default_heads(cfg.n_layers, cfg.n_heads)
    if spec.method == "longspec":
        draft = tuple((0, h) for h in range(cfg.n_heads))
    target = v.target_heads if v.target_heads is not None else target
    draft = v.draft_heads if v.draft_heads is not None else draft
    return _by_layer(target), _by_layer(draft)


def _by_layer(pairs) -> dict:
    out = {}
    for layer, head in pairs:
        if head not in out.setdefault(layer, []):
            out[layer].append(head)
    return {l: tuple(hs) for l, hs in sorted(out.items())}


def _tier1(v) -> int:
    m = v.tier1
    return (v.budget - v.sink - v.window) // 2 if m is None else m


def uses_draft(spec) -> bool:
    """Whether tier 1 exists, so the drafts must collect A_D."""
    return spec.verify.kind == "dustin" and _tier1(spec.verify) > 0


def uses_target(spec) -> bool:
    """Whether tier 2 exists, so the verifications must estimate A_T."""
    v = spec.verify
    return v.kind == "dustin" and _tier1(v) < v.budget - v.sink - v.window


def check(spec, cfg) -> None:
    """InputError unless the heads and dense layers fit the target `cfg` (and, for LongSpec, its drafter block:
    one layer of the target's head count)."""
    v = spec.verify
    if v.lossless:
        return
    t, d = heads(spec, cfg)
    d_layers = 1 if spec.method == "longspec" else cfg.n_layers
    for name, by_layer, n_layers in (("target", t, cfg.n_layers), ("draft", d, d_layers)):
        for layer, hs in by_layer.items():
            if not 0 <= layer < n_layers or any(not 0 <= h < cfg.n_heads for h in hs):
                where = "the drafter's 1 layer" if n_layers == 1 else f"the model's {n_layers} layers"
                raise InputError(f"verify {name} heads (layer {layer}, heads {hs}) outside {where} x "
                                 f"{cfg.n_heads} heads")
    for layer in v.dense_layers:
        if not 0 <= layer < cfg.n_layers:
            raise InputError(f"verify dense layer {layer} outside the model's {cfg.n_layers} layers")


def init(spec, cfg, cache) -> State:
    """The policy's state after prefill: no A_T yet (the first verification is dense), quest's page summaries."""
    v = spec.verify
    mins = maxs = None
    if v.kind == "quest":
        mins, maxs = selection.page_minmax(cache.k, v.page_size)
    return State(a_t=jnp.zeros((cache.batch, cache.capacity), jnp.float32), rounds=jnp.zeros((), jnp.int32),
                 mins=mins, maxs=maxs)


# ------------------------------------------------------------------------------------------------ signals

def draft_probe(spec, cfg, lengths):
    """`model.forward`'s probe for one self-speculative draft step at slots `lengths` (T = 1): A_D on the draft
    heads over the step's selection, or None when tier 1 is empty."""
    if not uses_draft(spec):
        return None
    _, draft = heads(spec, cfg)

    def probe(layer, q, k_all, sel):
        if layer not in draft or sel is None:
            return None
        idx, n = sel
        if idx.ndim == 3:   # per-layer selections (vegas)
            idx, n = idx[layer], n[layer]
        return dustin.selected_weights(q, k_all[layer], idx, n, lengths, draft[layer])

    return probe


def cross_probe(spec, cfg, cache, live=None):
    """LongSpec: f(q [B, T, N, H]) -> f32[B, S], the drafter's cross-attention weights on its draft heads over
    the target's accepted slots (< lengths), summed over the T nodes; None when tier 1 is empty."""
    if not uses_draft(spec):
        return None
    _, draft = heads(spec, cfg)
    hs = draft.get(0, ())
    if not hs:
        return None
    kv_len = cache.lengths if live is None else jnp.where(live, cache.lengths, 0)
    return lambda q: dustin.head_weights(q, cache.k, kv_len, hs, layer=cfg.n_layers - 1)   # read in place


def _target_probe(spec, cfg, base, kernel=None, interpret=False):
    """A_T from a verification forward: rows 0 and T - 1 of the verified block on the target heads, softmax over
    the prefix [0, base) of the layer's keys, read in the stacked cache (kernel: `dustin.head_weights`')."""
    if not uses_target(spec):
        return None
    target, _ = heads(spec, cfg)

    def probe(layer, q, k_all, sel):
        if layer not in target:
            return None
        rows = q[:, jnp.asarray(sorted({0, q.shape[1] - 1}))]
        return dustin.head_weights(rows, k_all, base, target[layer], layer=layer, kernel=kernel, interpret=interpret)

    return probe


# ---------------------------------------------------------------------------------------------- selection

def _select(spec, cfg, vs: State, a_d, base):
    """model.forward keywords for the selection: `sparse` (one set for every layer) or quest's `selector`."""
    v = spec.verify
    if v.kind == "quest":
        page, n_pages = v.page_size, v.budget // v.page_size
        width = v.budget + page - 1   # + the partial page [n_complete * P, base)
        n_complete = base // page
        fits = base <= v.budget
        c = jnp.arange(width, dtype=jnp.int32)

        def selector(layer, q):
            B, T, N, H = q.shape
            rows = q.transpose(0, 2, 1, 3).reshape(B, N * T, H)   # head n*T + t reads kv n // G, as quest expects
            idx, n = selection.quest_select(rows, vs.mins[layer], vs.maxs[layer], n_complete, n_pages,
                                            max_pages=n_pages, page=page)
            idx, n = selection.with_tail(idx, n, n_complete * page, base, tail_slots=page - 1)
            # A context within the budget is read whole (its verification is the dense one).
            return jnp.where(fits[:, None], jnp.where(c < base[:, None], c, 0), idx), jnp.where(fits, base, n)

        return dict(selector=selector)
    S = vs.a_t.shape[1]
    zeros = jnp.zeros((base.shape[0], S), jnp.float32)
    draft = zeros if a_d is None or not uses_draft(spec) else a_d
    target = vs.a_t if uses_target(spec) else zeros
    idx, n = dustin.select_verify(draft, target, base, budget=v.budget, sink=v.sink, window=v.selection_window,
                                  m=v.tier1, page=v.page_size)
    return dict(sparse=model.Sparse(idx=idx, n_valid=n), dense_layers=v.dense_layers)


def _dense_round(spec, vs: State, base, live):
    """Dense this round: the first verification, every `refresh`-th, or every live context within the budget."""
    v = spec.verify
    fits = jnp.all(jnp.where(live, base <= v.budget, True)) if live is not None else jnp.all(base <= v.budget)
    due = vs.rounds == 0
    if v.refresh:
        due = due | (vs.rounds % v.refresh == 0)
    return fits | due


def forward(params, cfg, spec, vs: State, tokens, cache, a_d=None, *, tree=None, score_rows=(),
            score_mode="weights", impl: AttnImpl = AttnImpl(), live=None):
    """The verification forward (chain, or a tree with `tree`) reading I_verify + the new tokens.

    Args:
      vs: the policy's State; tokens: int32[B, T] the verified block at slots cache.lengths ..;
      a_d: f32[B, S] this round's draft signal (None without one); score_rows / score_mode: as model.forward's
        (vegas' selection: under a sparse verification the scores cover only the slots read).
    Returns:
      logits f32[B, T, V], the cache (lengths + T), scores f32[L, B, S] or None, the State with the new A_T.
    """
    base = cache.lengths
    logits, cache, aux = model.forward(params, cfg, tokens, cache, tree=tree, score_rows=score_rows,
                                       score_mode=score_mode, impl=impl, live=live,
                                       probe=_target_probe(spec, cfg, base),
                                       full_when=_dense_round(spec, vs, base, live),
                                       **_select(spec, cfg, vs, a_d, base))
    a_t = vs.a_t
    if "probe" in aux:
        a_t = aux["probe"] if not spec.verify.decay else spec.verify.decay * a_t + aux["probe"]
        if live is not None:   # a finished row keeps its signal
            a_t = jnp.where(live[:, None], a_t, vs.a_t)
    return logits, cache, aux.get("scores"), vs.replace(a_t=a_t, rounds=vs.rounds + 1)


def update(spec, vs: State, cache, base) -> State:
    """After acceptance (cache.lengths = the new lengths): quest's summaries of the pages the round completed."""
    v = spec.verify
    if v.kind != "quest":
        return vs
    count = -(-(spec.depth + 1) // v.page_size)
    mins, maxs = selection.update_pages(vs.mins, vs.maxs, cache.k, base // v.page_size, count=count,
                                        page=v.page_size)
    return vs.replace(mins=mins, maxs=maxs)
