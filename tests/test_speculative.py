"""Self-speculative decoding (jspec/speculative) on tiny random float32 models.

- greedy output is token-identical to plain greedy decoding (`prefill.prefill` + tests/reference_decode.py) for
  every method,
  two model families, a ragged batch, a budget so small that most drafts are rejected, and a stop token;
- with a budget covering the whole context every draft step is exact full attention, so every draft is
  accepted: this checks the selections themselves (identity alone cannot: verification repairs anything);
- sampled output follows the target distribution (chi-square on the tokens a round emits);
- the pure-function API inside a user's jit, `jspec.generate(method=...)`, and input errors.

Shapes (batch, padding, capacity, max_new_tokens) are shared so each jitted function compiles once per
configuration.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jspec
from conftest import CharTokenizer, damped, spy_attention_reads
from jspec import prefill as gen
from jspec import kv_cache, layers, model, sampling, speculative
from jspec.attention import AttnImpl
from jspec.config import ModelConfig, RopeScaling, SamplingConfig
from jspec.speculative import SpecConfig
from reference_decode import decode as plain_decode

GREEDY = SamplingConfig()
NEW = 20
CAPACITY = 80
PROMPT_LENGTHS = (3, 29, 17)     # ragged; the 3-token prompt fits in any budget for its first rounds


def tiny(arch, **kw):
    base = dict(arch=arch, vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                ffn_dim=96, rope_theta=10000.0, dtype="float32", max_position=256, eos_token_ids=())
    if arch == "llama":
        base["rope_scaling"] = RopeScaling(factor=8.0, original_max_position=32)
    if arch == "qwen3":
        base["tie_embeddings"] = True
    base.update(kw)
    return ModelConfig(**base)


VARIANTS = {
    "streaming": dict(method="streaming", sink=2),
    "quest": dict(method="quest", page_size=4),
    "vegas": dict(method="vegas"),
    "vegas-all-logits": dict(method="vegas", collect="all", score_mode="logits"),
    "vegas-sort": dict(method="vegas", topk="sort"),   # score-ordered selections by lax.top_k (vegas: "select")
    "vegas-pages": dict(method="vegas", select_page=4),   # whole aligned pages of 4 slots
    "vegas-lookup": dict(method="vegas", lookup=4),       # + 4 prompt-lookup tokens after the drafts
    "quest-lookup": dict(method="quest", page_size=4, lookup=2),
}
# llama: a budget of 8 slots, so most drafts are rejected (identity must not depend on draft quality).
# qwen3: a budget covering the whole cache, so every draft step must be exact full attention and every
# draft accepted -- this checks the selections themselves, which identity alone cannot (verification
# repairs any draft).
BUDGETS = {"llama": 8, "qwen3": CAPACITY}


def variant(arch, name):
    return SpecConfig(gamma=3, budget=BUDGETS[arch], **VARIANTS[name])


@functools.lru_cache(maxsize=None)
def setup(arch):
    """Model, prompts and the plain-decoding reference (once per family)."""
    cfg = tiny(arch)
    params = model.init_params(cfg, jax.random.key(1), scale=0.3)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(4, cfg.vocab_size, n).tolist() for n in PROMPT_LENGTHS]
    tokens, lengths = gen.pad_prompts(prompts, multiple=32)
    cache = kv_cache.init(cfg, batch=len(prompts), capacity=CAPACITY)
    logits, cache = gen.prefill(params, cfg, jnp.asarray(tokens), jnp.asarray(lengths), cache)
    free, _, _ = plain_decode(params, cfg, GREEDY, cache, logits, jax.random.key(0), max_new_tokens=NEW)
    free = np.asarray(free)
    # A stop token that row 0 emits early and row 1 never does: one row stops, another runs to NEW.
    stop = next((int(t) for t in free[0, 3:10] if t not in free[1]), int(free[0, 3]))
    ref = []
    for row in free.tolist():   # plain decoding keeps the stop token and ends there (tests/test_model.py)
        ref.append(row[:row.index(stop) + 1] if stop in row else row)
    return cfg, params, jnp.asarray(tokens), jnp.asarray(lengths), stop, ref


def spec_generate(cfg, params, spec, tokens, lengths, *, stops=(), samp=GREEDY, key=0, new=NEW, capacity=CAPACITY):
    state = speculative.init(params, cfg, spec, tokens, lengths, capacity)
    out, n_out, st, _ = speculative.run_donating(params, cfg, spec, samp, state, jax.random.key(key), new,
                                                 stop_tokens=stops)
    out, n_out = np.asarray(out), np.asarray(n_out)
    return [out[b, :n_out[b]].tolist() for b in range(len(n_out))], out, st


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("arch", list(BUDGETS))
def test_greedy_identical_to_plain_decoding(arch, name):
    cfg, params, tokens, lengths, stop, ref = setup(arch)
    spec = variant(arch, name)
    got, out, st = spec_generate(cfg, params, spec, tokens, lengths, stops=(stop,))
    assert got == ref
    assert all((out[b, len(g):] == -1).all() for b, g in enumerate(got))   # a stopped row stops changing
    assert any(len(r) < NEW for r in ref) and any(len(r) == NEW for r in ref)    # the stop case is exercised
    hist = np.asarray(st.accept_hist)
    if BUDGETS[arch] < CAPACITY:
        assert st.tau() < 2.0 and hist[:, 0].sum() > 0       # mostly rejected drafts
    else:
        assert hist[:, :spec.gamma].sum() == 0, hist          # exact drafts: every round accepts all gamma
    # Every round emits n_accepted + 1 tokens; the first token comes from the prefill.
    assert hist.shape[1] == spec.gamma + spec.lookup + 1
    emitted = (hist * np.arange(1, hist.shape[1] + 1)).sum(1)
    assert (emitted >= np.array([len(r) for r in ref]) - 1).all()
    assert (np.asarray(st.rounds) == hist.sum(1)).all()


def _looping_setup():
    """A tiny model whose next token depends mostly on the current one (damped layers), so its greedy output
    falls into loops, and its plain-decoding reference: a prompt-lookup chain is then accepted past gamma."""
    cfg = tiny("qwen3")
    params = damped(model.init_params(cfg, jax.random.key(1), scale=0.3), 0.006)
    unit = np.random.default_rng(9).integers(4, cfg.vocab_size, 6).tolist()
    prompts = [unit * 5, (unit * 4)[3:], np.random.default_rng(3).integers(4, cfg.vocab_size, 17).tolist()]
    tokens, lengths = gen.pad_prompts(prompts, multiple=32)
    tokens, lengths = jnp.asarray(tokens), jnp.asarray(lengths)
    cache = kv_cache.init(cfg, batch=len(prompts), capacity=CAPACITY)
    logits, cache = gen.prefill(params, cfg, tokens, lengths, cache)
    free, _, _ = plain_decode(params, cfg, GREEDY, cache, logits, jax.random.key(0), max_new_tokens=NEW)
    return cfg, params, prompts, tokens, lengths, np.asarray(free)


@pytest.mark.parametrize("name", ["vegas", "streaming", "vegas-pages"])
def test_lookup_chain_is_accepted_past_gamma_and_keeps_greedy_output(name):
    """With a lookup chain of 5 after gamma=2 drafts: greedy output equals plain decoding's, some rounds accept
    more than gamma tokens (only the lookup tokens can give those), and the token record holds each row's
    prompt + emitted text at its cache slots."""
    cfg, params, prompts, tokens, lengths, free = _looping_setup()
    kw = dict(VARIANTS[name])
    spec = SpecConfig(gamma=2, budget=8, lookup=5, **kw)
    assert spec.depth == 7 and spec.capacity_margin() == 8
    state = speculative.init(params, cfg, spec, tokens, lengths, CAPACITY)
    out, n_out, st, final = speculative.run_donating(params, cfg, spec, GREEDY, state, jax.random.key(0), NEW)
    np.testing.assert_array_equal(np.asarray(out), free)
    hist = np.asarray(st.accept_hist)
    assert hist.shape[1] == 8 and hist[:, 3:].sum() > 0, hist
    assert hist[:2, 3:].sum() >= hist[:2].sum() // 2, hist   # the repeating rows mostly accept past gamma
    rec, cache_len = np.asarray(final.tokens), np.asarray(final.cache.lengths)
    for b, p in enumerate(prompts):   # the cache holds prompt + every emitted token but the newest (and the
        text = p + free[b].tolist()      # last round's accepted tokens past max_new_tokens, not emitted)
        assert cache_len[b] >= len(text) - 1
        assert rec[b, :len(text) - 1].tolist() == text[:-1]


def test_lookup_config_and_errors():
    assert SpecConfig("vegas", gamma=4, lookup=8).depth == 12
    assert SpecConfig("vegas", gamma=4, lookup=8).capacity_margin() == 13
    from jspec.speculative import vegas
    assert vegas.tail_slots(SpecConfig("vegas", gamma=4, lookup=8)) == 2 * 4 + 8
    with pytest.raises(ValueError, match="'ar'"):
        SpecConfig("ar", lookup=4)
    with pytest.raises(ValueError, match="lookup=-1"):
        SpecConfig("vegas", lookup=-1)
    cfg, params, _, tokens, lengths, _ = _looping_setup()
    cache = kv_cache.init(cfg, batch=tokens.shape[0], capacity=CAPACITY)
    logits, cache = gen.prefill(params, cfg, tokens, lengths, cache)
    last = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]
    with pytest.raises(ValueError, match="prompt_tokens"):
        speculative.prepare(params, cfg, SpecConfig("vegas", lookup=3), cache, logits, last)


DAMP = 0.2   # the lookup case's model: drafts accepted ~40% of rounds, the first lookup token in ~1/3 of those


@pytest.mark.parametrize("gamma,lookup", [(3, 0), (1, 2)])
def test_sampled_rounds_follow_the_target_distribution(gamma, lookup):
    """Chi-square: the 2nd and 3rd emitted tokens (the first round's output and, after a rejection, the next
    round's) have the target's marginal distribution, computed exactly by enumerating the earlier tokens.
    (1, 2): one draft then two prompt-lookup tokens (point-mass drafts), so the 3rd token is a lookup
    token's accept-or-residual outcome in every round that accepted the draft. There the model is damped (the
    next token leans on the current one) and the prompt is its own greedy text, so the lookup's proposals
    are likely but not certain: both outcomes occur often.
    Marginals only, and with gamma = 3 a round's bonus token is never among the first 3 tokens: the joint law
    with the bonus observed, and negative controls, are in tests/test_sampling_engine.py."""
    cfg = tiny("qwen3", vocab_size=16, d_model=32, ffn_dim=48)
    params = model.init_params(cfg, jax.random.key(3), scale=0.6)
    samp = SamplingConfig(temperature=0.9, top_k=12)
    N = 8000
    prompt = np.random.default_rng(7).integers(0, 16, 12)
    if lookup:
        params = damped(params, DAMP)
        cache = kv_cache.init(cfg, batch=1, capacity=16)
        logits, cache = gen.prefill(params, cfg, jnp.asarray(prompt[None, :1], jnp.int32), jnp.array([1]), cache)
        text, _, _ = plain_decode(params, cfg, GREEDY, cache, logits, jax.random.key(0), max_new_tokens=11)
        prompt = np.concatenate([prompt[:1], np.asarray(text)[0]])
    tokens = jnp.asarray(np.tile(prompt, (N, 1)), jnp.int32)
    lengths = jnp.full((N,), 12, jnp.int32)
    spec = SpecConfig("vegas", gamma=gamma, budget=3, lookup=lookup)
    _, out, st = spec_generate(cfg, params, spec, tokens, lengths, samp=samp, key=11, new=3, capacity=20)
    hist = np.asarray(st.accept_hist).sum(0)
    assert hist[0] > 0.05 * hist.sum() and hist[1:].sum() > 0.2 * hist.sum(), hist   # q differs from p
    if lookup:   # rounds that accepted the draft and then rejected / accepted the first lookup token
        assert hist[1] > 0.03 * hist.sum() and hist[2:].sum() > 0.03 * hist.sum(), hist

    # Exact target marginals: p(t0), p(t1) = sum_t0 p(t0) p(t1|t0), p(t2) likewise over (t0, t1).
    V = cfg.vocab_size

    # One forward over all V*V continuations prompt + (t0, t1); row t0*V + t1.
    seqs = np.concatenate([np.tile(prompt, (V * V, 1)), np.repeat(np.arange(V), V)[:, None],
                           np.tile(np.arange(V), V)[:, None]], 1)
    cache = kv_cache.init(cfg, batch=V * V, capacity=seqs.shape[1])
    logits = jax.jit(model.forward, static_argnums=1)(params, cfg, jnp.asarray(seqs, jnp.int32), cache)[0]
    p = np.asarray(sampling.process_logits(logits[:, -3:], samp), np.float64)    # [V*V, 3, V]
    p0 = p[0, 0]
    p1 = p[::V, 1]                                                        # [t0, V]
    p2 = p[:, 2].reshape(V, V, V)                                         # [t0, t1, V]
    marg = [p0, p0 @ p1, np.einsum("a,ab,abc->c", p0, p1, p2)]
    for pos, p in enumerate(marg):
        counts = np.bincount(out[:, pos], minlength=V)
        assert counts[p == 0].sum() == 0                                  # top-k removed tokens never appear
        keep = p * N >= 5
        obs = np.append(counts[keep], counts[~keep].sum())
        exp = np.append(p[keep], p[~keep].sum()) * N
        obs, exp = obs[exp > 0], exp[exp > 0]
        exp = exp * obs.sum() / exp.sum()
        assert stats.chisquare(obs, exp).pvalue > 1e-3, (pos, obs, exp.round(1))


def test_pure_api_inside_a_user_jit():
    cfg, params, tokens, lengths, _, _ = setup("llama")
    spec = variant("llama", "streaming")

    @functools.partial(jax.jit, static_argnames=("cfg", "spec"))
    def user_fn(params, tokens, lengths, key, cfg, spec):
        state = speculative.init(params, cfg, spec, tokens, lengths, CAPACITY)
        return speculative.run(params, cfg, spec, GREEDY, state, key, NEW)

    out, n_out, st = user_fn(params, tokens, lengths, jax.random.key(0), cfg=cfg, spec=spec)
    got, _, _ = spec_generate(cfg, params, spec, tokens, lengths)
    assert [np.asarray(out)[b, :int(n_out[b])].tolist() for b in range(3)] == got
    assert st.accept_hist.shape == (3, spec.gamma + 1)


def test_prepare_reuses_a_prefilled_and_decoded_cache():
    """One prefill serves several methods (what a benchmark comparing methods does): decode, roll back, prepare, run."""
    cfg, params, tokens, lengths, stop, ref = setup("llama")
    cache = kv_cache.init(cfg, batch=3, capacity=CAPACITY)
    logits, cache = gen.prefill(params, cfg, tokens, lengths, cache)
    _, _, cache = plain_decode(params, cfg, GREEDY, cache, logits, jax.random.key(0), max_new_tokens=NEW)
    last = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]
    spec = variant("llama", "vegas")
    state = speculative.prepare(params, cfg, spec, kv_cache.rollback(cache, lengths), logits, last)
    out, n_out, _, _ = speculative.run_donating(params, cfg, spec, GREEDY, state, jax.random.key(0), NEW,
                                                stop_tokens=(stop,))
    assert [np.asarray(out)[b, :int(n_out[b])].tolist() for b in range(3)] == ref


def test_generate_api_fills_speculative_stats_and_rejects_bad_requests():
    cfg, params, _, _, _, _ = setup("qwen3")
    m = jspec.Model(params=params, cfg=cfg, tokenizer=CharTokenizer(), path="")
    prompts = [[5, 6, 7, 8, 9], list(range(10, 40))]
    ar = jspec.generate(m, prompts, method="ar", max_new_tokens=12)
    out = jspec.generate(m, prompts, method="vegas", max_new_tokens=12, gamma=2, budget=8, min_tokens=8)
    assert out.tokens == ar.tokens
    s = out.stats
    assert s.method == "vegas" and s.knobs["gamma"] == 2 and len(s.accept_hist) == 3
    assert s.tau == pytest.approx(sum((n + 1) * c for n, c in enumerate(s.accept_hist)) / sum(s.accept_hist))
    assert sum(s.rounds) == sum(s.accept_hist)
    assert len(s.tau_per_sequence) == 2 and s.tau == pytest.approx(np.average(s.tau_per_sequence, weights=s.rounds))
    with pytest.raises(jspec.InputError, match="unknown method 'medusa'"):
        jspec.generate(m, prompts, method="medusa")
    with pytest.raises(jspec.InputError, match="gamma=0"):
        jspec.generate(m, prompts, method="streaming", gamma=0)
    with pytest.raises(jspec.InputError, match="budget=2 must be >= sink=4"):
        jspec.generate(m, prompts, method="streaming", budget=2)
    with pytest.raises(jspec.InputError, match="gamma \\+ 1 = 5 cache slots"):
        jspec.generate(m, prompts, method="vegas", max_new_tokens=10, capacity=40)
    with pytest.raises(jspec.InputError, match="only apply to speculative"):
        jspec.generate(m, prompts, method="ar", collect="all")


SAMPLED = SamplingConfig(temperature=0.9, top_k=20, top_p=0.95)


@pytest.mark.parametrize("samp", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_ar_through_the_engine_equals_plain_decoding(samp):
    """`generate(method="ar")` runs the engine with no drafts; its tokens equal the reference loop's
    (tests/reference_decode.py, no engine code) token for token: greedy, and sampled with the same seed (an "ar"
    round splits its key as a plain decoding step does). Ragged prompts, a stop token ending some rows early, a
    cache of exactly prompt + new tokens ("ar" needs no margin)."""
    cfg, params, _, _, _, _ = setup("llama")
    prompts = [np.random.default_rng(5).integers(4, cfg.vocab_size, n).tolist() for n in PROMPT_LENGTHS]
    tokens, lengths = gen.pad_prompts(prompts)   # as generate pads them, into its default capacity (128)

    def reference(stops):
        logits, cache = gen.prefill(params, cfg, jnp.asarray(tokens), jnp.asarray(lengths),
                                    kv_cache.init(cfg, batch=len(prompts), capacity=128))
        out, n_out, _ = plain_decode(params, cfg, samp, cache, logits, jax.random.key(3), max_new_tokens=NEW,
                                     stop_tokens=stops)
        return [out[b, :n_out[b]].tolist() for b in range(len(prompts))]

    free = reference(())
    stop = next(t for t in free[0][2:] if all(t not in row for row in free[1:]))   # ends row 0 only
    ref = reference((stop,))
    assert len(ref[0]) < NEW and ref[0][-1] == stop and ref[1:] == free[1:]
    kw = dict(max_new_tokens=NEW, temperature=samp.temperature, top_k=samp.top_k, top_p=samp.top_p, seed=3)
    m = jspec.Model(params=params, cfg=dataclasses.replace(cfg, eos_token_ids=(stop,)), tokenizer=CharTokenizer(),
                    path="")
    new = jspec.generate(m, prompts, **kw)
    assert new.tokens == ref
    assert jspec.generate(m, prompts, capacity=max(PROMPT_LENGTHS) + NEW, **kw).tokens == ref
    s = new.stats
    assert (s.method, s.tau, s.accept_hist, s.knobs) == ("ar", 1.0, None, None) and s.tokens_per_s > 0
    assert s.new_tokens == [len(t) for t in new.tokens] and s.prompt_tokens == list(PROMPT_LENGTHS)
    assert s.decode_s > 0 and s.prefill_s > 0
    if not samp.greedy:   # the seed matters (a sampler ignoring it would pass the identity alone)
        assert jspec.generate(m, prompts, **dict(kw, seed=4)).tokens != new.tokens


def test_cli_generate_passes_speculative_knobs(monkeypatch, capsys):
    from jspec import cli
    cfg, params, _, _, _, _ = setup("qwen3")
    monkeypatch.setattr(jspec, "load",
                        lambda name: jspec.Model(params=params, cfg=cfg, tokenizer=CharTokenizer(), path=""))
    argv = ["generate", "--prompt", "speculate!", "--batch", "2", "--max-new-tokens", "12", "--json"]
    assert cli.main(argv + ["--method", "vegas", "--gamma", "2", "--budget", "8", "--min-tokens", "8"]) == 0
    import json
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["stats"]["knobs"]["gamma"] == 2 and res["stats"]["tau"] >= 1
    assert cli.main(argv + ["--method", "ar"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tokens"] == res["tokens"]
    assert cli.main(argv + ["--method", "streaming", "--budget", "2"]) == 2
    assert "budget=2 must be >= sink=4" in capsys.readouterr().err
    assert cli.main(argv + ["--method", "ar", "--collect", "all"]) == 2
    capsys.readouterr()
    assert cli.main(argv + ["--method", "vegas", "--gamma", "2", "--budget", "8", "--min-tokens", "8",
                            "--topk", "sort"]) == 0
    sel = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["stats"]["knobs"]["topk"] == "select"   # the default
    assert sel["stats"]["knobs"]["topk"] == "sort" and sel["tokens"] == res["tokens"]
    assert cli.main(argv + ["--method", "vegas", "--gamma", "2", "--budget", "8", "--min-tokens", "8",
                            "--select-page", "4"]) == 0
    pg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["stats"]["knobs"]["select_page"] == 1 and pg["stats"]["knobs"]["select_page"] == 4
    assert pg["tokens"] == res["tokens"]
    assert cli.main(argv + ["--method", "vegas", "--budget", "8", "--select-page", "3"]) == 2
    assert "multiple of select_page=3" in capsys.readouterr().err
    assert cli.main(argv[:-1] + ["--method", "vegas", "--gamma", "2", "--budget", "8", "--min-tokens", "8"]) == 0
    lo, hi = min(res["stats"]["tau_per_sequence"]), max(res["stats"]["tau_per_sequence"])
    assert f"(per sequence {lo:.2f}-{hi:.2f})" in capsys.readouterr().out   # the text summary line
    seen = []   # --exact hands generate an exact-mode AttnImpl
    real_generate = jspec.generate
    monkeypatch.setattr(jspec, "generate", lambda *a, **k: seen.append(k["impl"]) or real_generate(*a, **k))
    assert cli.main(argv + ["--method", "vegas", "--gamma", "2", "--budget", "8", "--min-tokens", "8", "--exact"]) == 0
    assert seen[-1].exact and json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tokens"] == res["tokens"]
    assert cli.main(argv + ["--method", "vegas", "--gamma", "2", "--budget", "8", "--min-tokens", "8", "--slots", "1"]) == 0
    served = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert served["tokens"] == res["tokens"] and served["stats"]["batch"] == 1
    assert cli.main(argv + ["--method", "vegas", "--gamma", "2", "--budget", "8", "--min-tokens", "8", "--slots", "2",
                            "--refill", "2"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tokens"] == res["tokens"]
    calls = []   # --staged reaches serve
    real_serve = jspec.speculative.serve
    monkeypatch.setattr(jspec.speculative, "serve", lambda *a, **k: calls.append(k["staged"]) or real_serve(*a, **k))
    assert cli.main(argv + ["--method", "vegas", "--gamma", "2", "--budget", "8", "--min-tokens", "8", "--slots", "2",
                            "--refill", "2", "--staged"]) == 0
    assert calls == [True] and json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tokens"] == res["tokens"]
    assert cli.main(argv + ["--method", "vegas", "--refill", "2"]) == 2
    assert "refill and staged apply" in capsys.readouterr().err
    assert cli.main(argv + ["--method", "vegas", "--staged"]) == 2
    assert "refill and staged apply" in capsys.readouterr().err
    assert cli.main(argv + ["--method", "ar", "--slots", "2"]) == 0      # plain decoding through the slots
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plain["tokens"] == res["tokens"] and plain["stats"]["method"] == "ar"


def test_dense_kernels_inside_the_speculative_loop():
    """AttnImpl(dense_rows=...) in the engine (Pallas kernels, interpret mode on CPU): the one-token draft and
    ar steps and the (gamma+1)-token verification on the fused dense kernels; vegas' greedy output equals
    plain greedy decoding's under the same impl and the XLA path's."""
    cfg = ModelConfig(arch="llama", vocab_size=96, d_model=96, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=64,
                      ffn_dim=96, dtype="float32", max_position=256, eos_token_ids=(3,))
    params = model.init_params(cfg, jax.random.key(4), scale=0.3)
    B, P, new = 16, 20, 6
    tokens = jax.random.randint(jax.random.key(5), (B, P), 4, cfg.vocab_size)
    lengths = jnp.full((B,), P, jnp.int32)
    impl = AttnImpl(backend="pallas", interpret=True, dense_rows=B * 3)
    assert isinstance(layers.for_step(params, cfg, B, 3, impl), layers.Fused)
    spec = SpecConfig("vegas", gamma=2, budget=8, min_tokens=8)
    cap = 40
    out = {}
    for name, im in (("dense", impl), ("xla", AttnImpl(backend="xla"))):
        logits, cache = gen.prefill(params, cfg, tokens, lengths, kv_cache.init(cfg, batch=B, capacity=cap), impl=im)
        ar, _, _ = plain_decode(params, cfg, GREEDY, cache, logits, jax.random.key(0), max_new_tokens=new, impl=im)
        state = speculative.init(params, cfg, spec, tokens, lengths, cap, impl=im)
        sp, _, _ = speculative.run(params, cfg, spec, GREEDY, state, jax.random.key(0), new, impl=im)
        out[name] = (np.asarray(ar), np.asarray(sp))
    np.testing.assert_array_equal(out["dense"][1], out["dense"][0])
    np.testing.assert_array_equal(out["dense"][0], out["xla"][0])


@pytest.mark.parametrize("method", ["vegas", "streaming"])
def test_donated_cache_is_updated_in_place_not_copied(method):
    """prepare / run_donating must not hold a second copy of the KV cache: XLA's temp memory for the programs
    (compiled, not run; XLA attention path) stays below one cache. A fused gather once kept the donated cache
    alive through vegas' prepare forward and doubled its memory (Llama-3-8B shapes at 32K x 16 ran out of
    memory on one H200)."""
    cfg = ModelConfig(arch="llama", vocab_size=128, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64,
                      ffn_dim=128, rope_theta=10000.0, max_position=8192, dtype="bfloat16", eos_token_ids=())
    B, cap = 2, 8192
    impl = AttnImpl(backend="xla")
    spec = SpecConfig(method, gamma=4, budget=128)
    params = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
    cache = jax.eval_shape(lambda: kv_cache.init(cfg, batch=B, capacity=cap))
    logits = jax.ShapeDtypeStruct((B, cfg.vocab_size), jnp.float32)
    last = jax.ShapeDtypeStruct((B,), jnp.int32)
    cache_bytes = 2 * cfg.n_layers * B * cap * cfg.n_kv_heads * cfg.head_dim * 2
    prep = speculative.prepare.lower(params, cfg, spec, cache, logits, last, impl=impl).compile().memory_analysis()
    state = jax.eval_shape(lambda p, c, lg, t: speculative.prepare(p, cfg, spec, c, lg, t, impl=impl),
                           params, cache, logits, last)
    run = speculative.run_donating.lower(params, cfg, spec, GREEDY, state, jax.random.key(0), 8,
                                         impl=impl).compile().memory_analysis()
    for name, ma in (("prepare", prep), ("run_donating", run)):
        assert ma.alias_size_in_bytes >= cache_bytes, (name, ma.alias_size_in_bytes)   # the cache is donated
        assert ma.temp_size_in_bytes < cache_bytes, (name, ma.temp_size_in_bytes, cache_bytes)


def test_per_sequence_tau_and_straggler():
    """tau_per_sequence from a hand-built histogram; its round-weighted mean is tau(); the straggler factor is
    the slowest row's rounds over the mean (bench records)."""
    from bench.common import row_stats
    from jspec.speculative.engine import SpecStats

    hist = np.array([[2, 0, 1], [0, 0, 3], [1, 1, 0]], np.int32)   # rows: (1+1+3)/3, 9/3, (1+2)/2
    st = SpecStats(rounds=jnp.asarray(hist.sum(1)), accept_hist=jnp.asarray(hist))
    np.testing.assert_allclose(st.tau_per_sequence(), [5 / 3, 3.0, 1.5])
    np.testing.assert_allclose(np.average(st.tau_per_sequence(), weights=hist.sum(1)), st.tau())
    r = row_stats(st)
    assert r["tau_row_min"] == 1.5 and r["rounds_mean"] == round(8 / 3, 2)
    assert r["straggler"] == round(3 / (8 / 3), 3) and len(r["tau_rows"]) == 3


@pytest.mark.parametrize("name", ["vegas", "quest"])
def test_finished_rows_stop_reading_their_caches(monkeypatch, name):
    """A round with row 1 done: every draft and verification attention call lets that row read at most
    gamma + 1 slots (no selections, no context; it reads more when live), the live rows as much as before."""
    from jspec.speculative import engine
    cfg, params, tokens, lengths, _, _ = setup("llama")
    spec = variant("llama", name)
    state = speculative.init(params, cfg, spec, tokens, lengths, CAPACITY)
    st = engine.start(spec, GREEDY, state, jax.random.key(0), NEW)
    reads = spy_attention_reads(monkeypatch)
    got = {}
    for done in ([False, False, False], [False, True, False]):
        reads.clear()
        with jax.disable_jit():
            engine.round_(params, cfg, spec, GREEDY, st.replace(done=jnp.array(done)), NEW, (), AttnImpl())
        assert {k for k, _ in reads} == {"full", "sparse"} and len(reads) == cfg.n_layers * (spec.gamma + 1)
        got[done[1]] = np.stack([n for _, n in reads])
    np.testing.assert_array_equal(got[True][:, [0, 2]], got[False][:, [0, 2]])
    assert (got[True][:, 1] <= spec.gamma + 1).all() and (got[False][:, 1] > spec.gamma + 1).all(), got
