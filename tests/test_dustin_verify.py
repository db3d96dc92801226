"""Dustin and its baselines as a verification policy (jspec/speculative/sparse_verify.py), on tiny float32 models.

- a budget covering the whole context gives output token-identical to the lossless method, for every drafter
  (streaming, quest, vegas, longspec chain and tree), and a row whose context fits is verified densely while
  its batch-mates are not;
- a case built so a sparse verification must change the output does (and `refresh=1`, every round dense, does
  not); Stats.lossless is False;
- the sparse verification forward (chain and tree, XLA and interpret-mode kernels, with a dense layer) equals
  an independent numpy forward whose attention is masked to I_verify + the new tokens;
- the signals: A_T is the softmax weights of the chosen heads on the verification's own q / k
  (`dustin.softmax_weights`), A_D the draft step's weights over the entries it read;
- sampling: a sparse round's first token follows the sparse target's law (chi-square), not the dense one's;
- the compiled loop never copies the cache (signals read it before the verification updates it in place);
- the interfaces: Verify validation, profiles via `jspec.generate` (another model / drafter: InputError), the
  CLI flags and the lossy line, `jspec bench` records (lossless false, fidelity against the dense twin).
"""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
import test_longspec as tl
import test_speculative as ts
from conftest import CharTokenizer
from jspec import prefill as gen
from jspec import dustin, kv_cache, model, sampling, speculative
from jspec.attention import AttnImpl
from jspec.config import ModelConfig, SamplingConfig
from jspec.speculative import SpecConfig, Verify, sparse_verify
from reference_decode import decode as plain_decode

GREEDY = SamplingConfig()


# ---- identity when the budget covers the context ----------------------------------------------------------

@pytest.mark.parametrize("name", ["streaming", "quest", "vegas"])
def test_budget_covering_the_context_is_token_identical_self_drafts(name):
    cfg, params, tokens, lengths, stop, ref = ts.setup("llama")
    kind = {"streaming": "streaming", "quest": "quest", "vegas": "dustin"}[name]
    v = Verify(kind, budget=ts.CAPACITY, sink=2, window=4, page=4 if kind == "quest" else None)
    spec = dataclasses.replace(ts.variant("llama", name), verify=v)
    got, _, st = ts.spec_generate(cfg, params, spec, tokens, lengths, stops=(stop,))
    assert got == ref and not spec.verify.lossless


def test_a_row_that_fits_is_verified_densely_beside_sparse_rows():
    """Budget 24: row 0 (3 prompt tokens + 20 new) always fits, rows 1 and 2 do not. Row 0 reads its whole
    context through the sparse path (the whole-batch dense branch is not taken) and keeps the lossless output."""
    cfg, params, tokens, lengths, stop, ref = ts.setup("llama")
    spec = dataclasses.replace(ts.variant("llama", "vegas"), verify=Verify("dustin", budget=24, sink=2, window=4))
    got, _, _ = ts.spec_generate(cfg, params, spec, tokens, lengths, stops=(stop,))
    assert got[0] == ref[0] and got[1:] != ref[1:]


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_budget_covering_the_context_is_token_identical_longspec(mode):
    s = tl.setup("local")
    spec = dataclasses.replace(tl.SPECS[mode], verify=Verify("dustin", budget=tl.CAPACITY, sink=2, window=4))
    got, _, st, _ = tl.run_longspec(s, spec, stops=(s["stop"],))
    assert got == s["ref"]
    assert st.tau() > 1.4   # deep paths accepted: the sparse tree path and compaction ran


# ---- a sparse verification that must differ ---------------------------------------------------------------

A, B_ = 5, 6


@pytest.fixture(scope="module")
def majority():
    """One layer whose attention is uniform (q = k = 0), values carry only "is it A" / "is it B", output
    projection x1 per head, no MLP, tied embeddings e_A = 8 u0, e_B = 8 u1. The next token's logits are then
    A: 32 fA, B: 8 + 32 fB (+ the current token B's own 8), fA / fB the shares of A / B among the attended
    slots. Prompt: 100 A then 30 B. Dense: fA ~ 0.77 -> A forever. A sparse verification over sink 2 + the 24
    newest slots sees mostly B once the first (dense) round is past: fB >~ 0.6 -> B."""
    cfg = ModelConfig(arch="llama", vocab_size=16, d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16,
                      ffn_dim=32, rope_theta=10000.0, dtype="float32", max_position=512, tie_embeddings=True,
                      eos_token_ids=())
    p = model.init_params(cfg, jax.random.key(0), stored=True)
    emb = np.zeros((16, 64), np.float32)
    emb[A, 0], emb[B_, 1] = 8.0, 8.0
    for t in range(16):
        if t not in (A, B_):
            emb[t, 2 + t] = 1.0
    wv = np.zeros((1, 64, 2, 16), np.float32)
    wv[0, 0, :, 0] = wv[0, 1, :, 1] = 1.0
    wo = np.zeros((1, 4, 16, 64), np.float32)
    wo[0, :, 0, 0] = wo[0, :, 1, 1] = 1.0
    lay = p["layers"]
    p = dict(p, embed=jnp.asarray(emb), layers=dict(lay, wq=0 * lay["wq"], wk=0 * lay["wk"], wv=jnp.asarray(wv),
                                                     wo=jnp.asarray(wo), w_down=0 * lay["w_down"]))
    p = model.fuse_projections(p, cfg)
    toks = jnp.asarray(np.array([[A] * 100 + [B_] * 30], np.int32))
    return cfg, p, toks, jnp.asarray([130], jnp.int32)


@pytest.mark.parametrize("kind", ["streaming", "dustin"])
def test_small_budget_changes_the_output_where_it_must(majority, kind):
    cfg, params, toks, lengths = majority
    cache = kv_cache.init(cfg, batch=1, capacity=160)
    logits, cache = gen.prefill(params, cfg, toks, lengths, cache)
    free, _, _ = plain_decode(params, cfg, GREEDY, cache, logits, jax.random.key(0), max_new_tokens=12)
    assert np.asarray(free).tolist() == [[A] * 12]
    v = Verify(kind, budget=26, sink=2, window=24)    # dustin: no room for the tiers (ties would pick A anyway)
    outs = {}
    for refresh in (0, 1):
        spec = SpecConfig("vegas", gamma=3, budget=16, min_tokens=8, verify=dataclasses.replace(v, refresh=refresh))
        st = speculative.init(params, cfg, spec, toks, lengths, 160)
        out, _, _, _ = speculative.run_donating(params, cfg, spec, GREEDY, st, jax.random.key(0), 12)
        outs[refresh] = np.asarray(out)[0].tolist()
    assert outs[0][:4] == [A] * 4 and B_ in outs[0], outs[0]   # the first round is dense, then the sparse target
    assert outs[1] == [A] * 12                                 # every round dense: the lossless output


def test_generate_reports_a_lossy_run(majority):
    cfg, params, toks, _ = majority
    m = jspec.Model(params=params, cfg=cfg, tokenizer=CharTokenizer(), path="")
    prompt = [np.asarray(toks)[0].tolist()]
    dense = jspec.generate(m, prompt, method="streaming", budget=16, max_new_tokens=12)
    lossy = jspec.generate(m, prompt, method="streaming", budget=16, max_new_tokens=12, verify="streaming",
                           verify_budget=26, verify_sink=2)
    assert dense.stats.lossless and not lossy.stats.lossless
    assert dense.tokens == [[A] * 12] and lossy.tokens != dense.tokens
    assert lossy.stats.knobs["verify"]["kind"] == "streaming" and lossy.stats.knobs["verify"]["budget"] == 26


# ---- the verification forward against an independent masked reference -----------------------------------

def _np_forward(params, cfg, tokens, positions, mask):
    """float64 numpy forward of one sequence: tokens [S], positions [S], mask [L, S, S] (query row, key)."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    lay = p["layers"]
    N, K, H = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, H, 2) / H)
    ang = positions[:, None] * inv[None]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]

    def rope(x):
        a, b = x[..., :H // 2], x[..., H // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * w

    x = p["embed"][tokens]
    for i in range(cfg.n_layers):
        h = norm(x, lay["attn_norm"][i])
        q = rope(np.einsum("sd,dnh->snh", h, lay["wq"][i]))
        k = rope(np.einsum("sd,dkh->skh", h, lay["wk"][i]))
        v = np.einsum("sd,dkh->skh", h, lay["wv"][i])
        k, v = np.repeat(k, N // K, axis=1), np.repeat(v, N // K, axis=1)
        s = np.einsum("tnh,snh->nts", q, k) / np.sqrt(H)
        s = np.where(mask[i][None], s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        x = x + np.einsum("nts,snh,nhd->td", w, v, lay["wo"][i])
        h = norm(x, lay["mlp_norm"][i])
        g, u = h @ lay["w_gate"][i], h @ lay["w_up"][i]
        x = x + (g / (1 + np.exp(-g)) * u) @ lay["w_down"][i]
    return norm(x, p["final_norm"]) @ p["embed"].T


@pytest.mark.parametrize("backend", ["xla", "interpret"])
@pytest.mark.parametrize("tree", [False, True])
def test_verification_reads_exactly_i_verify_and_the_new_tokens(tree, backend):
    cfg = ModelConfig(arch="llama", vocab_size=64, d_model=64, n_layers=2, n_heads=3, n_kv_heads=1, head_dim=64,
                      ffn_dim=96, rope_theta=10000.0, dtype="float32", max_position=256, tie_embeddings=True)
    stored = model.init_params(cfg, jax.random.key(3), scale=0.3, stored=True)   # the reference reads wq, wk, ...
    params = model.fuse_projections(stored, cfg)
    rng = np.random.default_rng(4)
    P, T, M, S = 40, 5, 12, 64
    prompt = rng.integers(1, 64, P)
    block = rng.integers(1, 64, T)
    cache = kv_cache.init(cfg, batch=1, capacity=S)
    _, cache, _ = model.forward(params, cfg, jnp.asarray(prompt[None]), cache)
    chosen = np.sort(rng.choice(P, M - 3, replace=False))
    idx = np.zeros((1, M), np.int32)
    idx[0, :M - 3] = chosen[::-1]                       # any order; 3 padding slots
    sp = model.Sparse(idx=jnp.asarray(idx), n_valid=jnp.asarray([M - 3], jnp.int32))
    if tree:   # root, two children of the root, a child of each
        parent = [-1, 0, 0, 1, 2]
        depth = np.array([0, 1, 1, 2, 2])
        tm = np.eye(T, dtype=bool)
        for t in range(T):
            a = parent[t]
            while a >= 0:
                tm[t, a], a = True, parent[a]
        shape = model.Tree(depth=jnp.asarray(depth[None]), mask=jnp.asarray(tm[None]))
    else:
        depth, tm, shape = np.arange(T), np.tril(np.ones((T, T), bool)), None
    impl = AttnImpl(backend="xla") if backend == "xla" else AttnImpl(backend="pallas", interpret=True)
    got, _, _ = model.forward(params, cfg, jnp.asarray(block[None]), cache, tree=shape, sparse=sp,
                              dense_layers=(1,), impl=impl)
    n = P + T
    mask = np.zeros((cfg.n_layers, n, n), bool)
    mask[:, :P, :P] = np.tril(np.ones((P, P), bool))    # the prompt as prefilled (dense, causal)
    mask[:, P:, P:] = tm
    mask[0, P:, chosen] = True                           # layer 0: I_verify
    mask[1, P:, :P] = True                               # layer 1 is a dense layer
    positions = np.concatenate([np.arange(P), P + depth]).astype(np.float64)
    want = _np_forward(stored, cfg, np.concatenate([prompt, block]), positions, mask)[P:]
    np.testing.assert_allclose(np.asarray(got[0]), want, rtol=2e-4, atol=2e-4)
    # ... and not the dense verification (the test can fail: the selection matters)
    mask[0, P:, :P] = True
    dense = _np_forward(stored, cfg, np.concatenate([prompt, block]), positions, mask)[P:]
    assert np.abs(np.asarray(got[0]) - dense).max() > 1e-2


# ---- signals ----------------------------------------------------------------------------------------------

def test_head_weights_and_selected_weights_against_softmax():
    rng = np.random.default_rng(0)
    B, R, N, K, H, S = 2, 2, 6, 2, 16, 24
    q = jnp.asarray(rng.standard_normal((B, R, N, H)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, S, K, H)), jnp.float32)
    lengths = jnp.asarray([17, 0])
    heads = (4, 0, 1)
    want = np.asarray(dustin.softmax_weights(q, k, lengths))[:, list(heads)].sum((1, 2))
    np.testing.assert_allclose(np.asarray(dustin.head_weights(q, k, lengths, heads)), want, rtol=1e-5, atol=1e-6)
    # A draft step (T = 1) over a selection + its own slot: softmax over exactly those keys, own weight dropped.
    idx = jnp.asarray([[3, 9, 1, 0], [5, 2, 0, 0]], jnp.int32)
    n = jnp.asarray([3, 2])
    own = jnp.asarray([20, 11])
    got = np.asarray(dustin.selected_weights(q[:, :1], k, idx, n, own, heads))
    for b in range(B):
        pos = list(np.asarray(idx[b, :int(n[b])])) + [int(own[b])]
        ref = np.zeros(S)
        for h in heads:
            s = np.array([np.asarray(q[b, 0, h]) @ np.asarray(k[b, j, h // 3]) for j in pos]) / np.sqrt(H)
            w = np.exp(s - s.max())
            ref[pos[:-1]] += (w / w.sum())[:-1]
        np.testing.assert_allclose(got[b], ref, rtol=1e-5, atol=1e-6)


def test_target_signal_is_the_chosen_heads_softmax_on_the_verifications_q_and_k():
    cfg, params, tokens, lengths, _, _ = ts.setup("llama")
    spec = dataclasses.replace(ts.variant("llama", "vegas"),
                               verify=Verify("dustin", budget=16, sink=2, window=4, target_heads=((1, 3), (0, 0),
                                                                                                  (1, 1))))
    cache = kv_cache.init(cfg, batch=3, capacity=ts.CAPACITY)
    _, cache, _ = model.forward(params, cfg, tokens, cache, n_new=lengths)
    block = jnp.asarray(np.random.default_rng(1).integers(4, 96, (3, 4)), jnp.int32)
    probe = sparse_verify._target_probe(spec, cfg, cache.lengths)
    seen = {}

    def spy(layer, q, k_all, sel):
        seen[layer] = (q, k_all[layer])
        return probe(layer, q, k_all, sel)

    _, _, aux = model.forward(params, cfg, block, cache, probe=spy)
    want = 0.0
    for layer, hs in ((0, [0]), (1, [3, 1])):
        q, k = seen[layer]
        w = np.asarray(dustin.softmax_weights(q[:, jnp.asarray([0, 3])], k, lengths))   # rows 0 and T-1
        want = want + w[:, hs].sum((1, 2))
    np.testing.assert_allclose(np.asarray(aux["probe"]), want, rtol=1e-5, atol=1e-6)
    # the engine's state after a verification holds it (decay 0: the newest estimate)
    vs = sparse_verify.init(spec, cfg, cache)
    _, _, _, vs = sparse_verify.forward(params, cfg, spec, vs, block, cache, score_rows=(0, 3))
    np.testing.assert_allclose(np.asarray(vs.a_t), want, rtol=1e-5, atol=1e-6)
    assert int(vs.rounds) == 1


# ---- sampling: the sparse target's distribution ------------------------------------------------------------

def test_sampled_tokens_follow_the_sparse_targets_law():
    """Under sampling a round's tokens follow the SPARSE target's distribution (rejection sampling is exact for
    the target it verifies against). 16,000 rows of one prompt (V = 8, tests/test_sampling_engine.py's tiny
    model, undamped) with streaming verification over sink 1 + the 3 newest prompt slots, the first round
    sparse (its forced dense round skipped in the state): the joint law of (t0, t1) -- t0 from the dense
    prefill, t1 the first round's first token, accepted draft or correction -- must be p(t0) p_sparse(t1 | t0),
    computed from a forward masked to those slots, and must NOT be the dense p(t0) p(t1 | t0) (TV 0.15 apart).
    Later tokens are not tested: a round's I_verify moves with the round boundaries, which depend on earlier
    acceptances, so the law of the whole output is a mixture of such sparse targets (docs/methods.md)."""
    import test_sampling_engine as se
    from test_sampling_power import chisquare_cells, joint_counts, power
    cfg, V, P, samp, n = se.tiny(), se.V, se.P, se.SAMP, 16_000
    params = model.init_params(cfg, jax.random.key(3), scale=0.2)
    seqs = jnp.asarray(np.concatenate([np.tile(se.PROMPT, (V, 1)), np.arange(V)[:, None]], 1), jnp.int32)
    lg, _, _ = model.forward(params, cfg, seqs, kv_cache.init(cfg, batch=V, capacity=P + 1))
    p = np.asarray(sampling.process_logits(lg, samp), np.float64)
    dense = p[0, P - 1][:, None] * p[:, P]                                                 # [t0, t1]
    _, cache, _ = model.forward(params, cfg, seqs[:, :P], kv_cache.init(cfg, batch=V, capacity=P + 1))
    idx = jnp.asarray(np.tile([0, P - 3, P - 2, P - 1], (V, 1)), jnp.int32)
    lg_s, _, _ = model.forward(params, cfg, seqs[:, P:], cache, sparse=model.Sparse(idx, jnp.full((V,), 4)))
    sparse = p[0, P - 1][:, None] * np.asarray(sampling.process_logits(lg_s[:, 0], samp), np.float64)
    assert 0.5 * np.abs(dense - sparse).sum() > 0.1

    spec = SpecConfig("vegas", gamma=2, budget=4, verify=Verify("streaming", budget=4, sink=1))
    state = speculative.init(params, cfg, spec, jnp.asarray(np.tile(se.PROMPT, (n, 1))), jnp.full((n,), P, jnp.int32),
                             P + 4 + spec.capacity_margin())
    state = state.replace(verify=state.verify.replace(rounds=jnp.ones((), jnp.int32)))   # round 1 sparse too
    out, _, st = speculative.run(params, cfg, spec, samp, state, jax.random.key(11), 4)
    hist = np.asarray(st.accept_hist).sum(0)
    assert hist[1:].sum() > 0.3 * hist.sum(), hist       # drafts are accepted, not only corrected
    counts = joint_counts(np.asarray(out)[:, :2], V)
    pvalue, df, forbidden = chisquare_cells(counts, sparse.reshape(-1))
    assert forbidden == 0 and power(df, n, 0.05, 1e-4) > 0.9
    assert pvalue > 1e-4, pvalue
    assert chisquare_cells(counts, dense.reshape(-1))[0] < 1e-6    # the dense target's law is rejected


# ---- the cache is updated in place -------------------------------------------------------------------------

def _cache_copies(hlo: str, shape: str) -> int:
    return sum(1 for ln in hlo.splitlines() if " copy(" in ln and ln.split("=", 1)[1].strip().startswith(shape))


@pytest.mark.parametrize("case", ["vegas-dustin", "quest-verify", "longspec-tree"])
def test_signals_and_selection_do_not_copy_the_cache(case):
    """The signals read the cache that the verification then updates in place, and the dense rounds are a
    per-layer cond after the cache write: none of it may make XLA copy the cache (the compiled program has no
    copy of a cache-shaped buffer; a probe without its ordering barrier had two, a whole-forward cond four)."""
    if case == "longspec-tree":
        s = tl.setup("plain")
        spec = dataclasses.replace(tl.SPECS["tree"], verify=Verify("dustin", budget=16, sink=2, window=4))
        state = speculative.init(s["params"], s["cfg"], spec, s["tokens"], s["lengths"], tl.CAPACITY,
                                 drafter=s["drafter"])
        lowered = speculative.run_donating.lower(s["params"], s["cfg"], spec, GREEDY, state, jax.random.key(0), 8,
                                                 drafter=s["drafter"])
        shape = f"f32[2,3,{tl.CAPACITY},2,16]"
    else:
        cfg, params, tokens, lengths, _, _ = ts.setup("llama")
        v = (Verify("dustin", budget=16, sink=2, window=4, refresh=3, decay=0.5) if case == "vegas-dustin"
             else Verify("quest", budget=16, page=4))
        spec = dataclasses.replace(ts.variant("llama", "vegas"), verify=v)
        state = speculative.init(params, cfg, spec, tokens, lengths, ts.CAPACITY)
        lowered = speculative.run_donating.lower(params, cfg, spec, GREEDY, state, jax.random.key(0), 8)
        shape = f"f32[2,3,{ts.CAPACITY},2,16]"
    hlo = lowered.compile().as_text()
    assert " conditional(" in hlo and _cache_copies(hlo, shape) == 0


# ---- configuration and interfaces -------------------------------------------------------------------------

def test_verify_config_errors_and_defaults():
    v = Verify("dustin", budget=128, sink=4, window=16)
    assert not v.lossless and v.page_size == 1 and Verify("quest").page_size == 16 and Verify().lossless
    assert Verify("dustin", budget=128, window=16, signals="target").tier1 == 0
    assert Verify("dustin", budget=128, window=16, signals="draft").tier1 == 108
    assert Verify("streaming", budget=128).selection_window == 124
    spec = SpecConfig("vegas", verify=Verify("dustin", target_heads=[[1, 2]], dense_layers=[0]))
    hash(spec)                                                                 # a static jit argument
    from jspec.speculative.config import read_config
    assert SpecConfig(**read_config(json.loads(json.dumps(spec.describe())))) == spec   # a config file keeps it
    for kw, msg in [(dict(kind="fast"), "unknown verification"), (dict(kind="dustin", budget=32), "sink \\+ window"),
                    (dict(kind="dustin", m=10, signals="draft"), "give one"),
                    (dict(kind="quest", budget=40), "multiple of page=16"),
                    (dict(kind="dustin", refresh=-1), "refresh"),
                    (dict(kind="dustin", decay=1.0), "decay"), (dict(kind="dustin", page=3), "multiple of page=3")]:
        with pytest.raises(jspec.InputError, match=msg):
            Verify(**kw)
    with pytest.raises(jspec.InputError, match="needs a speculative method"):
        SpecConfig("ar", verify=Verify("dustin"))
    spec = SpecConfig("vegas", verify=Verify("dustin", target_heads=((2, 0),)))
    with pytest.raises(jspec.InputError, match="target heads .* outside the model's 2 layers"):
        sparse_verify.check(spec, ts.tiny("llama"))
    assert sparse_verify.default_heads(30, 9)[0][0] == (20, 0) and len(sparse_verify.default_heads(30, 9)[1]) == 18


def test_profiles_through_generate(tmp_path):
    cfg, params, _, _, _, _ = ts.setup("qwen3")
    m = jspec.Model(params=params, cfg=cfg, tokenizer=CharTokenizer(), path="")
    prompts = [[5, 6, 7, 8, 9], list(range(10, 40))]
    prof = dustin.Profile(model=dustin.model_signature(cfg), drafter="self", budget=16, sink=2, window=4, m=4,
                          target_heads=[(1, 0), (1, 2)], draft_heads=[(0, 1)], dense_layers=[0])
    path = dustin.write_profile(str(tmp_path / "heads.json"), prof)
    ar = jspec.generate(m, prompts, method="ar", max_new_tokens=12)
    out = jspec.generate(m, prompts, method="vegas", gamma=2, budget=8, min_tokens=8, max_new_tokens=12, profile=path)
    v = out.stats.knobs["verify"]
    assert (v["kind"], v["budget"], v["m"], v["profile"]) == ("dustin", 16, 4, path) and not out.stats.lossless
    assert v["target_heads"] == ((1, 0), (1, 2)) and v["dense_layers"] == (0,)
    assert len(out.tokens[1]) == 12 and out.tokens[0] == ar.tokens[0]   # row 0 fits in 16 slots: dense
    over = jspec.generate(m, prompts, method="vegas", gamma=2, budget=8, min_tokens=8, max_new_tokens=12, profile=path,
                          verify_budget=64)
    assert over.stats.knobs["verify"]["budget"] == 64 and over.tokens == ar.tokens   # 64 covers every context
    other = dustin.write_profile(str(tmp_path / "other.json"),
                                 dataclasses.replace(prof, model=dict(prof.model, n_layers=3)))
    with pytest.raises(jspec.InputError, match="another model.*n_layers: profile 3, model 2"):
        jspec.generate(m, prompts, method="vegas", profile=other)
    with pytest.raises(jspec.InputError, match="drafter 'self'.*longspec"):
        jspec.generate(m, prompts, method="longspec", profile=path, drafter=object())
    with pytest.raises(jspec.InputError, match="not found"):
        jspec.generate(m, prompts, method="vegas", profile=str(tmp_path / "none.json"))
    with pytest.raises(jspec.InputError, match="only apply to a sparse verification"):
        jspec.generate(m, prompts, method="vegas", verify="dense", profile=path)
    with pytest.raises(jspec.InputError, match="continuous batching"):
        jspec.generate(m, prompts, method="vegas", verify="streaming", slots=1)
    with pytest.raises(jspec.InputError, match="only apply to speculative"):
        jspec.generate(m, prompts, method="ar", verify="dustin")


def test_cli_flags_and_the_lossy_line(monkeypatch, capsys, tmp_path):
    from jspec import cli
    cfg, params, _, _, _, _ = ts.setup("qwen3")
    monkeypatch.setattr(jspec, "load", lambda name: jspec.Model(params=params, cfg=cfg, tokenizer=CharTokenizer(),
                                                                path=""))
    argv = ["generate", "--prompt", "speculate!", "--batch", "2", "--max-new-tokens", "12", "--method", "vegas",
            "--gamma", "2", "--budget", "8", "--min-tokens", "8"]
    assert cli.main(argv + ["--json"]) == 0
    dense = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert dense["stats"]["lossless"] is True
    assert cli.main(argv + ["--verify", "dustin", "--verify-budget", "96", "--verify-page", "8", "--verify-m", "16",
                            "--verify-refresh", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    v = res["stats"]["knobs"]["verify"]
    assert (v["kind"], v["budget"], v["page"], v["m"], v["refresh"]) == ("dustin", 96, 8, 16, 3)
    assert res["stats"]["lossless"] is False and res["tokens"] == dense["tokens"]   # 96 slots cover the context
    assert cli.main(argv + ["--verify", "streaming", "--verify-budget", "8"]) == 0
    assert "LOSSY: verify=streaming reads 8 cache slots" in capsys.readouterr().out
    prof = dustin.Profile(model=dustin.model_signature(cfg), drafter="self", budget=16, sink=2, window=4)
    path = dustin.write_profile(str(tmp_path / "h.json"), prof)
    assert cli.main(argv + ["--profile", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stats"]["knobs"]["verify"]["budget"] == 16
    for extra, msg in [(["--verify-budget", "8"], "--verify-budget only applies to a sparse verification"),
                       (["--verify", "dustin", "--verify-budget", "8"], "sink + window"),
                       (["--profile", str(tmp_path / "none.json")], "not found")]:
        assert cli.main(argv + extra) == 2
        assert msg in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "x", "--verify", "dustin"]) == 2
    assert "--verify only applies to the speculative methods" in capsys.readouterr().err


def test_bench_records_a_lossy_method_with_its_fidelity():
    from jspec import bench
    cfg, params, _, _, _, _ = ts.setup("qwen3")
    m = jspec.Model(params=params, cfg=cfg, tokenizer=CharTokenizer(), path="")
    # the lossy method first: its fidelity is filled in once its dense twin has run
    lossy, dense = bench.split_methods("vegas:gamma=2,budget=8,min_tokens=8,verify=dustin,verify_budget=16,"
                                       "verify_sink=2,verify_window=4,vegas:gamma=2,budget=8,min_tokens=8")
    assert dict(lossy.knobs)["verify"] == "dustin" and bench.dense_twin(lossy, [lossy, dense]) is dense
    recs = bench.bench(m, methods=[lossy, dense], lengths=[60], batches=[2], workload="continue", new=10,
                       lossless_check=True, log=lambda *a: None)
    by = {r["method"]: r for r in recs}
    rec = by[lossy.label]
    assert by["ar"]["lossless"] and by[dense.label]["lossless"] and rec["lossless"] is False
    assert rec["knobs"]["verify"]["kind"] == "dustin" and 0 <= rec["rows_identical_to_ar"] <= 1
    f = rec["fidelity"]
    assert f["reference"] == dense.label and 0 <= f["rows_identical"] <= 1
    assert 0 <= f["tokens_to_first_divergence_mean"] <= 10
    summary = bench.summarize(recs, [])["L60_B2"]
    assert summary["best"] == dense.label and summary["best_lossy"] == lossy.label
    with pytest.raises(bench.BenchError, match="unknown knob"):
        bench.MethodSpec.parse("vegas:verify_frob=1")
