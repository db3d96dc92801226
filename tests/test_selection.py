"""KV selection policies (jspec/selection.py) against brute-force NumPy references, fresh random inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec import selection
from jspec.errors import InputError
from jspec.speculative import SpecConfig
from jspec.speculative import vegas


def _valid(idx, n):
    return sorted(np.asarray(idx)[:int(n)].tolist())


def test_streaming_is_sink_plus_recent_window():
    lengths = np.array([3, 10, 11, 40, 1], np.int32)
    k = np.array([10, 10, 10, 10, 10], np.int32)
    idx, n = jax.jit(selection.streaming, static_argnames=("sink", "slots"))(lengths, k, sink=3, slots=12)
    for b, L in enumerate(lengths):
        want = list(range(L)) if L <= 10 else list(range(3)) + list(range(L - 7, L))
        assert int(n[b]) == len(want)
        assert _valid(idx[b], n[b]) == want
        assert (np.asarray(idx[b, int(n[b]):]) == 0).all()


def test_topk_before_matches_numpy_per_layer():
    rng = np.random.default_rng(0)
    L, B, S, M = 3, 4, 50, 8
    scores = rng.standard_normal((L, B, S)).astype(np.float32)
    point = np.array([5, 20, 50, 33], np.int32)
    k = np.array([8, 6, 8, 3], np.int32)
    idx, n = jax.jit(selection.topk_before, static_argnames="slots")(jnp.asarray(scores), point, k, slots=M)
    for l in range(L):
        for b in range(B):
            order = np.argsort(-scores[l, b, :point[b]], kind="stable")
            want = order[:min(k[b], point[b])]
            assert int(n[l, b]) == len(want)
            assert np.asarray(idx[l, b, :len(want)]).tolist() == want.tolist()    # descending score


@pytest.mark.parametrize("method", ["sort", "select"])
def test_topk_pages_before_matches_numpy(method):
    rng = np.random.default_rng(3)
    L, B, S, M, P = 2, 4, 61, 12, 4
    scores = rng.standard_normal((L, B, S)).astype(np.float32)
    point = np.array([5, 22, 61, 3], np.int32)
    k = np.array([12, 9, 12, 12], np.int32)
    fn = jax.jit(selection.topk_pages_before, static_argnames=("slots", "page", "method"))
    idx, n, start = fn(jnp.asarray(scores), point, k, slots=M, page=P, method=method)
    assert np.asarray(start).tolist() == [4, 20, 60, 0]
    for l in range(L):
        for b in range(B):
            full = point[b] // P                                       # pages that end before the point
            sums = scores[l, b, :full * P].reshape(full, P).sum(1)
            pages = np.argsort(-sums, kind="stable")[:min(k[b] // P, full)]
            want = sorted(int(p) * P + j for p in pages for j in range(P))
            assert int(n[l, b]) == len(want)
            assert _valid(idx[l, b], n[l, b]) == want
            assert (np.asarray(idx[l, b, int(n[l, b]):]) == 0).all()
    with pytest.raises(ValueError, match="multiple"):
        selection.topk_pages_before(jnp.asarray(scores), point, k, slots=10, page=P)


def test_with_tail_appends_contiguous_positions_after_the_selection():
    rng = np.random.default_rng(1)
    L, B, M, T = 2, 3, 6, 5
    start = np.array([10, 20, 7], np.int32)
    end = np.array([13, 25, 7], np.int32)
    n = np.array([[6, 2, 0], [4, 6, 1]], np.int32)
    idx = np.stack([np.stack([rng.choice(start[b], M, replace=False) for b in range(B)]) for _ in range(L)])
    out, n_out = selection.with_tail(jnp.asarray(idx, jnp.int32), jnp.asarray(n), start, end, tail_slots=T)
    assert out.shape == (L, B, M + T)
    for l in range(L):
        for b in range(B):
            want = sorted(idx[l, b, :n[l, b]].tolist() + list(range(start[b], end[b])))
            assert int(n_out[l, b]) == len(want)
            assert _valid(out[l, b], n_out[l, b]) == want
            assert len(set(np.asarray(out[l, b, :n_out[l, b]]).tolist())) == len(want)        # no duplicates


def test_quest_page_summaries_scores_and_selection():
    rng = np.random.default_rng(2)
    L, B, S, K, G, H, P = 2, 3, 40, 2, 3, 8, 4
    k_all = rng.standard_normal((L, B, S, K, H)).astype(np.float32)
    mins, maxs = selection.page_minmax(jnp.asarray(k_all), P)
    kp = k_all.reshape(L, B, S // P, P, K, H)
    np.testing.assert_array_equal(mins, kp.min(3))
    np.testing.assert_array_equal(maxs, kp.max(3))

    q = rng.standard_normal((B, K * G, H)).astype(np.float32)
    s = np.asarray(selection.page_scores(jnp.asarray(q), mins[1], maxs[1]))
    qg = q.reshape(B, K, G, H)
    brute = np.zeros((B, S // P))
    for b in range(B):
        for p in range(S // P):
            for kh in range(K):
                for g in range(G):
                    brute[b, p] += np.maximum(qg[b, kh, g] * kp[1, b, p, :, kh].min(0),
                                              qg[b, kh, g] * kp[1, b, p, :, kh].max(0)).sum()
    np.testing.assert_allclose(s, brute, rtol=1e-5, atol=1e-4)

    n_complete = np.array([10, 3, 1], np.int32)
    idx, n = selection.quest_select(jnp.asarray(q), mins[1], maxs[1], n_complete, 2, max_pages=3, page=P)
    for b in range(B):
        top = np.argsort(-brute[b, :n_complete[b]], kind="stable")[:2]
        want = sorted(int(t) * P + o for t in top for o in range(P))
        assert int(n[b]) == len(want)
        assert _valid(idx[b], n[b]) == want


def test_quest_incremental_page_update_equals_recompute():
    rng = np.random.default_rng(3)
    L, B, S, K, H, P = 2, 2, 32, 1, 4, 4
    k0 = rng.standard_normal((L, B, S, K, H)).astype(np.float32)
    mins, maxs = selection.page_minmax(jnp.asarray(k0), P)
    k1 = k0.copy()
    k1[:, 0, 9:14] = rng.standard_normal((L, 5, K, H))        # seq 0: pages 2, 3 touched
    k1[:, 1, 28:32] = rng.standard_normal((L, 4, K, H))       # seq 1: page 7 (the last one)
    first = np.array([9 // P, 28 // P], np.int32)
    mins, maxs = selection.update_pages(mins, maxs, jnp.asarray(k1), first, count=2, page=P)
    want_min, want_max = selection.page_minmax(jnp.asarray(k1), P)
    np.testing.assert_array_equal(mins, want_min)
    np.testing.assert_array_equal(maxs, want_max)


def test_vegas_collect_rows():
    assert vegas.score_rows(SpecConfig(gamma=4)) == (0, 4)
    assert vegas.score_rows(SpecConfig(gamma=1)) == (0, 1)
    assert vegas.score_rows(SpecConfig(gamma=3, collect="all")) == (0, 1, 2, 3)


def test_budget_rule_with_ratio():
    spec = SpecConfig(ratio=0.05, min_tokens=16, max_tokens=64, budget=64)
    assert np.asarray(spec.k(np.array([10, 400, 1000, 5000]))).tolist() == [16, 20, 50, 64]
    assert np.asarray(SpecConfig(budget=96).k(np.array([10, 5000]))).tolist() == [96, 96]


@pytest.mark.parametrize("kw, match", [
    (dict(gamma=0), "gamma=0 must be >= 1"),
    (dict(method="streaming", budget=2, sink=4), "budget=2 must be >= sink=4"),
    (dict(method="medusa"), "unknown speculative method 'medusa'"),
    (dict(method="quest", budget=8, page_size=16), "at least one page"),
    (dict(score_mode="probs"), "score_mode"),
    (dict(collect="some"), "collect"),
    (dict(ratio=1.5), "ratio=1.5"),
    (dict(select_page=0), "select_page=0 must be >= 1"),
    (dict(budget=100, select_page=16), "multiple of select_page=16"),
])
def test_bad_knobs_raise_input_errors(kw, match):
    with pytest.raises(InputError, match=match):
        SpecConfig(**kw)
