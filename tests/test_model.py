"""Model + KV cache + plain decoding (the engine's "ar") on tiny random configs of each family (numerics,
not speed)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec import api
from jspec import prefill as gen
from jspec import kv_cache, layers, model, speculative
from jspec.config import ModelConfig, RopeScaling, SamplingConfig
from jspec.errors import InputError
from jspec.speculative import SpecConfig


def tiny(arch, **kw):
    base = dict(arch=arch, vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                ffn_dim=96, rope_theta=10000.0, dtype="float32", max_position=256, eos_token_ids=(3,))
    if arch == "llama":
        base["rope_scaling"] = RopeScaling(factor=8.0, original_max_position=32)
    base.update(kw)
    return ModelConfig(**base)


ARCHS = ["llama", "qwen2", "qwen3"]


def _params(cfg, seed=0):
    return model.init_params(cfg, jax.random.key(seed), scale=0.3)


def _full_logits(params, cfg, tokens):
    cache = kv_cache.init(cfg, batch=tokens.shape[0], capacity=tokens.shape[1] + 8)
    return model.forward(params, cfg, tokens, cache)[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_decoding_equals_full_recompute(arch):
    cfg = tiny(arch)
    params = _params(cfg)
    toks = jax.random.randint(jax.random.key(1), (2, 20), 0, cfg.vocab_size)
    full = _full_logits(params, cfg, toks)
    cache = kv_cache.init(cfg, batch=2, capacity=32)
    pieces = []
    for a, b in [(0, 9), (9, 10), (10, 14), (14, 15), (15, 20)]:   # prefill, decode, verify-sized chunks
        lg, cache, _ = model.forward(params, cfg, toks[:, a:b], cache)
        pieces.append(lg)
    np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, atol=2e-5, rtol=1e-5)
    assert cache.lengths.tolist() == [20, 20]


@pytest.mark.parametrize("arch", ARCHS)
def test_rollback_then_rewrite_matches_clean_run(arch):
    cfg = tiny(arch)
    params = _params(cfg, 2)
    toks = jax.random.randint(jax.random.key(3), (1, 12), 0, cfg.vocab_size)
    junk = jax.random.randint(jax.random.key(4), (1, 5), 0, cfg.vocab_size)
    cache = kv_cache.init(cfg, batch=1, capacity=24)
    _, cache, _ = model.forward(params, cfg, toks[:, :8], cache)
    _, cache, _ = model.forward(params, cfg, junk, cache)         # a rejected draft ...
    cache = kv_cache.rollback(cache, jnp.array([8]))              # ... rolled back in O(1)
    lg, cache, _ = model.forward(params, cfg, toks[:, 8:], cache)
    np.testing.assert_allclose(lg, _full_logits(params, cfg, toks)[:, 8:], atol=2e-5, rtol=1e-5)


AR = SpecConfig("ar")


def ar_run(params, cfg, samp, prompts, key, new, stops=(), capacity=48):
    """Plain decoding through the public path: the engine's "ar" (no drafts). (tokens, n_out) as numpy."""
    tokens, lengths = gen.pad_prompts(prompts, multiple=8)
    state = speculative.init(params, cfg, AR, jnp.asarray(tokens), jnp.asarray(lengths), capacity)
    out, n_out, _ = speculative.run(params, cfg, AR, samp, state, key, new, stop_tokens=stops)
    return np.asarray(out), np.asarray(n_out)


def test_ragged_batch_equals_each_sequence_alone():
    cfg = tiny("llama")
    params = _params(cfg, 5)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(4, cfg.vocab_size, n).tolist() for n in (5, 17, 11)]
    samp = SamplingConfig()
    tokens, lengths = gen.pad_prompts(prompts, multiple=8)
    cache = kv_cache.init(cfg, batch=3, capacity=48)
    logits, _ = gen.prefill(params, cfg, jnp.asarray(tokens), jnp.asarray(lengths), cache)
    out, n_out = ar_run(params, cfg, samp, prompts, jax.random.key(0), 10)
    for b, p in enumerate(prompts):
        t1, l1 = gen.pad_prompts([p], multiple=8)
        c1 = kv_cache.init(cfg, batch=1, capacity=48)
        lg1, _ = gen.prefill(params, cfg, jnp.asarray(t1), jnp.asarray(l1), c1)
        np.testing.assert_allclose(logits[b], lg1[0], atol=1e-4, rtol=1e-4)
        o1, n1 = ar_run(params, cfg, samp, [p], jax.random.key(0), 10)
        assert int(n_out[b]) == int(n1[0])
        assert out[b, :n_out[b]].tolist() == o1[0, :n1[0]].tolist()


def test_greedy_ar_equals_naive_argmax_loop():
    cfg = tiny("qwen3", eos_token_ids=())
    params = _params(cfg, 7)
    prompt = np.random.default_rng(1).integers(0, cfg.vocab_size, 9).tolist()
    out, n_out = ar_run(params, cfg, SamplingConfig(), [prompt], jax.random.key(0), 8, capacity=32)
    seq = list(prompt)
    for _ in range(8):   # full recompute every step: no cache involved
        seq.append(int(jnp.argmax(_full_logits(params, cfg, jnp.asarray([seq]))[0, -1])))
    assert out[0].tolist() == seq[len(prompt):]
    assert int(n_out[0]) == 8


def test_stop_token_ends_each_sequence_separately(monkeypatch):
    from conftest import spy_attention_reads
    cfg = tiny("llama")
    params = _params(cfg, 9)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
    free, _ = ar_run(params, cfg, SamplingConfig(), prompts, jax.random.key(0), 12, capacity=40)
    # Make row 0's third emitted token a stop token and check only row 0 stops there.
    stop = int(free[0, 2])
    tokens, lengths = gen.pad_prompts(prompts, multiple=8)
    state = speculative.init(params, cfg, AR, jnp.asarray(tokens), jnp.asarray(lengths), 40)
    reads = spy_attention_reads(monkeypatch)
    with jax.disable_jit():   # eager loop: the spy sees each step's read lengths
        out, n_out, _ = speculative.run(params, cfg, AR, SamplingConfig(), state, jax.random.key(0), 12,
                                        stop_tokens=(stop,))
    first_stop = [next((i for i, t in enumerate(free[b].tolist()) if t == stop), None) for b in range(2)]
    # A stopped row rides along without reading its cache: one slot per step after it stopped.
    steps = np.stack([n for _, n in reads])[::cfg.n_layers]          # [steps, B]
    assert len(steps) == 11 and {k for k, _ in reads} == {"full"}
    for b in range(2):
        stopped = len(steps) if first_stop[b] is None else first_stop[b]
        assert (steps[stopped:, b] == 1).all() and (steps[:stopped, b] == lengths[b] + 1 + np.arange(stopped)).all()
    for b in range(2):
        want = 12 if first_stop[b] is None else first_stop[b] + 1
        assert int(n_out[b]) == want
        assert out[b, :want].tolist() == free[b, :want].tolist()
        assert (out[b, want:] == -1).all()


def test_sampling_ar_is_reproducible_and_seed_dependent():
    cfg = tiny("qwen2")
    params = _params(cfg, 11)
    samp = SamplingConfig(temperature=1.0, top_k=20, top_p=0.95)
    runs = [ar_run(params, cfg, samp, [[4, 5, 6]], jax.random.key(seed), 16, capacity=40)[0] for seed in (0, 0, 1)]
    assert runs[0].tolist() == runs[1].tolist()
    assert runs[0].tolist() != runs[2].tolist()

def test_tree_forward_with_chain_mask_equals_causal():
    cfg = tiny("llama")
    params = _params(cfg, 13)
    toks = jax.random.randint(jax.random.key(5), (2, 14), 0, cfg.vocab_size)
    full = _full_logits(params, cfg, toks)
    cache = kv_cache.init(cfg, batch=2, capacity=24)
    _, cache, _ = model.forward(params, cfg, toks[:, :9], cache)
    T = 5
    tree = model.Tree(depth=jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (2, T)),
                      mask=jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (2, T, T)))
    lg, _, _ = model.forward(params, cfg, toks[:, 9:], cache, tree=tree)
    np.testing.assert_allclose(lg, full[:, 9:], atol=2e-5, rtol=1e-5)


def test_tree_branches_see_only_their_ancestors():
    """Two sibling branches verified in one tree forward equal each branch run alone as a chain."""
    cfg = tiny("qwen3")
    params = _params(cfg, 17)
    prefix = jax.random.randint(jax.random.key(6), (1, 7), 0, cfg.vocab_size)
    a, b = [11, 12, 13], [21, 22]
    # nodes: 0=a0 1=a1 2=a2 3=b0 4=b1 ; a-chain and b-chain both hang off the prefix
    parent = [-1, 0, 1, -1, 3]
    T = len(parent)
    mask = np.eye(T, dtype=bool)
    depth = np.zeros(T, np.int32)
    for i, p in enumerate(parent):
        j = p
        while j >= 0:
            mask[i, j] = True
            depth[i] += 1
            j = parent[j]
    cache = kv_cache.init(cfg, batch=1, capacity=24)
    _, cache, _ = model.forward(params, cfg, prefix, cache)
    tree = model.Tree(depth=jnp.asarray(depth)[None], mask=jnp.asarray(mask)[None])
    lg, _, _ = model.forward(params, cfg, jnp.asarray([a + b]), cache, tree=tree)
    for nodes, toks in [((0, 1, 2), a), ((3, 4), b)]:
        ref = _full_logits(params, cfg, jnp.concatenate([prefix, jnp.asarray([toks])], 1))[:, 7:]
        np.testing.assert_allclose(lg[:, list(nodes)], ref, atol=2e-5, rtol=1e-5)


def test_collected_scores_match_bruteforce_attention_weights():
    """aux["scores"] (score_rows (0, 3) of a 4-token block after a 6-token prefix) equals, key by key, the
    softmax attention weights computed here from the layer's q and k, summed over heads and the two rows."""
    cfg = tiny("llama", n_layers=1)
    stored = model.init_params(cfg, jax.random.key(19), scale=0.3, stored=True)   # the brute force reads wq, wk
    params = model.fuse_projections(stored, cfg)
    toks = jax.random.randint(jax.random.key(8), (1, 10), 0, cfg.vocab_size)
    cache = kv_cache.init(cfg, batch=1, capacity=16)
    _, cache, _ = model.forward(params, cfg, toks[:, :6], cache)
    _, _, aux = model.forward(params, cfg, toks[:, 6:], cache, score_rows=(0, 3))
    s = np.asarray(aux["scores"][0, 0])                           # [S]

    # Brute force: q, k of all 10 positions, causal softmax per head, rows = query positions 6 and 9.
    p = jax.tree.map(lambda w: w[0], stored["layers"])
    h = layers.rms_norm(stored["embed"][toks], p["attn_norm"], cfg.norm_eps)
    pos = jnp.arange(10, dtype=jnp.int32)[None]
    q = np.asarray(layers.rope(jnp.einsum("BTD,DNH->BTNH", h, p["wq"]), pos, cfg), np.float64)[0]   # [10, N, H]
    k = np.asarray(layers.rope(jnp.einsum("BTD,DKH->BTKH", h, p["wk"]), pos, cfg), np.float64)[0]   # [10, K, H]
    k = np.repeat(k, cfg.n_heads // cfg.n_kv_heads, axis=1)                                         # GQA: head n -> kv n // G
    want = np.zeros(16)
    for t in (6, 9):
        logits = np.einsum("nh,snh->ns", q[t], k[:t + 1]) / np.sqrt(cfg.head_dim)                # [N, t+1]
        w = np.exp(logits - logits.max(1, keepdims=True))
        want[:t + 1] += (w / w.sum(1, keepdims=True)).sum(0)
    np.testing.assert_allclose(s, want, rtol=1e-4, atol=1e-6)
    assert s[9] > 0 and (s[10:] == 0).all()                      # row 3 sees its own key; nothing past the prefix
    # Row 0 alone (query position 6): keys 7..9 are its future.
    _, _, aux0 = model.forward(params, cfg, toks[:, 6:], cache, score_rows=(0,))
    assert float(jnp.abs(aux0["scores"][0, 0, 7:]).max()) == 0.0
    assert float(jnp.sum(aux0["scores"][0, 0])) == pytest.approx(cfg.n_heads, rel=1e-5)


def test_check_request_errors():
    with pytest.raises(InputError, match="empty"):
        api.check_request([3, 0], capacity=64, max_new_tokens=4, vocab_size=10)
    with pytest.raises(InputError, match="cache holds 64"):
        api.check_request([60], capacity=64, max_new_tokens=8, vocab_size=10)
    with pytest.raises(InputError, match="no prompts"):
        api.check_request([], capacity=64, max_new_tokens=8, vocab_size=10)
    with pytest.raises(InputError, match=r"\[0, 10\)"):
        api.check_request([2], capacity=64, max_new_tokens=8, vocab_size=10, tokens=[1, 12])
    api.check_request([56], capacity=64, max_new_tokens=8, vocab_size=10)


def test_bad_config_errors():
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'"):
        tiny("gpt2")
    with pytest.raises(ValueError, match="multiple"):
        tiny("llama", n_heads=5, n_kv_heads=2)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)


def test_full_size_presets_trace_with_eval_shape():
    """Shape check on the real sizes without allocating them (Gemma's habit)."""
    from jspec.config import PRESETS
    for name, cfg in PRESETS.items():
        params = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
        cache = jax.eval_shape(lambda: kv_cache.init(cfg, batch=2, capacity=256))
        toks = jax.ShapeDtypeStruct((2, 4), jnp.int32)
        logits, new_cache, _ = jax.eval_shape(lambda p, t, c: model.forward(p, cfg, t, c), params, toks, cache)
        assert logits.shape == (2, 4, cfg.vocab_size), name
        assert new_cache.k.shape == (cfg.n_layers, 2, 256, cfg.n_kv_heads, cfg.head_dim)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_pallas_interpret_path_matches_xla_in_the_model(arch):
    """The model wired to the Pallas kernels (interpret mode, stacked cache read in place) equals XLA:
    prefill, decode, chain verify with Collect-2-Query scores, tree verify and sparse drafting."""
    from jspec.attention import AttnImpl
    cfg = tiny(arch, head_dim=64, n_heads=6, n_kv_heads=2, d_model=96, n_layers=2)
    params = _params(cfg, 21)
    pal, xla = AttnImpl(backend="pallas", interpret=True), AttnImpl(backend="xla")
    toks = jax.random.randint(jax.random.key(9), (2, 24), 0, cfg.vocab_size)
    res = {}
    for name, impl in (("pallas", pal), ("xla", xla)):
        cache = kv_cache.init(cfg, batch=2, capacity=40)
        a, cache, _ = model.forward(params, cfg, toks[:, :16], cache, impl=impl)
        b, cache, _ = model.forward(params, cfg, toks[:, 16:17], cache, impl=impl)
        c, cache2, aux = model.forward(params, cfg, toks[:, 17:22], cache, score_rows=(1, 4), impl=impl)
        T = 5
        tree = model.Tree(depth=jnp.broadcast_to(jnp.array([0, 1, 1, 2, 2], jnp.int32), (2, T)),
                          mask=jnp.broadcast_to(jnp.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0],
                                                           [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]], bool), (2, T, T)))
        d, _, _ = model.forward(params, cfg, toks[:, 17:22], cache, tree=tree, impl=impl)
        L, M = cfg.n_layers, 8
        idx = jnp.broadcast_to(jnp.array([0, 2, 3, 5, 8, 9, 12, 15], jnp.int32), (L, 2, M))
        sp = model.Sparse(idx=idx, n_valid=jnp.array([[8, 5]] * L, jnp.int32))
        e, cache_e, _ = model.forward(params, cfg, toks[:, 17:18], cache, sparse=sp, impl=impl)
        res[name] = (a, b, c, aux["scores"], d, e, cache_e.k, cache_e.v)   # the draft step writes its K/V
    for got, want in zip(res["pallas"], res["xla"]):
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=2e-4)


def test_finished_rows_skip_their_cache_reads():
    """`forward(live=)`: a finished row (live False) no longer reads its cache, live rows are unchanged.

    The kernels (interpret mode) never read slots >= kv_len, so the finished row's cache is poisoned with
    NaN beyond the few slots it may still touch: with `live` its logits stay finite (nothing was read),
    without it they are NaN (the poison is read). Chain verify with scores, tree verify, sparse draft."""
    from jspec.attention import AttnImpl
    cfg = tiny("llama", head_dim=64, n_heads=6, n_kv_heads=2, d_model=96, n_layers=2)
    params = _params(cfg, 23)
    impl = AttnImpl(backend="pallas", interpret=True)
    B, T, P = 3, 5, 20
    toks = jax.random.randint(jax.random.key(10), (B, P + T), 0, cfg.vocab_size)
    cache = kv_cache.init(cfg, batch=B, capacity=40)
    _, cache, _ = model.forward(params, cfg, toks[:, :P], cache, impl=impl)
    live = jnp.array([True, False, True])
    poisoned = cache.replace(k=cache.k.at[:, 1, T:P].set(jnp.nan), v=cache.v.at[:, 1, T:P].set(jnp.nan))
    tree = model.Tree(depth=jnp.broadcast_to(jnp.array([0, 1, 1, 2, 2], jnp.int32), (B, T)),
                      mask=jnp.broadcast_to(jnp.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0],
                                                       [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]], bool), (B, T, T)))
    sp = model.Sparse(idx=jnp.broadcast_to(jnp.array([0, 2, 3, 5, 8, 9, 12, 15], jnp.int32), (2, B, 8)),
                      n_valid=jnp.full((2, B), 8, jnp.int32))
    calls = {"chain": dict(tokens=toks[:, P:], score_rows=(0, T - 1)), "tree": dict(tokens=toks[:, P:], tree=tree),
             "sparse": dict(tokens=toks[:, P:P + 1], sparse=sp)}
    for name, kw in calls.items():
        want, want_cache, _ = model.forward(params, cfg, cache=cache, impl=impl, **kw)
        got, got_cache, _ = model.forward(params, cfg, cache=poisoned, impl=impl, live=live, **kw)
        np.testing.assert_allclose(got[0::2], want[0::2], atol=1e-5, rtol=1e-5, err_msg=name)
        assert np.isfinite(np.asarray(got)).all(), name
        np.testing.assert_array_equal(got_cache.k[:, 0::2], want_cache.k[:, 0::2])   # writes as before
        assert (got_cache.lengths == want_cache.lengths).all()
        read, _, _ = model.forward(params, cfg, cache=poisoned, impl=impl, **kw)
        assert np.isnan(np.asarray(read[1])).any(), name          # without `live` the poison is read


@pytest.mark.parametrize("arch", ARCHS)
def test_runtime_layout_is_the_stored_weights_fused(arch):
    """model.fuse_projections (the layout jspec.load and init_params hand out) holds the stored weights: per KV
    head its G query heads in order (query head n = k*G + g reads KV head n // G), then k, then v; gate, up.
    init_params gives the same values in either layout; forward refuses the stored one."""
    cfg = tiny(arch, n_heads=6, n_kv_heads=2)      # G = 3, as SmolLM2
    stored = model.init_params(cfg, jax.random.key(0), scale=0.3, stored=True)
    fused = model.fuse_projections(stored, cfg)
    lp, sp = fused["layers"], stored["layers"]
    assert "wq" not in lp and "w_gate" not in lp and lp["wqkv"].shape == (2, 64, 2, 5, 16)
    assert lp["w_gu"].shape == (2, 64, 2, 96) and model.fuse_projections(fused, cfg) is fused   # idempotent
    for n in range(cfg.n_heads):
        np.testing.assert_array_equal(lp["wqkv"][:, :, n // 3, n % 3], sp["wq"][:, :, n])
    for kh in range(cfg.n_kv_heads):
        np.testing.assert_array_equal(lp["wqkv"][:, :, kh, 3], sp["wk"][:, :, kh])
        np.testing.assert_array_equal(lp["wqkv"][:, :, kh, 4], sp["wv"][:, :, kh])
    np.testing.assert_array_equal(lp["w_gu"][:, :, 0], sp["w_gate"])
    np.testing.assert_array_equal(lp["w_gu"][:, :, 1], sp["w_up"])
    default = model.init_params(cfg, jax.random.key(0), scale=0.3)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), default, fused))
    cache = kv_cache.init(cfg, batch=1, capacity=8)
    with pytest.raises(InputError, match="fused weight layout"):
        model.forward(stored, cfg, jnp.zeros((1, 2), jnp.int32), cache)
