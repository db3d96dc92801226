"""Quest's page summaries stay exact when prompt-lookup tokens make rounds accept past gamma.

A round of quest with `lookup=G` verifies gamma drafts + G lookup tokens and can accept all of them: up to
gamma + G + 1 new cache slots, so it can complete more pages than gamma + 1 tokens span. Every page that a
round completes must get its min/max key summary recomputed (jspec/speculative/quest.py `update`), else
later draft steps score it by the junk or zeros its slots held before (draft quality only: the output stays
lossless, so greedy identity cannot catch it; this checks the summaries themselves).
"""
import jax
import jax.numpy as jnp
import numpy as np

from conftest import damped
from jspec import prefill as gen
from jspec import kv_cache, model, speculative
from jspec.config import ModelConfig, SamplingConfig
from jspec.speculative import SpecConfig

GREEDY = SamplingConfig()
NEW = 24
CAPACITY = 96


def test_every_complete_page_summary_matches_the_cache_after_lookup_rounds():
    # A tiny model whose next token depends mostly on the current one (damped layers): its greedy text loops,
    # so the lookup chain is accepted and rounds take in up to gamma + lookup + 1 = 8 tokens (two pages of 4).
    cfg = ModelConfig(arch="qwen3", vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                      ffn_dim=96, rope_theta=10000.0, dtype="float32", max_position=256, eos_token_ids=(),
                      tie_embeddings=True)
    params = damped(model.init_params(cfg, jax.random.key(1), scale=0.3), 0.006)
    unit = np.random.default_rng(9).integers(4, cfg.vocab_size, 6).tolist()
    # Ragged prompts, so rows meet page boundaries at different offsets within a round's block.
    prompts = [unit * 5, (unit * 4)[3:], (unit * 3)[1:], np.random.default_rng(3).integers(4, 96, 17).tolist()]
    tokens, lengths = gen.pad_prompts(prompts, multiple=32)
    page = 4
    spec = SpecConfig("quest", gamma=2, budget=8, page_size=page, lookup=5)
    state = speculative.init(params, cfg, spec, jnp.asarray(tokens), jnp.asarray(lengths), CAPACITY)
    out, n_out, st, final = speculative.run_donating(params, cfg, spec, GREEDY, state, jax.random.key(0), NEW)

    hist = np.asarray(st.accept_hist)
    # Rounds that accepted lookup tokens and so wrote more than ceil((gamma + 1) / page) pages' worth.
    assert hist[:, spec.gamma + 2:].sum() > 0, hist
    k = np.asarray(final.cache.k)                          # [L, B, S, K, H]
    mins, maxs = np.asarray(final.method.mins), np.asarray(final.method.maxs)   # [L, B, P, K, H]
    cache_len = np.asarray(final.cache.lengths)
    checked = 0
    for b in range(len(prompts)):
        for p in range(int(cache_len[b]) // page):          # every page all of whose slots are accepted
            keys = k[:, b, p * page:(p + 1) * page]
            np.testing.assert_array_equal(mins[:, b, p], keys.min(axis=1), err_msg=f"row {b} page {p} min")
            np.testing.assert_array_equal(maxs[:, b, p], keys.max(axis=1), err_msg=f"row {b} page {p} max")
            checked += 1
    assert checked >= sum(len(p) + NEW for p in prompts) // page - len(prompts)
