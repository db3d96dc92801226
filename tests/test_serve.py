"""Continuous batching (jspec/speculative/serving.py): a queue of requests through fewer slots; each request's
greedy output equals plain greedy decoding of that request alone, for self-speculative methods, LongSpec and
plain decoding through the engine ("ar"), with stop tokens (rows finish at different rounds) and more slots
than requests."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec import prefill as gen
from jspec import kv_cache, model
from jspec.config import ModelConfig, RopeScaling, SamplingConfig
from jspec.drafter import init_drafter_params
from jspec.speculative import SpecConfig
from jspec.speculative import serving as sv
from reference_decode import decode as plain_decode

GREEDY = SamplingConfig()
NEW, CAP = 14, 128
LENGTHS = (5, 40, 17, 9, 33)


def _setup(local: bool):
    cfg = ModelConfig(arch="llama", vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                      ffn_dim=96, rope_theta=10000.0, rope_scaling=RopeScaling(factor=8.0, original_max_position=32),
                      dtype="float32", max_position=256)
    params = model.init_params(cfg, jax.random.key(1), scale=0.3)
    if local:   # next token depends mostly on the current one: drafts get accepted at different rates per row
        params = dict(params, layers=dict(params["layers"], wo=0.006 * params["layers"]["wo"],
                                          w_down=0.006 * params["layers"]["w_down"]))
    rng = np.random.default_rng(7)
    prompts = [rng.integers(4, cfg.vocab_size, n).tolist() for n in LENGTHS]
    return cfg, params, prompts


def _alone(cfg, params, prompt, stops):
    """Plain greedy decoding of one prompt by itself, cut after the first stop token."""
    tokens, lengths = gen.pad_prompts([prompt])
    logits, cache = gen.prefill(params, cfg, jnp.asarray(tokens), jnp.asarray(lengths),
                                kv_cache.init(cfg, batch=1, capacity=CAP))
    out, n, _ = plain_decode(params, cfg, GREEDY, cache, logits, jax.random.key(0), max_new_tokens=NEW,
                             stop_tokens=stops)
    return np.asarray(out)[0, :int(n[0])].tolist()


@pytest.mark.parametrize("method,staged", [("vegas", True), ("streaming", False), ("longspec", True),
                                           ("longspec", False), ("ar", True), ("longspec-lookup", True),
                                           ("longspec-lookup", False), ("vegas-lookup", True),
                                           ("quest-lookup", False)])
def test_each_request_equals_plain_decoding_alone(method, staged):
    lookup = 4 if method.endswith("-lookup") else 0   # + a prompt-lookup chain (its token record refilled)
    method = method.split("-")[0]
    cfg, params, prompts = _setup(local=method == "longspec")
    free = [_alone(cfg, params, p, ()) for p in prompts]
    stop = next(int(t) for t in free[0][1:8] if any(t not in row for row in free[1:]))   # stops some rows early
    want = [_alone(cfg, params, p, (stop,)) for p in prompts]
    assert len({len(w) for w in want}) > 1
    drafter = None
    if method == "longspec":
        spec = SpecConfig("longspec", tree_widths=(2, 3), window=8, lookup=lookup)
        drafter = init_drafter_params(cfg, jax.random.key(2), target_params=params, scale=0.0)
    else:
        spec = SpecConfig(method, gamma=3, budget=12, min_tokens=12, lookup=lookup,
                          **({"page_size": 4} if method == "quest" else {}))
    outs, st = sv.serve(params, cfg, spec, GREEDY, prompts, batch=2, capacity=CAP, max_new_tokens=NEW,
                        stop_tokens=(stop,), drafter=drafter, staged=staged)
    assert [o.tolist() for o in outs] == want
    assert st.segments >= 4 and st.new_tokens == sum(len(w) for w in want)
    assert all(r >= 1 for r in st.rounds) and [int(np.sum(h)) for h in st.accept_hist] == st.rounds
    assert st.tau >= 1.0 and st.decode_s > 0 and st.prefill_s > 0
    assert max(st.rounds) <= st.iterations and 0 < st.occupancy <= 1
    one, st1 = sv.serve(params, cfg, spec, GREEDY, prompts[:3], batch=1, capacity=CAP, max_new_tokens=NEW,
                        stop_tokens=(stop,), drafter=drafter, staged=staged)   # one slot: never idle, rounds add up
    assert [o.tolist() for o in one] == want[:3] and st1.iterations == sum(st1.rounds) and st1.occupancy == 1.0


@pytest.mark.parametrize("batch,refill,staged", [(3, 2, True), (3, 2, False), (4, 3, True), (4, 3, False)])
def test_batched_refills_equal_plain_decoding_alone(batch, refill, staged):
    """Slots refilled `refill` at a time (the last refill padded when the queue holds fewer): every request
    still equals plain decoding alone, in fewer segments than prompts; sampled, every request gets its tokens."""
    cfg, params, prompts = _setup(local=False)
    prompts = prompts + [p[::-1] for p in prompts[:3]]
    want = [_alone(cfg, params, p, ()) for p in prompts]
    spec = SpecConfig("vegas", gamma=3, budget=12, min_tokens=12)
    seen = []
    outs, st = sv.serve(params, cfg, spec, GREEDY, prompts, batch=batch, capacity=CAP, max_new_tokens=NEW,
                        refill=refill, staged=staged, on_result=lambda i, toks: seen.append((i, toks.tolist())))
    assert [o.tolist() for o in outs] == want
    assert sorted(seen) == list(enumerate(want))       # every request reported once, with its tokens
    assert 2 <= st.segments < len(prompts) and st.new_tokens == NEW * len(prompts)
    hot, _ = sv.serve(params, cfg, spec, SamplingConfig(temperature=1.0), prompts, batch=batch, capacity=CAP,
                      max_new_tokens=NEW, refill=refill, seed=5, staged=staged)
    assert all(len(o) == NEW and o.min() >= 0 and o.max() < cfg.vocab_size for o in hot)
    with pytest.raises(ValueError, match="refill"):
        sv.serve(params, cfg, spec, GREEDY, prompts, batch=batch, capacity=CAP, max_new_tokens=NEW, refill=0)


def test_staged_rows_done_at_once_turn_a_slot_over_twice():
    """Requests whose first token is a stop token are done before any round: on the device a slot then takes
    staged row after staged row in one call, and the host must map each saved result to the request that
    held the slot at that moment (in insertion order)."""
    cfg, params, prompts = _setup(local=False)
    first = _alone(cfg, params, prompts[2], ())[0]
    stop = (first,)
    queue = [prompts[0], prompts[1], prompts[2], prompts[2], prompts[3], prompts[2], prompts[4]]
    want = [_alone(cfg, params, p, stop) for p in queue]
    assert want[2] == [first] and len(want[0]) > 1     # the instant ones and the ones that run
    spec = SpecConfig("vegas", gamma=2, budget=12, min_tokens=12)
    seen = []
    outs, st = sv.serve(params, cfg, spec, GREEDY, queue, batch=2, capacity=CAP, max_new_tokens=NEW,
                        stop_tokens=stop, refill=2, staged=True, on_result=lambda i, toks: seen.append(i))
    assert [o.tolist() for o in outs] == want
    assert sorted(seen) == list(range(len(queue)))
    assert [r for r, w in zip(st.rounds, want) if w == [first]] == [0, 0, 0]
    assert st.occupancy <= 1.0 and st.segments == 4   # stages [2, 3], [4, 5], [6], then the end


def test_more_slots_than_requests_and_bad_requests():
    cfg, params, prompts = _setup(local=False)
    spec = SpecConfig("streaming", gamma=2, budget=8)
    outs, st = sv.serve(params, cfg, spec, GREEDY, prompts[:2], batch=4, capacity=CAP, max_new_tokens=6)
    assert [o.tolist() for o in outs] == [_alone(cfg, params, p, ())[:6] for p in prompts[:2]]
    assert st.iterations == max(st.rounds) and st.occupancy <= 0.5     # two of four slots idle throughout
    staged, st2 = sv.serve(params, cfg, spec, GREEDY, prompts[:2], batch=4, capacity=CAP, max_new_tokens=6,
                           staged=True)                                 # nothing to stage: one plain segment
    assert [o.tolist() for o in staged] == [o.tolist() for o in outs] and st2.segments == 1
    with pytest.raises(ValueError, match="capacity"):
        sv.serve(params, cfg, spec, GREEDY, prompts, batch=2, capacity=48, max_new_tokens=NEW)
    with pytest.raises(ValueError, match="at least one prompt"):
        sv.serve(params, cfg, spec, GREEDY, [], batch=2, capacity=CAP, max_new_tokens=NEW)
    with pytest.raises(ValueError, match="at least one token"):
        sv.serve(params, cfg, spec, GREEDY, [[5, 6], []], batch=2, capacity=CAP, max_new_tokens=NEW)


def test_batch_axes_and_take_row():
    big, small = {"a": jnp.zeros((3, 4, 5)), "k": jnp.zeros(())}, {"a": jnp.ones((3, 1, 5)), "k": jnp.ones(())}
    axes = sv.batch_axes(big, small)
    assert axes == (1, None)
    rows = jnp.stack([jnp.ones((3, 5)), 2 * jnp.ones((3, 5)), 3 * jnp.ones((3, 5))], 1)    # K = 3 rows
    got = np.asarray(sv._take_row(big["a"], rows, jnp.int32(2), jnp.int32(1), 1))
    assert (got[:, 2] == 2).all() and (np.delete(got, 2, 1) == 0).all()
    assert float(sv._take_row(big["k"], small["k"], 0, 0, None)) == 0.0     # no batch axis: the batch's own
    with pytest.raises(ValueError, match="batch axis"):
        sv.batch_axes({"a": jnp.zeros((4, 4))}, {"a": jnp.ones((1, 2))})


@pytest.mark.parametrize("method", ["vegas", "quest"])
def test_insert_puts_a_fresh_row_and_leaves_the_others(method):
    """Lossless output cannot see a stale selection state (it only costs tau), so check `insert` directly: the
    slot's every leaf (cache rows, method state, loop state) equals a 1-row start on that prompt; other
    slots are untouched."""
    from jspec.speculative import engine
    cfg, params, prompts = _setup(local=False)
    spec = SpecConfig(method, gamma=2, budget=16, min_tokens=16, **({"page_size": 4} if method == "quest" else {}))
    tokens, lengths = gen.pad_prompts(prompts[:3])
    st = engine.start(spec, GREEDY, engine.init(params, cfg, spec, jnp.asarray(tokens), jnp.asarray(lengths), CAP),
                      jax.random.key(0), NEW)
    st = sv.run_until(params, cfg, spec, GREEDY, st, jnp.zeros(3, bool), NEW)    # rows move on first
    host = functools.partial(jax.tree.map, lambda x: np.asarray(
        jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x))
    before = host(st)
    t1, l1 = gen.pad_prompts(prompts[3:4])
    one = engine.init(params, cfg, spec, jnp.asarray(t1), jnp.asarray(l1), CAP)
    fresh = engine.start(spec, GREEDY, one, jax.random.key(9), NEW)
    axes = sv.batch_axes(st, fresh)
    fresh = host(fresh)
    t2, l2 = gen.pad_prompts([prompts[3], prompts[4]])       # row 1 <- prompt 3; the second row is padding (3 = B)
    two = engine.start(spec, GREEDY, engine.init(params, cfg, spec, jnp.asarray(t2), jnp.asarray(l2), CAP),
                       jax.random.key(9), NEW)
    after = host(sv.insert(st, two, jnp.array([1, 3], jnp.int32), axes))
    checked = 0
    for (path, a), b, f in zip(jax.tree_util.tree_leaves_with_path(after), jax.tree.leaves(before),
                               jax.tree.leaves(fresh)):
        if a.shape == f.shape:   # the PRNG key: stays the batch's
            np.testing.assert_array_equal(a, b)
            continue
        axis = next(i for i, (m, n) in enumerate(zip(a.shape, f.shape)) if m != n)
        np.testing.assert_array_equal(np.take(a, 1, axis), np.take(f, 0, axis), err_msg=str(path))
        np.testing.assert_array_equal(np.delete(a, 1, axis), np.delete(b, 1, axis), err_msg=str(path))
        checked += 1
    assert checked >= 10


def test_generate_with_slots(capsys):
    """jspec.generate(..., slots=N): the same tokens as one static batch, per-request stats, clear errors."""
    import jspec
    from conftest import CharTokenizer
    cfg, params, prompts = _setup(local=False)
    m = jspec.Model(params=params, cfg=cfg, tokenizer=CharTokenizer(), path="")
    static = jspec.generate(m, prompts, method="vegas", gamma=2, budget=12, min_tokens=12, max_new_tokens=8)
    served = jspec.generate(m, prompts, method="vegas", gamma=2, budget=12, min_tokens=12, max_new_tokens=8,
                            slots=2)
    ar = jspec.generate(m, prompts, max_new_tokens=8)
    assert served.tokens == static.tokens == ar.tokens and served.texts == ar.texts
    s = served.stats
    assert s.batch == 2 and s.new_tokens == [len(t) for t in ar.tokens] and len(s.rounds) == len(prompts)
    assert sum(s.accept_hist) == sum(s.rounds) and s.tau >= 1 and len(s.tau_per_sequence) == len(prompts)
    paired = jspec.generate(m, prompts, method="vegas", gamma=2, budget=12, min_tokens=12, max_new_tokens=8,
                            slots=3, refill=2, progress=True)
    assert paired.tokens == ar.tokens and paired.stats.batch == 3
    staged = jspec.generate(m, prompts, method="vegas", gamma=2, budget=12, min_tokens=12, max_new_tokens=8,
                            slots=2, refill=2, staged=True)
    assert staged.tokens == ar.tokens
    assert f"{len(prompts)}/{len(prompts)}" in capsys.readouterr().err    # the bar counted every request
    with pytest.raises(jspec.InputError, match="refill and staged apply"):
        jspec.generate(m, prompts, method="vegas", max_new_tokens=8, refill=2)
    with pytest.raises(jspec.InputError, match="refill=0"):
        jspec.generate(m, prompts, method="vegas", max_new_tokens=8, slots=2, refill=0)
    one = jspec.generate(m, prompts, method="vegas", max_new_tokens=1, slots=2)    # every slot done at once
    assert one.tokens == [t[:1] for t in ar.tokens]
    hot = jspec.generate(m, prompts, method="vegas", gamma=2, max_new_tokens=8, slots=2, temperature=0.9, seed=3)
    assert [len(t) for t in hot.tokens] == [8] * len(prompts) and all(0 <= x < cfg.vocab_size for t in hot.tokens
                                                                     for x in t)
    plain = jspec.generate(m, prompts, max_new_tokens=8, slots=2)     # "ar" through the slots too
    assert plain.tokens == ar.tokens and plain.stats.method == "ar" and plain.stats.tau == 1.0
    with pytest.raises(jspec.InputError, match="slots=0"):
        jspec.generate(m, prompts, method="vegas", max_new_tokens=8, slots=0)
