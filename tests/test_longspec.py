"""LongSpec (jspec/speculative/longspec.py, tree.py): trained-drafter chain and tree drafts, tree verification.

- greedy output is token-identical to plain greedy decoding, chain and tree modes, a ragged batch with a
  stop token, for a random drafter (mostly rejected drafts) and a good one (deep trees accepted);
- compaction: after decoding, the target cache equals plain decoding's and the drafter's ring equals a
  fresh fill from the emitted sequence;
- sampling: the tree rule (recursive rejection over drafts sampled from q) emits the target distribution
  (chi-square on hand-built p and q over whole 3-token sequences, with a negative control: the public
  top-k-then-p/q rule fails the same test), and whole engine rounds on a tiny model do too;
- the real SmolLM2 (slow): greedy identity in float32 with a random drafter and, when it has been committed,
  the trained one.

Two tiny targets share one config (so every jitted function compiles once per mode): "plain" random weights
with a random drafter, and "local", whose layers are damped so the next token depends mostly on the current
one; a drafter with a zero block (logits = head(norm(embed(token)))) then predicts it well (its self-attention K/V
projections are random, but with a zero output projection they change nothing but the ring's entries).
"""
import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from conftest import damped
from jspec import prefill as gen
from jspec import kv_cache, model, sampling, speculative
from jspec.config import ModelConfig, RopeScaling, SamplingConfig
from jspec.drafter import drafter_fill, init_drafter_params, load_drafter
from jspec.speculative import SpecConfig
from jspec.speculative import lookup as lookup_lib
from jspec.speculative import tree as tree_lib
from reference_decode import decode as plain_decode

GREEDY = SamplingConfig()
NEW = 20
CAPACITY = 96
PROMPT_LENGTHS = (3, 29, 17)
WINDOW = 8
SPECS = {"chain": SpecConfig("longspec", mode="chain", gamma=3, window=WINDOW),
         "tree": SpecConfig("longspec", tree_widths=(2, 4, 3), window=WINDOW),
         "lookup": SpecConfig("longspec", tree_widths=(2, 4, 3), window=WINDOW, lookup=5)}
DRAFTER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "checkpoints", "drafters", "smollm2-135m")


def tiny(**kw):
    base = dict(arch="llama", vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                ffn_dim=96, rope_theta=10000.0, rope_scaling=RopeScaling(factor=8.0, original_max_position=32),
                dtype="float32", max_position=256)
    return ModelConfig(**{**base, **kw})


@functools.lru_cache(maxsize=None)
def setup(kind):
    """Target, drafter, prompts, the plain-decoding reference (stop token applied) and its cache."""
    cfg = tiny()
    params = model.init_params(cfg, jax.random.key(1), scale=0.3)
    if kind == "local":
        params = damped(params, 0.006)
        drafter = init_drafter_params(cfg, jax.random.key(2), target_params=params, scale=0.0)
        # Self-attention K/V projections that are not zero (its output projection stays zero, so the drafts
        # do not change): the ring check in test_compaction_leaves_plain_decodings_cache then sees real K/V.
        kk, kv = jax.random.split(jax.random.key(3))
        drafter = dict(drafter, wk=0.3 * jax.random.normal(kk, drafter["wk"].shape, drafter["wk"].dtype),
                       wv=0.3 * jax.random.normal(kv, drafter["wv"].shape, drafter["wv"].dtype))
    else:
        drafter = init_drafter_params(cfg, jax.random.key(2), target_params=params, scale=0.3)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(4, cfg.vocab_size, n).tolist() for n in PROMPT_LENGTHS]
    tokens, lengths = gen.pad_prompts(prompts, multiple=32)
    tokens, lengths = jnp.asarray(tokens), jnp.asarray(lengths)
    cache = kv_cache.init(cfg, batch=len(prompts), capacity=CAPACITY)
    logits, cache = gen.prefill(params, cfg, tokens, lengths, cache)
    free, _, ar_cache = plain_decode(params, cfg, GREEDY, cache, logits, jax.random.key(0), max_new_tokens=NEW)
    free = np.asarray(free)
    # A stop token that row 0 emits early and some other row never does: one row stops, another runs to NEW.
    stop = next(int(t) for t in free[0, 1:10] if any(t not in row for row in free[1:]))
    ref = [row[:row.index(stop) + 1] if stop in row else row for row in free.tolist()]
    return dict(cfg=cfg, params=params, drafter=drafter, prompts=prompts, tokens=tokens, lengths=lengths,
                stop=stop, ref=ref, free=free, ar_cache=ar_cache)


def run_longspec(s, spec, *, stops=(), samp=GREEDY, key=0, new=NEW):
    state = speculative.init(s["params"], s["cfg"], spec, s["tokens"], s["lengths"], CAPACITY, drafter=s["drafter"])
    out, n_out, st, final = speculative.run_donating(s["params"], s["cfg"], spec, samp, state, jax.random.key(key),
                                                     new, stop_tokens=stops, drafter=s["drafter"])
    out, n_out = np.asarray(out), np.asarray(n_out)
    return [out[b, :n_out[b]].tolist() for b in range(len(n_out))], out, st, final


@pytest.mark.parametrize("kind", ["plain", "local"])
@pytest.mark.parametrize("mode", list(SPECS))
def test_greedy_identical_to_plain_decoding(mode, kind):
    s = setup(kind)
    spec = SPECS[mode]
    got, out, st, _ = run_longspec(s, spec, stops=(s["stop"],))
    assert got == s["ref"]
    assert all((out[b, len(g):] == -1).all() for b, g in enumerate(got))
    assert any(len(r) < NEW for r in s["ref"]) and any(len(r) == NEW for r in s["ref"])
    hist = np.asarray(st.accept_hist)
    assert hist.shape == (3, spec.depth + 1) and (np.asarray(st.rounds) == hist.sum(1)).all()
    if kind == "plain":
        assert st.tau() < 1.5                                   # a random drafter: mostly rejected
    else:
        assert st.tau() > 1.4 and hist[:, 2:].sum() >= 2, hist  # deep paths accepted: compaction exercised
    if kind == "local" and spec.lookup:   # the damped target's greedy loops: the chain goes past the tree's depth
        assert hist[:, len(spec.widths) + 1:].sum() >= 1, hist   # (which nothing else can accept)


def test_finished_rows_stop_reading_their_caches(monkeypatch):
    """A round with row 1 done: the drafter's cross-attention and the tree verification let that row read at
    most the tree's slots (it reads its whole context when live), the live rows as much as before."""
    from conftest import spy_attention_reads
    from jspec.speculative import engine
    s, spec = setup("plain"), SPECS["tree"]
    state = speculative.init(s["params"], s["cfg"], spec, s["tokens"], s["lengths"], CAPACITY, drafter=s["drafter"])
    st = engine.start(spec, GREEDY, state, jax.random.key(0), NEW)
    reads = spy_attention_reads(monkeypatch)
    got, T = {}, 1 + sum(spec.widths)
    for done in ([False, False, False], [False, True, False]):
        reads.clear()
        with jax.disable_jit():
            engine.round_(s["params"], s["cfg"], spec, GREEDY, st.replace(done=jnp.array(done)), NEW, (),
                          drafter=s["drafter"], impl=engine.AttnImpl())
        assert len(reads) == len(spec.widths) + s["cfg"].n_layers   # a cross-attention per drafter step, verification
        got[done[1]] = np.stack([n for _, n in reads])
    np.testing.assert_array_equal(got[True][:, [0, 2]], got[False][:, [0, 2]])
    assert (got[True][:, 1] <= T).all() and (got[False][:, 1] > T).all(), got


@pytest.mark.parametrize("mode", ["tree", "lookup"])
def test_compaction_leaves_plain_decodings_cache(mode):
    """After decoding with deep tree acceptances, every cached target slot equals plain decoding's (same tokens,
    same positions; the last round may overshoot NEW by up to depth tokens, so plain decoding runs further)
    and the drafter's ring equals a fresh fill from prompt + emitted tokens (with lookup: so does its record
    of the tokens by slot)."""
    s = setup("local")
    spec = SPECS[mode]
    got, out, st, final = run_longspec(s, spec)
    assert got == s["free"].tolist()
    hist = np.asarray(st.accept_hist).sum(0)
    assert hist[2:].sum() >= 3, hist
    longer = NEW + spec.depth + 1
    cache = kv_cache.init(s["cfg"], batch=3, capacity=CAPACITY)
    logits, cache = gen.prefill(s["params"], s["cfg"], s["tokens"], s["lengths"], cache)
    free, _, ar_cache = plain_decode(s["params"], s["cfg"], GREEDY, cache, logits, jax.random.key(0),
                                     max_new_tokens=longer)
    lens = np.asarray(final.cache.lengths)
    assert (lens > np.asarray(s["lengths"]) + NEW - 2).all() and (lens <= np.asarray(ar_cache.lengths)).all()
    for b in range(3):
        n = int(lens[b])
        np.testing.assert_allclose(final.cache.k[:, b, :n], ar_cache.k[:, b, :n], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(final.cache.v[:, b, :n], ar_cache.v[:, b, :n], rtol=1e-4, atol=1e-5)

    # The ring: positions lens-W .. lens-1 of prompt + emitted, with the K/V a fill from scratch computes.
    ring = final.method.dcache
    np.testing.assert_array_equal(ring.lengths, lens)
    seqs = [p + np.asarray(free)[b, :lens[b] - len(p)].tolist() for b, p in enumerate(s["prompts"])]
    toks, seq_lens = gen.pad_prompts(seqs, multiple=32)
    np.testing.assert_array_equal(seq_lens, lens)
    fresh = jax.jit(drafter_fill, static_argnames=("cfg", "window"))(
        s["drafter"], s["params"], s["cfg"], jnp.asarray(toks), jnp.asarray(seq_lens), window=WINDOW)
    for b in range(3):
        order, fresh_order = np.argsort(np.asarray(ring.pos[b])), np.argsort(np.asarray(fresh.pos[b]))
        np.testing.assert_array_equal(np.asarray(ring.pos[b])[order], np.arange(lens[b] - WINDOW, lens[b]))
        np.testing.assert_array_equal(np.asarray(fresh.pos[b])[fresh_order], np.asarray(ring.pos[b])[order])
        np.testing.assert_allclose(ring.k[b][order], fresh.k[b][fresh_order], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ring.v[b][order], fresh.v[b][fresh_order], rtol=1e-5, atol=1e-6)
    if mode == "lookup":
        for b in range(3):
            np.testing.assert_array_equal(np.asarray(final.method.tokens[b, :lens[b]]), seqs[b])


@pytest.mark.parametrize("V,k,chunk", [(49152, 16, 1024), (49152, 16, 0), (5000, 4, 256), (3001, 16, 128),
                                        (700, 16, 256)])
def test_top_k_chunked_equals_top_k(V, k, chunk):
    from jspec.speculative.tree import top_k_chunked

    rng = np.random.default_rng(V + k)
    x = rng.standard_normal((3, 2, V)).astype(np.float32)
    x[0, 0, rng.integers(0, V, 40)] = 2.5                   # ties across slices: lower index must win
    x[1, 1, :] = np.round(x[1, 1, :])                       # many ties
    x[2, 0, : V // 2] = -np.inf                             # masked entries
    want_v, want_i = jax.lax.top_k(jnp.asarray(x), k)
    got_v, got_i = top_k_chunked(jnp.asarray(x), k, chunk=chunk)
    np.testing.assert_array_equal(np.asarray(got_v), np.asarray(want_v))
    np.testing.assert_array_equal(np.asarray(got_i), np.asarray(want_i))


@pytest.mark.parametrize("V,k", [(49152, 2), (700, 4), (5, 4), (3, 3)])
def test_top_k_small_equals_top_k(V, k):
    from jspec.speculative.tree import top_k_small

    rng = np.random.default_rng(V + k)
    x = rng.standard_normal((4, 3, V)).astype(np.float32)
    x[0, 0, rng.integers(0, V, 3)] = 9.0                    # a tie at the top: lower index first
    x[1, 1, :] = np.round(x[1, 1, :])                       # many ties
    x[2, 0, :] = -np.inf                                    # a fully masked row: indices 0, 1, ... as lax.top_k
    x[2, 1, 1:] = -np.inf                                   # one finite entry, then masked ones
    x[3, 2, :] = -0.0                                       # signed zeros tie with each other
    x[3, 2, V // 2] = 0.0
    want_v, want_i = jax.lax.top_k(jnp.asarray(x), k)
    got_v, got_i = jax.jit(top_k_small, static_argnums=1)(jnp.asarray(x), k)
    np.testing.assert_array_equal(np.asarray(got_v), np.asarray(want_v))
    np.testing.assert_array_equal(np.asarray(got_i), np.asarray(want_i))


def test_tree_layout_and_greedy_growth():
    """Static layout, parents / ancestor masks of a grown tree, and the global top-w rule by cumulative log q."""
    widths = (2, 3)
    assert tree_lib.level_offsets(widths) == (0, 1, 3, 6) and tree_lib.depths(widths).tolist() == [0, 1, 1, 2, 2, 2]
    V = 6
    lq0 = np.log(np.array([0.05, 0.5, 0.05, 0.3, 0.05, 0.05]))
    lq1 = {1: np.log(np.array([0.9, 0.02, 0.02, 0.02, 0.02, 0.02])),     # after token 1: one sure child
           3: np.log(np.array([0.02, 0.02, 0.4, 0.02, 0.5, 0.04]))}      # after token 3: two likely ones

    def run_level(state, lvl, idx, tree):
        if lvl == 0:
            return jnp.asarray(lq0)[None, None], state
        return jnp.stack([jnp.asarray(np.stack([lq1[int(t)] for t in np.asarray(tree.tokens[0, idx])]))]), state

    tree, q, _ = tree_lib.grow(widths, GREEDY, jax.random.key(0), jnp.array([7]), run_level, None)
    assert q is None
    assert np.asarray(tree.tokens[0]).tolist() == [7, 1, 3, 0, 4, 2]
    # cumulative: (1,0) .5*.9=.45, (3,4) .3*.5=.15, (3,2) .3*.4=.12, next best (1, x) .5*.02=.01
    assert np.asarray(tree.parent[0]).tolist() == [-1, 0, 0, 1, 2, 2]
    anc = np.asarray(tree.mask[0]).astype(int)
    assert anc.tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0],
                            [1, 1, 0, 1, 0, 0], [1, 0, 1, 0, 1, 0], [1, 0, 1, 0, 0, 1]]
    # Greedy acceptance: target argmax 3 at the root, 2 after 3, 5 after (3, 2): accept node 5 (depth 2), bonus 5.
    tl = np.zeros((1, 6, V), np.float32)
    tl[0, 0, 3] = tl[0, 2, 2] = tl[0, 5, 5] = tl[0, 1, 0] = 1.0
    best, n, nxt = tree_lib.accept_greedy(widths, tree, jnp.asarray(tl))
    assert (int(best[0]), int(n[0]), int(nxt[0])) == (5, 2, 5)
    assert np.asarray(tree_lib.path(widths, tree, best))[0].tolist() == [2, 5]


def _lookup_reference(seq, n, count, max_n=lookup_lib.MAX_NGRAM):
    """jspec.speculative.lookup's rule, written out: latest earlier occurrence of the longest suffix."""
    s, start = list(seq[:n]), None
    for m in range(max_n, 0, -1):
        for t in range(n - m - 1, -1, -1):
            if s[t:t + m] == s[n - m:]:
                start = t + m
                break
        if start is not None:
            break
    start = n - 1 if start is None else start
    out = []
    for k in range(count):
        i = start + k
        out.append(s[i] if i < n else out[i - n])
    return out


def test_lookup_proposals_follow_the_rule():
    """Random rows over small vocabularies (many repeats, some none), ragged lengths, junk past each length."""
    rng = np.random.default_rng(0)
    C, count = 40, 6
    for vocab in (2, 3, 5, 50):
        seq = rng.integers(0, vocab, (16, C)).astype(np.int32)
        n = rng.integers(1, C + 1, 16).astype(np.int32)
        got = np.asarray(jax.jit(lookup_lib.propose, static_argnums=2)(jnp.asarray(seq), jnp.asarray(n), count))
        for b in range(16):
            assert got[b].tolist() == _lookup_reference(seq[b], int(n[b]), count), (vocab, b, seq[b, :n[b]])
    # Hand-checked: "5 6 7 8 5 6 7" -> after the earlier "5 6 7" came 8, then 5 6 7 continues the proposal.
    row = jnp.array([[5, 6, 7, 8, 5, 6, 7, 0, 0]], jnp.int32)
    assert np.asarray(lookup_lib.propose(row, jnp.array([7]), 5)).tolist() == [[8, 5, 6, 7, 8]]
    # No earlier occurrence of the newest token: it is repeated.
    assert np.asarray(lookup_lib.propose(row, jnp.array([4]), 3)).tolist() == [[8, 8, 8]]


def test_root_chain_is_accepted_past_the_tree():
    """A tree of widths (2,) plus a root chain of 3 (`add_chain`): masks, depths, and greedy acceptance of the
    chain's whole depth when the target agrees with it, or of the tree's node when it agrees with that."""
    widths = (2,)
    base = tree_lib.DraftTree(tokens=jnp.array([[7, 1, 3]]), parent=jnp.array([[-1, 0, 0]]),
                              mask=jnp.asarray(np.array([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], bool)))
    tree = tree_lib.add_chain(base, jnp.array([[3, 4, 5]]))
    assert np.asarray(tree.tokens[0]).tolist() == [7, 1, 3, 3, 4, 5]
    assert np.asarray(tree.parent[0]).tolist() == [-1, 0, 0, 0, 3, 4]
    assert tree_lib.node_depths(widths, 3).tolist() == [0, 1, 1, 1, 2, 3]
    assert np.asarray(tree.mask[0]).astype(int).tolist() == [
        [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0], [1, 0, 0, 1, 1, 0], [1, 0, 0, 1, 1, 1]]
    V = 8
    tl = np.zeros((1, 6, V), np.float32)
    tl[0, 0, 3] = tl[0, 3, 4] = tl[0, 4, 5] = tl[0, 5, 6] = 1.0   # the target continues 3 4 5, then 6
    tl[0, 2, 0] = 1.0
    best, n, nxt = tree_lib.accept_greedy(widths, tree, jnp.asarray(tl), chain=3)
    assert (int(best[0]), int(n[0]), int(nxt[0])) == (5, 3, 6)
    assert np.asarray(tree_lib.path(widths, tree, best, chain=3))[0].tolist() == [3, 4, 5]
    tl[0, 3, 4], tl[0, 3, 2] = 0.0, 1.0                           # now the chain fails at depth 2: the tree's
    tl[0, 2, 2] = 2.0                                             # node 2 (token 3) wins the depth-1 tie
    best, n, nxt = tree_lib.accept_greedy(widths, tree, jnp.asarray(tl), chain=3)
    assert int(n[0]) == 1 and int(best[0]) in (2, 3)


# --- sampling: chi-square ---------------------------------------------------------------------------------

def _tables(V=5, seed=0):
    """Hand-built p and q up to depth 2 with zeros on both sides (q drafts tokens p forbids and vice versa)."""
    rng = np.random.default_rng(seed)

    def dist(*shape, zero_frac=0.25):
        x = rng.gamma(0.7, size=shape + (V,))
        x = np.where(rng.random(x.shape) < zero_frac, 0.0, x)
        x[..., 0] += 0.05                                        # every row keeps some mass
        return x / x.sum(-1, keepdims=True)

    return dict(p0=dist(), q0=dist(), p1=dist(V), q1=dist(V), p2=dist(V, V))


def _table_tree(t, widths, samp, key, N, chain=None):
    """Grow a tree whose draft logits are looked up by path, and the target logits at every node; `chain`
    int32[N, G]: a root chain appended (`add_chain`)."""
    lg = lambda x: jnp.log(jnp.asarray(x, jnp.float32))

    def run_level(state, lvl, idx, tree):
        if lvl == 0:
            return jnp.broadcast_to(lg(t["q0"]), (N, 1, t["q0"].size)), state
        return lg(t["q1"])[tree.tokens[:, idx]], state

    tr, q, _ = tree_lib.grow(widths, samp, key, jnp.zeros((N,), jnp.int32), run_level, None)
    dep = tree_lib.depths(widths)
    if chain is not None:
        tr = tree_lib.add_chain(tr, chain)
        dep = tree_lib.node_depths(widths, chain.shape[1])
    par_tok = jnp.take_along_axis(tr.tokens, jnp.maximum(tr.parent, 0), axis=1)
    tl = jnp.where((dep == 0)[None, :, None], lg(t["p0"])[None, None],
                   jnp.where((dep == 1)[None, :, None], lg(t["p1"])[tr.tokens], lg(t["p2"])[par_tok, tr.tokens]))
    return tr, q, tl


def _three_tokens(t, path_tokens, n_acc, nxt, seed):
    """Complete each round's output to 3 tokens by exact sampling from p (what the next rounds would do)."""
    N = n_acc.shape[0]
    rng = np.random.default_rng(seed)
    seq = np.zeros((N, 3), np.int64)
    for i in range(N):
        emitted = list(path_tokens[i, :n_acc[i]]) + [nxt[i]]
        seq[i, :len(emitted)] = emitted[:3]
    V = t["p0"].size
    for pos in range(1, 3):       # rows that emitted only `pos` tokens draw the rest from the target
        need = n_acc + 1 <= pos
        probs = t["p1"][seq[:, 0]] if pos == 1 else t["p2"][seq[:, 0], seq[:, 1]]
        u = rng.random(N)[:, None]
        draw = np.minimum((u > np.cumsum(probs, -1)).sum(-1), V - 1)
        seq[:, pos] = np.where(need, draw, seq[:, pos])
    return seq


def _chisquare(t, seq):
    V = t["p0"].size
    want = (t["p0"][:, None, None] * t["p1"][:, :, None] * t["p2"]).reshape(-1)
    counts = np.bincount(seq[:, 0] * V * V + seq[:, 1] * V + seq[:, 2], minlength=V ** 3)
    keep = want * len(seq) >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(want[keep], want[~keep].sum()) * len(seq)
    obs, exp = obs[exp > 0], exp[exp > 0]
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue, counts[want == 0].sum()


SAMP = SamplingConfig(temperature=1.0)


@functools.partial(jax.jit, static_argnames=("widths", "negative", "N", "chain"))
def _hand_built_round(t, key, widths, negative, N, chain=0):
    k_grow, k_acc = jax.random.split(key)
    if chain:   # a root chain of fixed tokens per row (drawn apart from the round's randomness, as lookup's are)
        toks = jax.random.randint(jax.random.key(99), (N, chain), 0, t["p0"].size)
        tr, q, tl = _table_tree(t, widths, SAMP, k_grow, N, chain=toks)
        best, n_acc, nxt = tree_lib.accept_sampled(widths, tr, q, tl, SAMP, k_acc, chain=chain)
        path = tree_lib.path(widths, tr, best, chain=chain)
        return jnp.take_along_axis(tr.tokens, path, axis=1), n_acc, nxt
    if negative:   # the public rule: top-k drafts by q (deterministic, distinct), then the same p/q tests
        tr, _, tl = _table_tree(t, widths, GREEDY, k_grow, N)
        dep = tree_lib.depths(widths)
        q_tok = jnp.where((dep == 0)[None, :, None], jnp.asarray(t["q0"], jnp.float32)[None, None],
                          jnp.asarray(t["q1"], jnp.float32)[tr.tokens])
        q = q_tok[:, :1 + widths[0]]
    else:
        tr, q, tl = _table_tree(t, widths, SAMP, k_grow, N)
    best, n_acc, nxt = tree_lib.accept_sampled(widths, tr, q, tl, SAMP, k_acc)
    path = tree_lib.path(widths, tr, best)
    return jnp.take_along_axis(tr.tokens, path, axis=1), n_acc, nxt


@pytest.mark.parametrize("negative,chain", [(False, 0), (True, 0), (False, 2)])
def test_tree_rejection_sampling_emits_the_target_distribution(negative, chain):
    """3-token sequences from one round (completed exactly) follow p0(a) p1(b|a) p2(c|a,b): chi-square over all
    V^3 cells. Widths (3, 4): 3 i.i.d. root children (duplicates included, V = 5), 4 grandchildren shared
    unevenly (2, 1, 1) by score. The negative control (top-k drafts + p/q test) must fail. chain=2: plus a root
    chain of two fixed tokens per row (prompt lookup's drafts under sampling: point-mass proposals)."""
    t = _tables()
    N = 60_000
    path_tokens, n_acc, nxt = _hand_built_round({k: jnp.asarray(v, jnp.float32) for k, v in t.items()},
                                                jax.random.key(3), (3, 4), negative, N, chain)
    n_acc, nxt = np.asarray(n_acc), np.asarray(nxt)
    seq = _three_tokens(t, np.asarray(path_tokens), n_acc, nxt, seed=1)
    pvalue, forbidden = _chisquare(t, seq)
    hist = np.bincount(n_acc, minlength=3)
    if negative:
        assert pvalue < 1e-6, pvalue
    else:
        assert hist.min() > 0.05 * N, hist                     # rejections and deep acceptances both happen
        assert forbidden == 0
        assert pvalue > 1e-3, pvalue


@pytest.mark.parametrize("broken", [False, True])
def test_chain_point_mass_draft_keeps_the_target_distribution(broken):
    """One root child sampled from a peaked q, then a chain child with a fixed token (a point-mass draft): the
    first emitted token follows p. Here the residual left after the sampled child's rejection is spread, so
    the chain's rule matters. broken: the executed negative control, accept_sampled with the rejected chain
    token left in the residual (tests/test_sampling_power.py's mutant m4), which emits token 1 with
    probability 0.39 instead of 0.25: rejected."""
    from test_sampling_power import point_mass_kept_tree
    accept = point_mass_kept_tree() if broken else tree_lib.accept_sampled
    N, V = 200_000, 5
    p0 = np.array([0.3, 0.25, 0.2, 0.15, 0.1])
    q0 = np.array([0.9, 0.025, 0.025, 0.025, 0.025])

    @jax.jit
    def one_round(key):
        k_grow, k_acc = jax.random.split(key)
        run_level = lambda state, lvl, idx, tree: (jnp.broadcast_to(jnp.log(jnp.asarray(q0, jnp.float32)),
                                                                    (N, 1, V)), state)
        tr, q, _ = tree_lib.grow((1,), SAMP, k_grow, jnp.zeros((N,), jnp.int32), run_level, None)
        tr = tree_lib.add_chain(tr, jnp.full((N, 1), 1, jnp.int32))
        logits = jnp.broadcast_to(jnp.log(jnp.asarray(p0, jnp.float32)), (N, 3, V))
        best, n, nxt = accept((1,), tr, q, logits, SAMP, k_acc, chain=1)
        return jnp.where(n > 0, jnp.take_along_axis(tr.tokens, best[:, None], axis=1)[:, 0], nxt), best

    first, best = map(np.asarray, one_round(jax.random.key(1)))
    assert (best == 2).mean() > 0.1 and (best == 1).mean() > 0.1          # both drafts accepted at times
    counts = np.bincount(first, minlength=V)
    pvalue = stats.chisquare(counts, p0 * N).pvalue
    if broken:
        assert pvalue < 1e-6 and counts[1] / N > 0.35, counts / N
    else:
        assert pvalue > 1e-3, counts / N


@pytest.mark.parametrize("lookup", [0, 3])
def test_sampled_engine_rounds_follow_the_target_distribution(lookup):
    """Whole engine rounds, tree mode, a tiny model: the 2nd and 3rd emitted tokens (the first round's output
    and what follows it) have the target's marginals, computed exactly by enumeration; lookup=3: with a
    prompt-lookup chain of 3 beside the tree (accepted past the tree's depth in some rounds).
    Marginals only: the joint law with the all-accepted bonus token observed, and negative controls, are in
    tests/test_sampling_engine.py and tests/test_sampling_power.py."""
    cfg = tiny(vocab_size=16, d_model=32, ffn_dim=48, rope_scaling=None)
    params = damped(model.init_params(cfg, jax.random.key(3), scale=0.6), 0.01)
    drafter = init_drafter_params(cfg, jax.random.key(4), target_params=params, scale=0.0)
    samp = SamplingConfig(temperature=0.9, top_k=12)
    N = 8000
    P = 12
    prompt = np.random.default_rng(7).integers(0, 16, P)
    tokens = jnp.asarray(np.tile(prompt, (N, 1)), jnp.int32)
    lengths = jnp.full((N,), P, jnp.int32)
    spec = SpecConfig("longspec", tree_widths=(2, 3), window=WINDOW, lookup=lookup)
    state = speculative.init(params, cfg, spec, tokens, lengths, 24 + lookup, drafter=drafter)
    out, _, st = speculative.run(params, cfg, spec, samp, state, jax.random.key(11), 3, drafter=drafter)
    out = np.asarray(out)
    hist = np.asarray(st.accept_hist).sum(0)
    assert hist[0] > 0.05 * hist.sum() and hist[1:].sum() > 0.2 * hist.sum(), hist
    if lookup:
        assert hist[3:].sum() > 0, hist   # only the chain reaches depth 3

    V = cfg.vocab_size
    seqs = np.concatenate([np.tile(prompt, (V * V, 1)), np.repeat(np.arange(V), V)[:, None],
                           np.tile(np.arange(V), V)[:, None]], 1)
    cache = kv_cache.init(cfg, batch=V * V, capacity=seqs.shape[1])
    logits = jax.jit(model.forward, static_argnums=1)(params, cfg, jnp.asarray(seqs, jnp.int32), cache)[0]
    p = np.asarray(sampling.process_logits(logits[:, -3:], samp), np.float64)
    p0, p1, p2 = p[0, 0], p[::V, 1], p[:, 2].reshape(V, V, V)
    for pos, m in ((1, p0 @ p1), (2, np.einsum("a,ab,abc->c", p0, p1, p2))):
        counts = np.bincount(out[:, pos], minlength=V)
        assert counts[m == 0].sum() == 0
        keep = m * N >= 5
        obs = np.append(counts[keep], counts[~keep].sum())
        exp = np.append(m[keep], m[~keep].sum()) * N
        obs, exp = obs[exp > 0], exp[exp > 0]
        assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3, (pos, obs, exp.round(1))


# --- API ------------------------------------------------------------------------------------------------

def test_config_and_missing_drafter():
    spec = SpecConfig("longspec", tree_widths=[4, 16, 16, 16, 16])
    assert spec.options.tree_widths == (4, 16, 16, 16, 16) and spec.depth == 5 and spec.capacity_margin() == 69
    chain = SpecConfig("longspec", mode="chain", gamma=6)
    assert chain.widths == (1,) * 6 and chain.capacity_margin() == 7
    assert SpecConfig("vegas", gamma=4).capacity_margin() == 5 and SpecConfig("vegas", gamma=4).depth == 4
    with pytest.raises(ValueError, match="mode="):
        SpecConfig("longspec", mode="forest")
    with pytest.raises(ValueError, match="window"):
        SpecConfig("longspec", tree_widths=(1,) * 8, window=8)
    look = SpecConfig("longspec", tree_widths=(2, 4), lookup=5)
    assert look.depth == 5 and look.capacity_margin() == 1 + 6 + 5 and look.widths == (2, 4)
    with pytest.raises(ValueError, match="lookup=-1"):
        SpecConfig("longspec", lookup=-1)
    s = setup("plain")
    with pytest.raises(ValueError, match="drafter"):
        speculative.init(s["params"], s["cfg"], SPECS["chain"], s["tokens"], s["lengths"], CAPACITY)


# --- the real model (slow) --------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("which", ["random", "trained", "trained-lookup"])
def test_real_model_f32_greedy_identical(smollm2_ckpt, which):
    """SmolLM2-135M in float32, a ragged batch of ~300 / ~500-token stdlib prompts, 32 new tokens, the default
    tree (4, 16, 16, 16, 16) (and with a lookup chain of 6): token-identical to plain greedy decoding."""
    from jspec import checkpoints
    from transformers import AutoTokenizer

    from jspec import data

    params, cfg = checkpoints.load(smollm2_ckpt)
    cfg = dataclasses.replace(cfg, dtype="float32")
    params = model.fuse_projections(jax.tree.map(lambda x: x.astype(jnp.float32), params), cfg)   # as jspec.load
    if which != "random":
        d = load_drafter(DRAFTER_DIR, dtype="float32")
        drafter, window = d.params, d.window
    else:
        drafter, window = init_drafter_params(cfg, jax.random.key(0), target_params=params), 512
    tok = AutoTokenizer.from_pretrained(os.path.join(smollm2_ckpt, "tokenizer"))
    prompts = [data.long_prompts(tok, 300, 1, sources=("inspect",))[0],
               data.long_prompts(tok, 500, 1, sources=("typing",))[0]]
    tokens, lengths = gen.pad_prompts(prompts, multiple=512)
    tokens, lengths = jnp.asarray(tokens), jnp.asarray(lengths)
    new, capacity = 32, 640
    cache = kv_cache.init(cfg, batch=2, capacity=capacity)
    logits, cache = gen.prefill(params, cfg, tokens, lengths, cache)
    ref = np.asarray(plain_decode(params, cfg, GREEDY, cache, logits, jax.random.key(0), max_new_tokens=new)[0])
    spec = SpecConfig("longspec", window=window, lookup=6 if which == "trained-lookup" else 0)
    state = speculative.init(params, cfg, spec, tokens, lengths, capacity, drafter=drafter)
    out, n_out, st, _ = speculative.run_donating(params, cfg, spec, GREEDY, state, jax.random.key(0), new,
                                                 drafter=drafter)
    np.testing.assert_array_equal(np.asarray(out), ref)
    print(f"{which} drafter: tau {st.tau():.2f}, accepted-length histogram {np.asarray(st.accept_hist).sum(0)}")
    if which != "random":
        assert st.tau() > 1.5          # a trained drafter on real text: catches a broken inference path


@pytest.mark.parametrize("impl", ["xla", "pallas-interpret"])
def test_cross_attention_folds_nodes_into_heads(impl):
    """The drafter's cross-attention through `attention.full` (T nodes folded into the head axis, kv_len =
    lengths) equals its own masked attention over the target's last layer, on the XLA path and the kernel."""
    from jspec.attention import AttnImpl
    from jspec.drafter import attend
    from jspec.speculative import longspec

    cfg = tiny(n_layers=3, head_dim=64)          # a head size the kernels support
    B, S, T = 2, 40, 5
    ks = jax.random.split(jax.random.key(0), 3)
    k = jax.random.normal(ks[0], (cfg.n_layers, B, S, cfg.n_kv_heads, cfg.head_dim))
    v = jax.random.normal(ks[1], (cfg.n_layers, B, S, cfg.n_kv_heads, cfg.head_dim))
    q = jax.random.normal(ks[2], (B, T, cfg.n_heads, cfg.head_dim))
    lengths = jnp.array([17, 33], jnp.int32)
    cache = kv_cache.KVCache(k=k, v=v.at[:, :, 35:].set(1e4), lengths=lengths)   # junk past the lengths
    a = AttnImpl(backend="xla") if impl == "xla" else AttnImpl(backend="pallas", interpret=True)
    got = jax.jit(lambda q, c: longspec.cross_attention(cfg, c, a)(q))(q, cache)
    vis = jnp.arange(S)[None, None, :] < lengths[:, None, None]
    want = attend(q, k[-1], v[-1], vis)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
