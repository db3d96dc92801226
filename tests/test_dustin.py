"""jspec.dustin: I_verify selection against a brute-force numpy reference, ARR and softmax_weights."""
import json
import math

import numpy as np
import pytest

from jspec.dustin import attention_recovery, select_verify, softmax_weights


def ref_select(draft, target, lengths, budget, sink=4, window=64, m=None, page=1):
    """Brute force, one row at a time with Python sets and sorted(): the list of chosen positions per row."""
    if m is None:
        m = (budget - sink - window) // 2
    P = page
    out = []
    for b in range(len(lengths)):
        L = int(lengths[b])
        if L <= budget:
            out.append(list(range(L)))
            continue
        pages = list(range((L + P - 1) // P))
        slots = {p: [j for j in range(p * P, p * P + P) if j < L] for p in pages}
        touched = lambda lo, hi: {j // P for j in range(max(lo, 0), min(hi, L))}   # noqa: E731
        protected = touched(0, sink) | touched(L - window, L)
        room = budget // P - len(protected)
        rest = [p for p in pages if p not in protected]
        score = lambda s, p: sum(float(s[b, j]) for j in slots[p])                  # noqa: E731
        rank = lambda s, p: (math.isnan(score(s, p)), -score(s, p), p)               # noqa: E731  NaN last
        by_draft = sorted(rest, key=lambda p: rank(draft, p))
        n1 = min(m // P, room)
        tier1 = set(by_draft[:n1])
        by_target = sorted([p for p in rest if p not in tier1], key=lambda p: rank(target, p))
        tier2 = set(by_target[:room - n1])
        chosen = protected | tier1 | tier2
        out.append(sorted(j for p in chosen for j in slots[p]))
    return out


def check(draft, target, lengths, **kw):
    """select_verify (the threshold search) against the brute force, and equal to the sort path."""
    idx, n = select_verify(draft, target, lengths, **kw)
    idx, n = np.asarray(idx), np.asarray(n)
    idx_sort, n_sort = select_verify(draft, target, lengths, method="sort", **kw)
    np.testing.assert_array_equal(np.asarray(idx_sort), idx)
    np.testing.assert_array_equal(np.asarray(n_sort), n)
    assert idx.shape == (len(lengths), kw["budget"]) and idx.dtype == np.int32
    want = ref_select(np.asarray(draft), np.asarray(target), lengths, **kw)
    for b, w in enumerate(want):
        assert n[b] == len(w), (b, n[b], len(w))
        assert idx[b, :n[b]].tolist() == w, b
        assert (idx[b, n[b]:] == 0).all()
    return idx, n


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_scores_ragged(seed):
    rng = np.random.default_rng(seed)
    S, B = 300, 5
    d = rng.standard_normal((B, S)).astype(np.float32)
    t = rng.standard_exponential((B, S)).astype(np.float32)
    lengths = np.array([300, 257, 100, 96, 31], np.int32)    # long, long, over budget, == budget, short
    idx, n = check(d, t, lengths, budget=96, sink=4, window=16, m=30)
    assert n.tolist() == [96, 96, 96, 96, 31]


def test_ties_integer_scores_go_to_the_lower_position():
    rng = np.random.default_rng(3)
    S, B = 200, 4
    d = rng.integers(0, 3, (B, S)).astype(np.float32)
    t = rng.integers(0, 3, (B, S)).astype(np.float32)
    check(d, t, np.array([200, 180, 150, 70], np.int32), budget=48, sink=4, window=8)
    # All-equal scores: the tiers take the lowest free positions.
    z = np.zeros((1, 100), np.float32)
    idx, n = select_verify(z, z, np.array([100]), budget=20, sink=2, window=4, m=6)
    assert np.asarray(idx)[0, :int(n[0])].tolist() == list(range(16)) + [96, 97, 98, 99]


def test_tier_order_draft_then_target():
    """Tier 1 comes from the draft signal, tier 2 from the target signal, excluding tier-1 picks."""
    S = 64
    d = np.zeros((1, S), np.float32)
    t = np.zeros((1, S), np.float32)
    d[0, [10, 20, 30]] = [3, 2, 1]
    t[0, [20, 40, 50, 10]] = [9, 8, 7, 6]
    idx, n = select_verify(d, t, np.array([S]), budget=8, sink=2, window=2, m=2)
    # sink {0,1}, window {62,63}, tier 1 {10, 20} (draft), tier 2 {40, 50} (target, 20 and 10 already taken)
    assert np.asarray(idx)[0].tolist() == [0, 1, 10, 20, 40, 50, 62, 63] and int(n[0]) == 8


@pytest.mark.parametrize("m", [0, 40])
def test_m_extremes_target_only_and_draft_only(m):
    rng = np.random.default_rng(4)
    d = rng.standard_normal((3, 160)).astype(np.float32)
    t = rng.standard_normal((3, 160)).astype(np.float32)
    lengths = np.array([160, 120, 50], np.int32)
    idx, n = check(d, t, lengths, budget=48, sink=4, window=4, m=m)
    # m = 0 ignores the draft signal entirely, m = max ignores the target signal.
    noise = rng.standard_normal((3, 160)).astype(np.float32)
    if m == 0:
        idx2, _ = select_verify(noise, t, lengths, budget=48, sink=4, window=4, m=0)
    else:
        idx2, _ = select_verify(d, noise, lengths, budget=48, sink=4, window=4, m=40)
    np.testing.assert_array_equal(np.asarray(idx2), idx)


def test_dense_when_budget_exceeds_context():
    rng = np.random.default_rng(5)
    d = rng.standard_normal((3, 40)).astype(np.float32)
    idx, n = check(d, d, np.array([40, 17, 0], np.int32), budget=128, sink=4, window=64)
    assert n.tolist() == [40, 17, 0]
    assert np.asarray(idx)[0, :40].tolist() == list(range(40))


def test_sink_window_overlap_short_sequences():
    """Sink and window overlapping each other (short rows) and rows just over the budget."""
    rng = np.random.default_rng(6)
    d = rng.standard_normal((5, 40)).astype(np.float32)
    t = rng.standard_normal((5, 40)).astype(np.float32)
    lengths = np.array([3, 9, 12, 13, 40], np.int32)
    check(d, t, lengths, budget=12, sink=4, window=8, m=0)
    check(d, t, lengths, budget=12, sink=6, window=6)       # free = 0: protected only when sparse
    check(d, t, lengths, budget=10, sink=0, window=0, m=5)  # no protection at all


@pytest.mark.parametrize("seed", [0, 1])
def test_pages_of_8_partial_last_page(seed):
    rng = np.random.default_rng(10 + seed)
    S, B = 260, 5
    d = rng.standard_normal((B, S)).astype(np.float32)
    t = rng.standard_normal((B, S)).astype(np.float32)
    lengths = np.array([260, 251, 203, 97, 64], np.int32)   # partial last pages; S not a multiple of 8 either
    idx, n = check(d, t, lengths, budget=96, sink=4, window=20, m=24, page=8)
    for b in range(B):
        chosen = idx[b, :n[b]]
        assert (chosen < lengths[b]).all()
        full_pages = {j // 8 for j in chosen if (j // 8 + 1) * 8 <= lengths[b]}
        assert all(set(range(p * 8, p * 8 + 8)) <= set(chosen.tolist()) for p in full_pages)
    # page-level ties (integer scores) and m = 0 / m = max
    di = rng.integers(0, 2, (B, S)).astype(np.float32)
    check(di, di[::-1].copy(), lengths, budget=96, sink=4, window=20, m=0, page=8)
    check(di, di[::-1].copy(), lengths, budget=96, sink=4, window=20, m=72, page=8)


def test_invalid_positions_never_selected():
    rng = np.random.default_rng(7)
    S = 128
    d = rng.standard_normal((3, S)).astype(np.float32)
    t = rng.standard_normal((3, S)).astype(np.float32)
    lengths = np.array([100, 77, 45], np.int32)
    for b, L in enumerate(lengths):
        d[b, L:] = 1e30
        t[b, L:] = np.inf
        d[b, L + 1:L + 3] = np.nan
    for page in (1, 8):
        idx, n = check(d, t, lengths, budget=40, sink=4, window=8, page=page)
        for b, L in enumerate(lengths):
            assert (idx[b, :n[b]] < L).all()
    # window = 0: the partial last page competes in the tiers, scored on its valid slots only (77 = 9*8 + 5,
    # 45 = 5*8 + 5), so the junk past lengths must not lift it.
    check(d, t, lengths, budget=40, sink=0, window=0, m=16, page=8)


# Few distinct values (page sums stay exact, so the brute force's float64 sums rank as the f32 ones): ties
# everywhere, signed zeros, infinities and NaNs.
_VALUES = np.array([0.0, -0.0, 0.5, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan], np.float32)


@pytest.mark.parametrize("page", [1, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_ties_nans_ragged_against_brute_force(seed, page):
    rng = np.random.default_rng(100 + seed)
    B, S = 6, 203
    draft = rng.choice(_VALUES, (B, S), p=[.3, .1, .15, .1, .1, .1, .05, .05, .05]).astype(np.float32)
    target = rng.choice(_VALUES[:4], (B, S)).astype(np.float32)
    target[rng.random((B, S)) < 0.1] = np.nan
    for budget, sink, window in ((64, 4, 16), (96, 0, 0), (256, 4, 64)):   # the last: budget > S, all dense
        lengths = rng.integers(0, S + 1, B).astype(np.int32)
        lengths[:3] = [S, 0, min(budget + 1, S)]         # full, empty, just over the budget
        free = budget - sink - window
        # 1 and free - 1: one slot left to the other tier (the static skips of an empty tier must not fire)
        for m in sorted({0, 1, free // 3, free - 1, free}):
            check(draft, target, lengths, budget=budget, sink=sink, window=window, m=m, page=page)


def test_threshold_top_equals_sort_top_for_every_n():
    """_top_select against _top_sort on small rows, for every n from 0 past the row length."""
    import jax

    from jspec.dustin import _top_select, _top_sort
    rng = np.random.default_rng(12)
    R, S = 64, 24
    score = rng.choice(_VALUES, (R, S)).astype(np.float32)
    score[:8] = rng.standard_normal((8, S))                       # distinct values
    cand = rng.random((R, S)) < 0.7
    cand[8:12] = False                                            # no candidates at all
    for n in range(S + 2):
        got = jax.vmap(_top_select, (0, 0, None))(score, cand, n)
        want = jax.vmap(_top_sort, (0, 0, None))(score, cand, n)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"n={n}")
        assert (np.asarray(got).sum(-1) == np.minimum(n, cand.sum(-1))).all()


def test_jit_and_no_recompile_on_new_lengths():
    import jax

    f = jax.jit(lambda d, t, L: select_verify(d, t, L, budget=24, sink=2, window=6))
    rng = np.random.default_rng(8)
    d = rng.standard_normal((2, 64)).astype(np.float32)
    for L in ([64, 30], [50, 10]):
        idx, n = f(d, -d, np.array(L, np.int32))
        want = ref_select(d, -d, L, budget=24, sink=2, window=6)
        assert [np.asarray(idx)[b, :int(n[b])].tolist() for b in range(2)] == want


def test_errors():
    z = np.zeros((1, 32), np.float32)
    L = np.array([32])
    with pytest.raises(ValueError, match="sink \\+ window"):
        select_verify(z, z, L, budget=16, sink=4, window=16)
    with pytest.raises(ValueError, match="multiple of page"):
        select_verify(z, z, L, budget=20, sink=0, window=0, page=8)
    with pytest.raises(ValueError, match=">= 0"):
        select_verify(z, z, L, budget=16, sink=2, window=2, m=-1)
    with pytest.raises(ValueError, match="m=13"):
        select_verify(z, z, L, budget=16, sink=2, window=2, m=13)
    with pytest.raises(ValueError, match="pages"):          # sink page + up to 3 window pages > 24 / 8
        select_verify(z, z, L, budget=24, sink=4, window=16, page=8)
    with pytest.raises(ValueError, match="method"):
        select_verify(z, z, L, budget=16, sink=2, window=2, method="heap")


def test_arr_hand_built_map():
    # B=2, 3 rows, S=10: known masses on known positions.
    w = np.zeros((2, 3, 10), np.float32)
    w[0, 0, [1, 5, 7]] = [0.5, 0.3, 0.2]
    w[0, 1, [1, 2]] = [0.25, 0.75]
    w[0, 2, 9] = 1.0
    w[1] = 0.1
    idx = np.array([[1, 5, 9, 2], [0, 3, 4, 0]], np.int32)   # row 0 selects {1, 5, 9} (slot 3 is padding)
    n = np.array([3, 3], np.int32)
    arr = np.asarray(attention_recovery(w, idx, n))
    np.testing.assert_allclose(arr, [(0.8 + 0.25 + 1.0) / 3, 0.3], rtol=1e-6)
    # Padding entries past n_valid are ignored even if they point at heavy positions.
    np.testing.assert_allclose(np.asarray(attention_recovery(w, idx, np.array([2, 0])))[:1], [(0.8 + .25) / 3])
    assert float(attention_recovery(w, idx, np.array([2, 0]))[1]) == 0.0


def test_arr_is_one_when_everything_valid_is_selected():
    rng = np.random.default_rng(9)
    B, T, N, K, H, S = 3, 4, 6, 2, 8, 40
    q = rng.standard_normal((B, T, N, H)).astype(np.float32)
    k = rng.standard_normal((B, S, K, H)).astype(np.float32)
    lengths = np.array([40, 25, 9], np.int32)
    w = softmax_weights(q, k, lengths)
    d = rng.standard_normal((B, S)).astype(np.float32)
    idx, n = select_verify(d, d, lengths, budget=40, sink=4, window=8)    # dense: lengths <= budget
    np.testing.assert_allclose(np.asarray(attention_recovery(w, idx, n)), 1.0, rtol=1e-5)
    idx, n = select_verify(d, d, lengths, budget=16, sink=4, window=8)    # sparse rows: ARR < 1
    arr = np.asarray(attention_recovery(w, idx, n))
    assert (arr[:2] < 1.0).all() and (arr > 0).all() and arr[2] == pytest.approx(1.0, rel=1e-5)


def test_softmax_weights_against_numpy():
    rng = np.random.default_rng(11)
    B, T, N, K, H, S = 2, 3, 6, 3, 16, 20
    q = rng.standard_normal((B, T, N, H)).astype(np.float32)
    k = rng.standard_normal((B, S, K, H)).astype(np.float32)
    lengths = np.array([20, 7], np.int32)
    got = np.asarray(softmax_weights(q, k, lengths))
    assert got.shape == (B, N, T, S)
    want = np.zeros((B, N, T, S))
    for b in range(B):
        L = lengths[b]
        for n in range(N):
            kv = n // (N // K)
            for t in range(T):
                s = np.array([q[b, t, n] @ k[b, j, kv] for j in range(L)], np.float64) / np.sqrt(H)
                e = np.exp(s - s.max())
                want[b, n, t, :L] = e / e.sum()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)
    assert (got[1, ..., 7:] == 0).all()
    assert (np.asarray(softmax_weights(q, k, np.array([0, 3])))[0] == 0).all()


# ---- profile JSON -------------------------------------------------------------------------------------------

def _tiny_cfg(**kw):
    from jspec.config import ModelConfig
    base = dict(arch="llama", vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64)
    base.update(kw)
    return ModelConfig(**base)


def test_profile_round_trip_and_model_check(tmp_path):
    from jspec.dustin import Profile, model_signature, read_profile, write_profile
    from jspec.errors import InputError
    cfg = _tiny_cfg()
    prof = Profile(model=model_signature(cfg), drafter="self", budget=128, sink=4, window=16, m=40, page=8,
                   target_heads=[(2, 1), (1, 3)], draft_heads=[[0, 0]], dense_layers=[0], arr=0.93,
                   curves={"n_srh": [1, 2], "arr": [0.9, 0.93]})
    path = write_profile(str(tmp_path / "p" / "heads.json"), prof)
    back = read_profile(path, cfg)
    assert back == prof
    assert back.target_heads == ((2, 1), (1, 3)) and back.draft_heads == ((0, 0),)
    with pytest.raises(InputError, match="another model.*n_layers: profile 3, model 4"):
        read_profile(path, _tiny_cfg(n_layers=4))
    with pytest.raises(InputError, match="not found"):
        read_profile(str(tmp_path / "missing.json"))
    bad = json.loads(open(path).read())
    with pytest.raises(InputError, match="not a Dustin profile"):
        read_profile(dict(bad, format="jspec-tune/1"))
    with pytest.raises(InputError, match="unknown field"):
        read_profile(dict(bad, extra=1))
    with pytest.raises(InputError, match="budget"):
        read_profile(dict(bad, budget=10))          # < sink + window
    with pytest.raises(InputError, match="outside the model"):
        read_profile(dict(bad, target_heads=[[3, 0]]), cfg)
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(InputError, match="not readable JSON"):
        read_profile(str(tmp_path / "junk.json"))


# ---- head_weights (the A_T probe) -----------------------------------------------------------------------------

def test_logsumexp_one_pass_against_numpy():
    from jspec.dustin import _logsumexp
    rng = np.random.default_rng(13)
    s = (rng.standard_normal((5, 300)) * 60).astype(np.float32)     # exp would overflow without the running max
    s[1, 100:] = -np.inf
    s[2] = -np.inf
    s[3, ::2] = -np.inf
    got = np.asarray(_logsumexp(s))[:, 0]
    finite = np.isfinite(s)
    mx = np.where(finite, s, -np.inf).max(-1)
    want = np.array([m + np.log(np.exp(r[f].astype(np.float64) - m).sum()) if f.any() else -np.inf
                     for r, f, m in zip(s, finite, mx)])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[2] == -np.inf


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_head_weights_against_numpy(dtype):
    """Both dtypes, large logits, GQA groups with several chosen heads, ragged and empty rows."""
    import jax
    import jax.numpy as jnp

    from jspec.dustin import head_weights
    rng = np.random.default_rng(14)
    B, R, N, K, H, S = 3, 2, 8, 4, 16, 150
    q = jnp.asarray(rng.standard_normal((B, R, N, H)) * 4, dtype)
    k = jnp.asarray(rng.standard_normal((B, S, K, H)) * 4, dtype)
    lengths = np.array([150, 33, 0], np.int32)
    heads = (7, 0, 1, 4)
    got = np.asarray(jax.jit(head_weights, static_argnums=3)(q, k, lengths, heads))
    qn, kn = np.asarray(q, np.float64), np.asarray(k, np.float64)   # the inputs as stored (bf16 values exact)
    want = np.zeros((B, S))
    for b in range(B):
        L = lengths[b]
        for n in heads:
            for r in range(R):
                s = kn[b, :L, n // (N // K)] @ qn[b, r, n] / np.sqrt(H)
                if L:
                    e = np.exp(s - s.max())
                    want[b, :L] += e / e.sum()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert (got[1, 33:] == 0).all() and (got[2] == 0).all()
