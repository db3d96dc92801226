"""Tensor-parallel checks on 8 virtual CPU devices, run by tests/test_sharding.py in a fresh process.

XLA_FLAGS must be set before jax is first imported, and the pytest process may already have imported it
(other test files), hence a subprocess. Prints one JSON object on the last line of stdout:

    {"greedy": [{arch, dtype, tp, same, ref, got}], "specs": {...}, "errors": {...},
     "pallas": {...}, "vegas": [...], "serve": [...]}
"""
import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jspec import prefill as gen  # noqa: E402
from jspec import kv_cache, model  # noqa: E402
from jspec import sharding as sh  # noqa: E402
from jspec.attention import AttnImpl  # noqa: E402
from jspec.config import ModelConfig, RopeScaling, SamplingConfig  # noqa: E402
from reference_decode import decode as plain_decode  # noqa: E402

GREEDY = SamplingConfig()
NEW = 12
CAPACITY = 64
PROMPT_LENGTHS = (5, 37, 20)   # ragged


def tiny(arch, **kw):
    """N=8, K=4: divisible by tp = 2 and 4 (G = 2)."""
    base = dict(arch=arch, vocab_size=128, d_model=64, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=16,
                ffn_dim=96, rope_theta=10000.0, max_position=256, eos_token_ids=())
    if arch == "llama":
        base["rope_scaling"] = RopeScaling(factor=8.0, original_max_position=32)
    base.update(kw)
    return ModelConfig(**base)


def prompts(cfg, seed=5):
    rng = np.random.default_rng(seed)
    toks, lens = gen.pad_prompts([rng.integers(3, cfg.vocab_size, n).tolist() for n in PROMPT_LENGTHS], multiple=16)
    return jnp.asarray(toks), jnp.asarray(lens)


def greedy(params, cfg, cache, impl=AttnImpl()):
    toks, lens = prompts(cfg)
    logits, cache = gen.prefill(params, cfg, toks, lens, cache, impl=impl)
    out, n_out, cache = plain_decode(params, cfg, GREEDY, cache, logits, jax.random.key(0), max_new_tokens=NEW,
                                     impl=impl)
    return np.asarray(out), cache, logits


def spec_str(s):
    """PartitionSpec with trailing Nones dropped (P(None, 'tp', None) and P(None, 'tp') are the same)."""
    parts = list(s)
    while parts and parts[-1] is None:
        parts.pop()
    return str(tuple(parts))


# (arch, dtype, tp): each family and each dtype meets both tp degrees. The full 2x2x2 matrix costs twice the
# compile time on CPU and adds no path this one leaves out (XLA partitions bf16 and f32 alike).
GREEDY_CASES = (("llama", "float32", 2), ("llama", "bfloat16", 4), ("qwen2", "float32", 4), ("qwen2", "bfloat16", 2))


def setup(arch, dtype, _memo={}):
    """(cfg, params, unsharded greedy reference), once per family and dtype."""
    if (arch, dtype) not in _memo:
        cfg = tiny(arch, dtype=dtype)
        params = model.init_params(cfg, jax.random.key(1), scale=0.3)
        ref, _, _ = greedy(params, cfg, kv_cache.init(cfg, batch=len(PROMPT_LENGTHS), capacity=CAPACITY))
        _memo[arch, dtype] = cfg, params, ref
    return _memo[arch, dtype]


def check_greedy(res):
    for arch, dtype, tp in GREEDY_CASES:
        cfg, params, ref = setup(arch, dtype)
        mesh = sh.make_mesh(tp, cfg=cfg)
        p = sh.shard_params(params, cfg, mesh)
        cache = sh.shard_cache(kv_cache.init(cfg, batch=len(PROMPT_LENGTHS), capacity=CAPACITY), mesh)
        got, cache, logits = greedy(p, cfg, cache)
        res["greedy"].append(dict(arch=arch, dtype=dtype, tp=tp, same=bool((got == ref).all()),
                                  ref=ref.tolist(), got=got.tolist()))
        if arch == "qwen2" and tp == 4:   # qwen2 has every leaf but the q/k norms
            want = sh.param_shardings(cfg, mesh)
            res["specs"] = {
                "params": {jax.tree_util.keystr(k): [spec_str(a.sharding.spec), spec_str(s.spec),
                                                     a.sharding.is_equivalent_to(s, a.ndim)]
                           for (k, a), s in zip(jax.tree_util.tree_leaves_with_path(p), jax.tree.leaves(want))},
                "cache_k": spec_str(cache.k.sharding.spec), "cache_v": spec_str(cache.v.sharding.spec),
                "lengths": spec_str(cache.lengths.sharding.spec),
                "cache_equiv": all(getattr(cache, f).sharding.is_equivalent_to(
                    getattr(sh.cache_sharding(mesh), f), getattr(cache, f).ndim) for f in ("k", "v", "lengths")),
                "cache_shard_shape": list(cache.k.addressable_shards[0].data.shape),
                "logits": spec_str(logits.sharding.spec),
            }


def check_errors(res):
    def err(fn):
        try:
            fn()
        except sh.ShardingError as e:
            return str(e)
        return None

    odd = tiny("llama", n_heads=6, n_kv_heads=2)   # K = 2 not divisible by 4; N = 6 not by 4
    res["errors"] = {
        "heads": err(lambda: sh.make_mesh(4, cfg=odd)),
        "heads_params": err(lambda: sh.param_shardings(odd, sh.make_mesh(4))),
        "too_many": err(lambda: sh.make_mesh(16)),
        "n_devices": jax.device_count(),
    }


def check_pallas(res):
    """The shard_map wrapper around the Pallas kernels (interpret mode, head_dim 64, N=4, K=2, tp=2) against
    the unsharded XLA path: prefill, decode, verify with Collect-2-Query scores, tree verify, sparse drafting."""
    cfg = tiny("llama", head_dim=64, n_heads=4, n_kv_heads=2, d_model=96, dtype="float32")
    params = model.init_params(cfg, jax.random.key(21), scale=0.3)
    mesh = sh.make_mesh(2, cfg=cfg)
    pal = AttnImpl(backend="pallas", interpret=True, mesh=mesh)
    toks = jax.random.randint(jax.random.key(9), (2, 24), 0, cfg.vocab_size)
    L, M, T = cfg.n_layers, 8, 5
    tree = model.Tree(depth=jnp.broadcast_to(jnp.array([0, 1, 1, 2, 2], jnp.int32), (2, T)),
                      mask=jnp.broadcast_to(jnp.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0],
                                                       [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]], bool), (2, T, T)))
    sp = model.Sparse(idx=jnp.broadcast_to(jnp.array([0, 2, 3, 5, 8, 9, 12, 15], jnp.int32), (L, 2, M)),
                      n_valid=jnp.array([[8, 5]] * L, jnp.int32))

    def _steps(params, cache, impl):
        a, cache, _ = model.forward(params, cfg, toks[:, :16], cache, impl=impl)
        b, cache, _ = model.forward(params, cfg, toks[:, 16:17], cache, impl=impl)
        c, _, aux = model.forward(params, cfg, toks[:, 17:22], cache, score_rows=(1, 4), impl=impl)
        d, _, _ = model.forward(params, cfg, toks[:, 17:22], cache, tree=tree, impl=impl)
        e, _, _ = model.forward(params, cfg, toks[:, 17:18], cache, sparse=sp, impl=impl)
        return (a, b, c, aux["scores"], d, e), cache

    cache0 = kv_cache.init(cfg, batch=2, capacity=40)
    want, _ = jax.jit(lambda p, c: _steps(p, c, AttnImpl(backend="xla")))(params, cache0)
    got, cache = jax.jit(lambda p, c: _steps(p, c, pal))(sh.shard_params(params, cfg, mesh),
                                                        sh.shard_cache(cache0, mesh))
    names = ("prefill", "decode", "verify", "scores", "tree", "sparse")
    res["pallas"] = {n: float(jnp.max(jnp.abs(g - w))) for n, g, w in zip(names, got, want)}
    # backend="pallas" re-raises NotImplementedError instead of falling back, so the kernels did run.
    res["pallas"]["cache_k"] = spec_str(cache.k.sharding.spec)


def check_vegas(res):
    try:
        from jspec import speculative
        from jspec.speculative import SpecConfig
    except ImportError as e:
        res["vegas"] = f"not available: {e}"
        return
    # bf16 (the dtype where a partial-sum all-reduce could change tokens), tp=2, a budget of 8 slots so most
    # drafts are rejected; identity against plain unsharded greedy decoding.
    cfg, params, ref = setup("qwen2", "bfloat16")
    B = len(PROMPT_LENGTHS)
    spec = SpecConfig(method="vegas", gamma=3, budget=8)
    mesh = sh.make_mesh(2, cfg=cfg)
    p = sh.shard_params(params, cfg, mesh)
    toks, lens = prompts(cfg)
    logits, cache = gen.prefill(p, cfg, toks, lens, sh.init_cache(cfg, mesh, batch=B, capacity=CAPACITY))
    last = jnp.take_along_axis(toks, (lens - 1)[:, None], axis=1)[:, 0]
    state = speculative.prepare(p, cfg, spec, cache, logits, last)
    out, n_out, stats, final = speculative.run_donating(p, cfg, spec, GREEDY, state, jax.random.key(0), NEW)
    res["vegas"] = [dict(dtype=cfg.dtype, tp=2, same=bool((np.asarray(out) == ref).all()), tau=stats.tau(),
                         cache_k=spec_str(final.cache.k.sharding.spec))]


def check_serve(res):
    """Continuous batching (`speculative.serve(mesh=...)`) on tp=2: 3 ragged prompts through 2 slots, so one
    slot is refilled; greedy vegas waiting for a free slot and staged, against unsharded plain decoding. Every
    prefill must go through `engine.init_sharded` (recorded: the cache rows it made and their sharding)."""
    from jspec.speculative import SpecConfig, engine, serve

    cfg, params, ref = setup("qwen2", "bfloat16")
    mesh = sh.make_mesh(2, cfg=cfg)
    p = sh.shard_params(params, cfg, mesh)
    toks, lens = prompts(cfg)
    ids = [np.asarray(toks[i, :int(lens[i])]) for i in range(len(PROMPT_LENGTHS))]
    made, real = [], engine.init_sharded

    def spy(*a, **k):
        st = real(*a, **k)
        if not isinstance(st.cache.k, jax.core.Tracer):   # serve also traces one (eval_shape) for the batch axes
            made.append(spec_str(st.cache.k.sharding.spec))
        return st

    engine.init_sharded = spy
    res["serve"] = []
    try:
        for staged in (False, True):
            made.clear()
            outs, st = serve(p, cfg, SpecConfig(method="vegas", gamma=3, budget=8), GREEDY, ids, batch=2,
                             capacity=CAPACITY, max_new_tokens=NEW, refill=1, staged=staged, mesh=mesh)
            same = all(len(o) == NEW and (np.asarray(o) == ref[i]).all() for i, o in enumerate(outs))
            res["serve"].append(dict(staged=staged, same=same, prefills=len(made), cache_k=sorted(set(made)),
                                     tau=st.tau))
        # The public entry point: jspec.generate(slots=...) on a Model that carries the mesh.
        import jspec

        class _Tok:
            def decode(self, ids, skip_special_tokens=True):
                return ""

        made.clear()
        m = jspec.Model(params=p, cfg=cfg, tokenizer=_Tok(), path="tiny", mesh=mesh)
        out = jspec.generate(m, [o.tolist() for o in ids], method="vegas", gamma=3, budget=8, max_new_tokens=NEW,
                             slots=2, refill=1, ignore_eos=True)
        same = all((np.asarray(t) == ref[i]).all() and len(t) == NEW for i, t in enumerate(out.tokens))
        res["serve"].append(dict(staged="generate", same=same, prefills=len(made), cache_k=sorted(set(made)),
                                 tau=out.stats.tau))
    finally:
        engine.init_sharded = real


def main():
    res = {"greedy": []}
    which = sys.argv[1:] or ["errors", "greedy", "pallas", "vegas", "serve"]
    for name in which:
        globals()[f"check_{name}"](res)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
