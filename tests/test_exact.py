"""bf16 exact mode (`AttnImpl(exact=True)`, docs/methods.md "Lossless"): a row is rounded the same whether its
step carries one row or many, so every lossless method's greedy output equals `ar`'s bit for bit.

- kernels (Pallas, interpret mode on CPU): the rows of a T-row `flash_scores(exact=True)` step equal T one-token
  steps at the same positions, bit for bit (T up to 12, G = 1, 3, 4, 8, ragged lengths, split-K, score rows,
  more rows than one program holds); `tree_attention(exact=True)` gives every node what a one-token step gives
  over a cache holding its ancestors at the slots that follow the prefix (random trees, a root chain as lookup
  tokens add, trees across key tiles and splits). Negative controls: the default kernels do not;
- the model: a T-token step's logits equal T one-token steps' logits, bit for bit, also over caches of another
  capacity (ar's and a method's differ by the method's margin);
- end to end: greedy bf16 output of vegas (gamma 6 with lookup tokens), streaming and quest (gamma 6) and
  LongSpec (a tree plus a lookup chain, tiny random drafter) equals `ar`'s token for token, both in exact mode.
  The same test with the earlier exact mode (`dense_rows` alone: row-independent GEMMs, default attention
  tiles) differs from ar in a row for each of the four methods at this seed (checked when this was written).

What CPU runs can and cannot see: interpret mode executes the kernels' tile loops, masks, split-K and merges as
written, so a schedule that depends on the step's rows (other key tiles, another split plan, an LSE merge of a
tree) shows here. How the GPU's MMA units and Triton's layouts round a fixed tile shape does not: exact mode keeps
every tile shape, warp count and reduction of a row the one-token step's; the GPU check is `jspec bench --exact`
(bench/results/exact64_h100.json).
"""
import dataclasses
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from _kernel_utils import poison_after, random_qkv, random_tree_mask
from jspec import prefill as gen
from jspec import kv_cache, layers, model, speculative
from jspec.attention import AttnImpl
from jspec.config import ModelConfig, SamplingConfig
from jspec.drafter import init_drafter_params
from jspec.speculative import SpecConfig
from jspec.speculative import tree as tree_lib
from reference_decode import decode as plain_decode

fs = importlib.import_module("pallas_kernels.flash_scores")
ta = importlib.import_module("pallas_kernels.tree_attention")
BF16 = jnp.bfloat16
GREEDY = SamplingConfig()
SMALL = pk.BlockSizes(block_m=64, block_k=16)   # many key tiles (and auto split-K) on tiny caches


@functools.partial(jax.jit, static_argnames=("exact", "bs", "rows"))
def _flash(q, k, v, kv_len, *, exact, bs, rows=()):
    return fs.flash_scores_kernel(q, k, v, kv_len, interpret=True, exact=exact, block_sizes=bs, score_rows=rows)[0]


@functools.partial(jax.jit, static_argnames=("exact", "bs"))
def _tree(q, k, v, prefix_len, mask, *, exact, bs):
    return ta.tree_attention_kernel(q, k, v, prefix_len, mask, interpret=True, exact=exact, block_sizes=bs)[0]


def _rows_differing(full, one_token):
    """Rows (b, t) where the T-row result differs from the one-token result in any bit."""
    full, one = np.asarray(full.astype(jnp.float32)), np.asarray(one_token.astype(jnp.float32))
    return [(b, t) for b in range(full.shape[0]) for t in range(full.shape[1])
            if not np.array_equal(full[b, t], one[b, t])]


def _flash_rows(seed, B, T, N, K, S, bs, exact, rows=()):
    q, k, v = random_qkv(seed, B, T, N, K, 64, S, BF16)
    kv_len = np.random.default_rng(seed).integers(T + 20, S + 1, size=B)
    kv_len[0] = S
    k, v = poison_after(k, v, kv_len, np.nan)          # never read: masked loads give zeros
    kv_len = jnp.asarray(kv_len, jnp.int32)
    full = _flash(q, k, v, kv_len, exact=exact, bs=bs, rows=rows)
    one = jnp.concatenate([_flash(q[:, t:t + 1], k, v, kv_len - T + t + 1, exact=exact, bs=bs)
                           for t in range(T)], axis=1)
    return _rows_differing(full, one)


# (B, T, N, K, S, block sizes): G = 1, 3, 4, 8; one to two programs of row blocks; auto and explicit split-K.
FLASH_CASES = [
    (2, 12, 2, 2, 160, SMALL),                                   # G=1, 12 rows
    (3, 12, 6, 2, 200, SMALL),                                   # G=3, 36 rows: 3 sub-blocks (+1 padding)
    (2, 9, 8, 2, 144, pk.BlockSizes(block_m=64, block_k=32, num_splits=3)),   # G=4
    (2, 12, 8, 1, 176, SMALL),                                   # G=8, 96 rows: two programs of 64
]


@pytest.mark.parametrize("B,T,N,K,S,bs", FLASH_CASES)
def test_flash_rows_do_not_depend_on_the_steps_rows(B, T, N, K, S, bs):
    assert _flash_rows(100 + T + N, B, T, N, K, S, bs, exact=True) == []


def test_flash_rows_with_score_rows_and_default_tiles():
    """Vegas' verification (Collect-2-Query score rows) at the real default tiles: 24 packed rows, where the
    default path takes 64-key tiles against a one-token step's 128 (the negative control), exact mode not."""
    assert _flash_rows(7, 2, 8, 6, 2, 300, None, exact=True, rows=(0, 7)) == []
    assert len(_flash_rows(7, 2, 8, 6, 2, 300, None, exact=False)) >= 4


def _capacity_rows(seed, B, T, N, K, S, S2, bs, exact):
    """Rows (b, t) of a T-row step over a cache of S slots that differ from the same step over S2 slots (the
    same keys, lengths and queries) or from the same row launched alone (batch 1): `ar` and a speculative
    method size their caches differently (the method's capacity margin), and a served batch's rows change."""
    q, k, v = random_qkv(seed, B, T, N, K, 64, S2, BF16)
    kv_len = np.random.default_rng(seed).integers(T + 20, S + 1, size=B)
    kv_len[0] = S
    k, v = poison_after(k, v, kv_len, np.nan)
    kv_len = jnp.asarray(kv_len, jnp.int32)
    small = _flash(q, k[:, :S], v[:, :S], kv_len, exact=exact, bs=bs)
    large = _flash(q, k, v, kv_len, exact=exact, bs=bs)
    alone = jnp.concatenate([_flash(q[b:b + 1], k[b:b + 1], v[b:b + 1], kv_len[b:b + 1], exact=exact, bs=bs)
                             for b in range(B)])
    return sorted(set(_rows_differing(small, large)) | set(_rows_differing(large, alone)))


def test_flash_rows_do_not_depend_on_the_capacity_or_the_batch():
    """160 against 256 slots of 16-key tiles: the auto split-K plan cuts them into 2 and 4 splits (other key
    ranges per split, the negative control); exact mode's fixed ranges give the same bits, also for a row
    launched alone."""
    assert _capacity_rows(11, 3, 5, 6, 2, 160, 256, SMALL, exact=True) == []
    assert len(_capacity_rows(11, 3, 5, 6, 2, 160, 256, SMALL, exact=False)) >= 4


def _path_cache(k, v, base, mask, t):
    """k, v with node t's ancestors (root first) copied to slots base .. base + depth(t): the cache a one-token
    step at t's position sees once the path is accepted and compacted."""
    k, v = np.array(k), np.array(v)
    depth = mask.sum(-1) - 1
    for b in range(k.shape[0]):
        path = sorted(np.flatnonzero(mask[b, t]), key=lambda j: depth[b, j])
        k[b, base[b]:base[b] + len(path)] = k[b, base[b] + np.asarray(path)]
        v[b, base[b]:base[b] + len(path)] = v[b, base[b] + np.asarray(path)]
    return jnp.asarray(k), jnp.asarray(v), jnp.asarray(base + depth[:, t] + 1, jnp.int32)


def _tree_rows(seed, B, n, N, K, S, bs, exact, chain=0, one_token_slots=None):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(seed, B, n + chain, N, K, 64, S, BF16)
    mask = random_tree_mask(rng, B, n)
    if chain:   # a root chain of `chain` nodes, as LongSpec's lookup tokens hang off the root
        tree = tree_lib.DraftTree(tokens=jnp.zeros((B, n), jnp.int32), parent=jnp.zeros((B, n), jnp.int32),
                                  mask=jnp.asarray(mask))
        mask = np.asarray(tree_lib.add_chain(tree, jnp.zeros((B, chain), jnp.int32)).mask)
    n += chain
    base = rng.integers(0, S - n + 1, size=B)
    base[0] = S - n
    k, v = poison_after(k, v, base + n, np.nan)
    out = _tree(q, k, v, jnp.asarray(base, jnp.int32), jnp.asarray(mask), exact=exact, bs=bs)
    pad = ((0, 0), (0, (one_token_slots or S) - S), (0, 0), (0, 0))   # the one-token steps' cache: another capacity

    def one_token(t):
        kt, vt, kv_len = _path_cache(k, v, base, mask, t)
        return _flash(q[:, t:t + 1], jnp.pad(kt, pad), jnp.pad(vt, pad), kv_len, exact=True, bs=bs)

    one = jnp.concatenate([one_token(t) for t in range(n)], axis=1)
    return _rows_differing(out, one)


# (B, n, N, K, S, block sizes, chain): G = 1, 3, 4; paths across 16-key tiles and split boundaries.
TREE_CASES = [
    (2, 9, 6, 2, 128, SMALL, 0),                                  # G=3
    (2, 14, 4, 4, 96, pk.BlockSizes(block_m=64, block_k=16, num_splits=3), 0),   # G=1, 3 splits
    (2, 10, 8, 2, 112, SMALL, 4),                                 # G=4, a tree plus a root chain of 4
]


@pytest.mark.parametrize("B,n,N,K,S,bs,chain", TREE_CASES)
def test_tree_nodes_round_as_one_token_steps(B, n, N, K, S, bs, chain):
    assert _tree_rows(200 + n, B, n, N, K, S, bs, exact=True, chain=chain) == []


def test_tree_nodes_round_as_one_token_steps_over_another_capacity():
    """LongSpec's cache (its tree margin) against ar's: 128 slots of 16-key tiles for the tree, 176 for the
    one-token steps."""
    assert _tree_rows(213, 2, 9, 6, 2, 128, SMALL, exact=True, one_token_slots=176) == []


def test_tree_rows_per_program_do_not_change_bits():
    """The exact tree kernel walks a tree's sub-blocks in one program or spreads them over several (by the grid's
    size: EXACT_TREE_SPREAD); 23 nodes at G=3 are 5 sub-blocks: one each, two (3 programs, the last padded), and
    all in one program padded to 8 (3 sub-blocks skipped). Every packing gives the same bits, so the one-token
    checks above, run at tiny grids (one sub-block per program), hold for the packed launches too."""
    rng = np.random.default_rng(17)
    B, n, N, K, S = 2, 23, 6, 2, 144
    q, k, v = random_qkv(17, B, n, N, K, 64, S, BF16)
    mask = jnp.asarray(random_tree_mask(rng, B, n))
    base = jnp.asarray([S - n, 60], jnp.int32)

    def run(rows):
        f = jax.jit(lambda q, k, v, p, m: ta._exact_tree(q, k, v, p, m, K=K, G=N // K, sm_scale=0.125,
                                                           block_sizes=SMALL, interpret=True, layer=None,
                                                           rows_per_program=rows)[0])
        return np.asarray(f(q, k, v, base, mask).astype(jnp.float32))

    outs = {rows: run(rows) for rows in (16, 32, 128)}
    assert np.isfinite(outs[16]).all()
    for rows in (32, 128):
        np.testing.assert_array_equal(outs[rows], outs[16])


def test_default_tree_attention_rounds_otherwise():
    """Negative control: the default tree kernel (a prefix pass and a tree pass merged by their LSEs) does not
    give the one-token step's bits."""
    assert len(_tree_rows(209, 2, 9, 6, 2, 128, SMALL, exact=False)) >= 4


# ------------------------------------------------------------------------------------------------ the model

CFG = ModelConfig(arch="llama", vocab_size=96, d_model=96, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=64,
                  ffn_dim=96, rope_theta=10000.0, dtype="bfloat16", max_position=512, eos_token_ids=())
EXACT = AttnImpl(backend="pallas", interpret=True, exact=True)
PROMPT_LENGTHS = (140, 261, 200, 170)    # ragged; two and three 128-key tiles
NEW, CAPACITY = 32, 320


@functools.lru_cache(maxsize=None)
def _setup(cfg=CFG):
    params = model.init_params(cfg, jax.random.key(4), scale=0.3)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(4, CFG.vocab_size, n).tolist() for n in PROMPT_LENGTHS]
    tokens, lengths = gen.pad_prompts(prompts, multiple=32)
    return params, jnp.asarray(tokens), jnp.asarray(lengths)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_model_step_logits_do_not_depend_on_the_steps_rows(arch):
    """One 7-token forward (a vegas verification's shape at gamma 6) against seven one-token forwards from the
    same cache: the logits of every row, bit for bit, on the exact path (dense kernels, exact attention and
    head) that `layers.exact_supported` reports; also with Qwen2's q/k/v biases and Qwen3's q/k norms."""
    cfg = dataclasses.replace(CFG, arch=arch)
    params, tokens, lengths = _setup(cfg)
    assert layers.exact_supported(params, cfg, EXACT)
    assert not layers.exact_supported(params, cfg, AttnImpl(backend="pallas", interpret=True))
    B = tokens.shape[0]
    _, cache = gen.prefill(params, cfg, tokens, lengths, kv_cache.init(cfg, batch=B, capacity=CAPACITY), impl=EXACT)
    step = jax.random.randint(jax.random.key(1), (B, 7), 4, cfg.vocab_size)
    step_fn = jax.jit(lambda toks, c: model.forward(params, cfg, toks, c, impl=EXACT)[:2])
    full, _ = step_fn(step, cache)
    ones, c = [], cache
    for t in range(7):
        logits, c = step_fn(step[:, t:t + 1], c)
        ones.append(logits)
    np.testing.assert_array_equal(np.asarray(full), np.asarray(jnp.concatenate(ones, axis=1)))


@functools.lru_cache(maxsize=None)
def _ar():
    params, tokens, lengths = _setup()
    cache = kv_cache.init(CFG, batch=tokens.shape[0], capacity=CAPACITY)
    logits, cache = gen.prefill(params, CFG, tokens, lengths, cache, impl=EXACT)
    out, _, _ = plain_decode(params, CFG, GREEDY, cache, logits, jax.random.key(0), max_new_tokens=NEW, impl=EXACT)
    return np.asarray(out)


METHODS = {
    "vegas": SpecConfig("vegas", gamma=6, budget=32, min_tokens=8, lookup=2),   # T = 9: 27 packed rows
    "streaming": SpecConfig("streaming", gamma=6, budget=32, sink=2),
    "quest": SpecConfig("quest", gamma=6, budget=32, page_size=4),
    "longspec": SpecConfig("longspec", tree_widths=(2, 4, 3), window=8, lookup=3),   # a tree + a root chain
}


@pytest.mark.parametrize("name", list(METHODS))
def test_greedy_bf16_output_equals_ar_in_exact_mode(name):
    params, tokens, lengths = _setup()
    spec = METHODS[name]
    kw = {}
    if spec.method == "longspec":
        kw["drafter"] = init_drafter_params(CFG, jax.random.key(2), target_params=params, scale=0.3)
    state = speculative.init(params, CFG, spec, tokens, lengths, CAPACITY, impl=EXACT, **kw)
    out, n_out, stats = speculative.run(params, CFG, spec, GREEDY, state, jax.random.key(0), NEW, impl=EXACT, **kw)
    assert (np.asarray(n_out) == NEW).all()
    np.testing.assert_array_equal(np.asarray(out), _ar(), err_msg=name)
    hist = np.asarray(stats.accept_hist).sum(0)
    assert hist[0] < hist.sum()      # some drafts accepted: verification blocks of several rows did decide tokens


def test_model_step_logits_do_not_depend_on_the_capacity():
    """`ar` and a method size their caches differently (the method's margin): a one-token step over 1,408 slots
    (11 key tiles of 128) and over 1,536 (12), and a 7-token step over 1,536, from the same prefill, give the same
    logits bit for bit (the capacity-sized split plan of the earlier exact mode cut 11 and 12 tiles into 2 and 3
    splits: other key ranges, other rounding)."""
    params, _, _ = _setup()
    B, S1, S2 = 2, 1408, 1536
    rng = np.random.default_rng(8)
    prompts = [rng.integers(4, CFG.vocab_size, n).tolist() for n in (1390, 1301)]
    tokens, lengths = gen.pad_prompts(prompts, multiple=32)
    _, big = gen.prefill(params, CFG, jnp.asarray(tokens), jnp.asarray(lengths),
                         kv_cache.init(CFG, batch=B, capacity=S2), impl=EXACT)
    small = kv_cache.KVCache(k=big.k[:, :, :S1], v=big.v[:, :, :S1], lengths=big.lengths)
    step = jnp.asarray(rng.integers(4, CFG.vocab_size, (B, 7)), jnp.int32)
    step_fn = jax.jit(lambda toks, c: model.forward(params, CFG, toks, c, impl=EXACT)[:2])
    full, _ = step_fn(step, big)
    ones = {}
    for name, c in (("small", small), ("big", big)):
        out = []
        for t in range(7):
            logits, c = step_fn(step[:, t:t + 1], c)
            out.append(logits)
        ones[name] = np.asarray(jnp.concatenate(out, axis=1))
    np.testing.assert_array_equal(ones["small"], ones["big"])
    np.testing.assert_array_equal(np.asarray(full), ones["small"])
