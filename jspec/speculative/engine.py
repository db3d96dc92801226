"""The one driver of every method: the target drafts for itself with sparse attention (plain decoding, "ar",
is the method with no drafts: ar.py).

One round (one iteration of a jitted `lax.while_loop`, no host sync):

    cache holds the accepted prefix (slots 0 .. lengths-1); `last` is the newest emitted token, not yet cached
    1. draft   gamma one-token forwards with the method's sparse selection: [last, d1 .. d_{g-1}] are written
               at slots lengths .. lengths+gamma-1 and produce d1 .. dg (sampled from q for T > 0)
       1b.     with spec.lookup = G: G more drafts proposed by n-gram lookup over the row's text + the drafts
               (lookup.py), verified in the same forward (T = gamma + G + 1); below, gamma means gamma + G
    2. verify  roll back to lengths, one full-attention forward over [last, d1 .. dg] (T = gamma + 1), which
               rewrites the same slots (+ slot lengths+gamma); vegas also collects per-layer scores here.
               With a lossy spec.verify (Dustin and its baselines, sparse_verify.py) this forward reads only
               I_verify + the new tokens, the drafts also collect the draft signal, and State.verify carries
               the policy's state; the default dense verification runs exactly the program without them
    3. accept  per sequence n in [0, gamma] drafts + one corrected/bonus token (sampling.verify_chain;
               exact match for greedy): n + 1 tokens emitted
    4. rollback lengths += n + 1: `last` and d1..dn are in the cache; the new token is the next `last`
    5. update  the method's selection state for the next round

A batch accepts different counts per sequence; finished sequences (stop token or max_new_tokens) ride along
with frozen lengths and output. Stats: rounds (= target verifications) and the accepted-length histogram per
sequence; tau = mean tokens emitted per verification.

Entry points: `init` (prefill + method state), `prepare` (method state on an existing prefilled cache, so
one prefill can serve several methods), `run` (pure, for use inside a caller's jit) and `run_donating` (the
same, donating the state so the cache is updated in place); both run `rounds`, the one while_loop of
`round_`, which continuous batching (serving.py) also runs between refills. Each piece (`draft`, `verify`,
`accept`, the method's `update`) is a plain function so a benchmark can jit it alone on the same shapes to
split the round time offline.

Every method is a module of one protocol (`METHOD_MODULES`): six small hooks (see streaming.py's docstring)
that the engine's chain round drives (draft, verify, accept; only which KV entries a draft step reads differs),
and two optional ones for a method with its own drafter: `prepare(drafter, params, cfg, spec, cache,
prompt_tokens)` builds its state after the prefill, and `tree_round(...)` replaces the chain round
(longspec.py: the drafter's tree, a tree-masked verification, acceptance, compaction). Everything around the
round (emission, stop tokens, max_new_tokens, frozen finished rows, the method's `update`, stats) is this
driver's. A drafter's params enter as the traced `drafter=` argument of `init` / `prepare` / `run` (never
static, never donated); its ring cache lives in State.method. The accepted-length histogram has depth + 1
bins (spec.depth).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jspec import kv_cache, model, sampling
from jspec.attention import AttnImpl
from jspec.config import ModelConfig, SamplingConfig
from jspec.speculative import ar, longspec, lookup, quest, sparse_verify, streaming, vegas
from jspec.speculative.config import SpecConfig

METHOD_MODULES = {"streaming": streaming, "quest": quest, "vegas": vegas, "longspec": longspec, "ar": ar}


@struct.dataclass
class State:
    """What `init` hands to `run`: the prefilled cache, the logits of the first new token, the method state."""

    cache: kv_cache.KVCache
    logits: jax.Array     # f32[B, V] distribution of the first token to emit
    method: object        # the method module's state pytree
    tokens: object = None  # int32[B, capacity] with spec.lookup (not longspec): the text by cache slot
    verify: object = None  # sparse_verify.State with a lossy spec.verify (None: dense verification)


@struct.dataclass
class SpecStats:
    rounds: jax.Array       # int32[B] target verifications per sequence
    accept_hist: jax.Array  # int32[B, depth + 1] rounds that accepted n drafts, n = 0..depth (= gamma)

    def tau(self) -> float:
        """Mean tokens emitted per verification (accepted drafts + 1), host-side."""
        return float(_mean_emitted(np.asarray(self.accept_hist).sum(0)))

    def tau_per_sequence(self) -> np.ndarray:
        """f64[B] tau of each sequence, host-side. A batch runs until its slowest sequence is done, so the
        smallest of these, not the mean, sets a static batch's rounds (bench records: straggler)."""
        return _mean_emitted(np.asarray(self.accept_hist))


def _mean_emitted(hist):
    """Tokens per round from accepted-length histograms [..., depth + 1] (n accepted -> n + 1 emitted)."""
    return (hist * np.arange(1, hist.shape[-1] + 1)).sum(-1) / np.maximum(hist.sum(-1), 1)


def _method(spec: SpecConfig):
    return METHOD_MODULES[spec.method]


def _score_mode(spec: SpecConfig) -> str:
    """How the collected scores rank: vegas' option; the other methods collect none (the value goes unused)."""
    return spec.options.score_mode if spec.method == "vegas" else "weights"


# ------------------------------------------------------------------------------------------------- init

@functools.partial(jax.jit, static_argnames=("cfg", "spec", "capacity", "impl"))
def init(params, cfg: ModelConfig, spec: SpecConfig, prompt_tokens, prompt_lengths, capacity: int,
         impl: AttnImpl = AttnImpl(), drafter=None) -> State:
    """Prefill right-padded prompts into a fresh cache and set up the method's selection state.

    Args:
      prompt_tokens: int32[B, T] right-padded; prompt_lengths: int32[B] real lengths (>= 1).
      capacity: static cache slots; needs max(prompt_lengths) + max_new_tokens + spec.capacity_margin().
      drafter: longspec only: the drafter block's params (traced).
    Returns:
      State. Jittable (static cfg, spec, capacity, impl). The prefill is exactly `prefill.prefill`'s.
    """
    B = prompt_tokens.shape[0]
    lengths = prompt_lengths.astype(jnp.int32)
    cache = kv_cache.init(cfg, batch=B, capacity=capacity)
    logits, cache, _ = model.forward(params, cfg, prompt_tokens, cache, n_new=lengths,
                                     logits_at=(lengths - 1)[:, None], impl=impl)
    last = jnp.take_along_axis(prompt_tokens, (lengths - 1)[:, None], axis=1)[:, 0]
    return _prepare(params, cfg, spec, cache, logits[:, 0], last, impl, drafter, prompt_tokens)


def init_sharded(params, cfg: ModelConfig, spec: SpecConfig, prompt_tokens, prompt_lengths, capacity: int, mesh,
                 impl: AttnImpl = AttnImpl(), drafter=None) -> State:
    """`init` for tensor-parallel params: the cache is created in the mesh's head-sharded layout
    (`sharding.init_cache`; inside `init` its layout would be left to XLA), then the same prefill
    (`prefill.prefill`) and `prepare`. Not jitted as a whole: two programs."""
    from jspec import prefill, sharding

    tokens, lengths = jnp.asarray(prompt_tokens), jnp.asarray(prompt_lengths, jnp.int32)
    cache = sharding.init_cache(cfg, mesh, batch=tokens.shape[0], capacity=capacity)
    logits, cache = prefill.prefill(params, cfg, tokens, lengths, cache, impl=impl)
    last = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]
    extra = dict(drafter=drafter) if hasattr(_method(spec), "prepare") else {}
    if extra or spec.lookup:
        extra["prompt_tokens"] = tokens
    return prepare(params, cfg, spec, cache, logits, last, impl=impl, **extra)


@functools.partial(jax.jit, static_argnames=("cfg", "spec", "impl"), donate_argnames=("cache",))
def prepare(params, cfg: ModelConfig, spec: SpecConfig, cache: kv_cache.KVCache, logits, last_token,
            impl: AttnImpl = AttnImpl(), drafter=None, prompt_tokens=None) -> State:
    """A State from an already prefilled cache (e.g. `prefill.prefill`'s cache and logits f32[B, V]);
    last_token int32[B] is each prompt's last token. Lets one prefill serve several methods: a cache that
    has been decoded from can be reused after `kv_cache.rollback` to the prompt lengths.

    longspec also needs `drafter` (its params) and `prompt_tokens` int32[B, P] (right-padded, real lengths
    = cache.lengths; at least each row's last `spec.options.window` tokens matter): the drafter's ring is filled
    from them. With spec.lookup every method needs `prompt_tokens` (the lookup reads each row's text)."""
    return _prepare(params, cfg, spec, cache, logits, last_token, impl, drafter, prompt_tokens)


def _prepare(params, cfg, spec, cache, logits, last_token, impl, drafter=None, prompt_tokens=None):
    vs = None
    if sparse_verify.active(spec):
        sparse_verify.check(spec, cfg)
        vs = sparse_verify.init(spec, cfg, cache)
    state = _prepare_method(params, cfg, spec, cache, logits, last_token, impl, drafter, prompt_tokens)
    return state if vs is None else state.replace(verify=vs)


def _prepare_method(params, cfg, spec, cache, logits, last_token, impl, drafter, prompt_tokens):
    m = _method(spec)
    if hasattr(m, "prepare"):   # a method with its own drafter: its state comes from the drafter and the prompts
        if prompt_tokens is None:
            raise ValueError(f"method {spec.method!r} needs prompt_tokens to fill the drafter's ring")
        return State(cache=cache, logits=logits, method=m.prepare(drafter, params, cfg, spec, cache, prompt_tokens))
    lengths = cache.lengths
    tokens = None
    if spec.lookup:
        if prompt_tokens is None:
            raise ValueError(f"lookup={spec.lookup} needs prompt_tokens: the lookup reads each row's own text")
        tokens = lookup.record(prompt_tokens, cache.capacity)
    if not m.score_rows(spec):
        return State(cache=cache, logits=logits, method=m.init(spec, cfg, cache, None, lengths), tokens=tokens)
    # Vegas needs verification-like scores before its first round. A static score row cannot point at each
    # prompt's last token in a ragged prefill, so re-run that token as a one-token full-attention step that
    # emits its query's scores (selection point = its slot, see vegas.py). Its K/V are put back as the
    # prefill wrote them (a copy of the saved entries), so the cache holds exactly what plain decoding's does.
    point = lengths - 1
    b = jnp.arange(cache.batch)
    saved_k, saved_v = cache.k[:, b, point], cache.v[:, b, point]                 # [L, B, K, H]
    # Materialise the saved entries before the forward writes the cache in place: the forward's input token
    # comes out of the same barrier. Without it XLA fuses this gather into the restoring scatter at the end,
    # which keeps the donated input alive through the forward and so copies the whole cache (at Llama-3-8B
    # shapes, 32K x 16, that copy does not fit on one GPU).
    saved_k, saved_v, last_token = jax.lax.optimization_barrier((saved_k, saved_v, last_token))
    _, scored, aux = model.forward(params, cfg, last_token[:, None], kv_cache.rollback(cache, point),
                                   score_rows=(0,), score_mode=_score_mode(spec), impl=impl)
    cache = kv_cache.KVCache(k=scored.k.at[:, b, point].set(saved_k), v=scored.v.at[:, b, point].set(saved_v),
                             lengths=lengths)
    return State(cache=cache, logits=logits, method=m.init(spec, cfg, cache, aux["scores"], point), tokens=tokens)


# ------------------------------------------------------------------------------------------- the pieces

def draft(params, cfg: ModelConfig, spec: SpecConfig, samp: SamplingConfig, mstate, cache, last, key,
          impl: AttnImpl = AttnImpl(), live=None, signal: bool = False):
    """gamma sparse one-token forwards of the target (step 1). `live` (bool[B], optional): rows still
    decoding; finished ones skip their attention reads (`model.forward`'s `live`) and draft junk.
    signal: also collect Dustin's draft-lookahead signal A_D (a lossy spec.verify with a tier 1).

    Returns:
      drafts int32[B, gamma]; q f32[B, gamma, V] processed draft distributions (None for greedy);
      the cache with lengths advanced by gamma (the caller rolls it back before verifying);
      A_D f32[B, S] with `signal` (the draft steps' attention on the draft heads over the entries they read,
      sparse_verify.draft_probe, summed over the steps), else None.
    """
    if spec.gamma == 0:   # "ar": nothing to draft
        return jnp.zeros((cache.batch, 0), jnp.int32), None, cache, None
    m = _method(spec)
    sel = m.begin_round(spec, cfg, mstate, cache.lengths)
    impl = impl.for_drafts()   # verification rewrites every drafted slot: exact mode need not cover drafts

    def step(carry, j):
        cache, tok, key, a_d = carry
        key, sub = jax.random.split(key)
        probe = sparse_verify.draft_probe(spec, cfg, cache.lengths) if signal else None
        logits, cache, aux = model.forward(params, cfg, tok[:, None], cache, impl=impl, live=live, probe=probe,
                                           **m.draft_kwargs(spec, sel, j))
        if "probe" in aux:
            a_d = a_d + aux["probe"]
        logits = logits[:, 0]
        if samp.greedy:
            d, q = sampling.greedy(logits), None
        else:  # lossless rejection sampling needs drafts *sampled* from the processed q
            q = sampling.process_logits(logits, samp)
            d = sampling.draw(q, sub)
        return (cache, d, key, a_d), (d, q)

    a_d = jnp.zeros((cache.batch, cache.capacity), jnp.float32) if signal else None
    (cache, _, _, a_d), (drafts, q) = jax.lax.scan(step, (cache, last, key, a_d),
                                                   jnp.arange(spec.gamma, dtype=jnp.int32))
    drafts = drafts.T
    q = None if q is None else jnp.swapaxes(q, 0, 1)
    return drafts, q, cache, a_d


def extend(spec: SpecConfig, tokens, base, last, drafts, q):
    """Step 1b with spec.lookup: append G = spec.lookup prompt-lookup tokens to the drafts, proposed from each
    row's text (`tokens`, the record; slots < base) + [last, d1..dg]. Their q is a point mass (they are fixed
    by the prefix), so `sampling.verify_chain` accepts one with probability p(x) and after a rejection draws
    from p without x: still lossless. Returns drafts int32[B, gamma+G] and q (None for greedy)."""
    block = jnp.concatenate([last[:, None], drafts], axis=1)
    seq = lookup.commit(tokens, base, block, jnp.full_like(base, block.shape[1]))
    extra = lookup.propose(seq, base + block.shape[1], spec.lookup)
    if q is not None:
        q = jnp.concatenate([q, jax.nn.one_hot(extra, q.shape[-1], dtype=q.dtype)], axis=1)
    return jnp.concatenate([drafts, extra], axis=1), q


def verify(params, cfg: ModelConfig, spec: SpecConfig, cache, last, drafts, impl: AttnImpl = AttnImpl(), live=None):
    """One full-attention forward over [last, d1..dg] (+ the lookup tokens) at slots lengths.. (step 2);
    `live` as in `draft`.

    Returns:
      logits f32[B, depth+1, V], the cache (lengths + depth + 1), scores f32[L, B, S] or None.
    """
    rows = _method(spec).score_rows(spec)
    block = jnp.concatenate([last[:, None], drafts], axis=1)
    logits, cache, aux = model.forward(params, cfg, block, cache, score_rows=rows, score_mode=_score_mode(spec),
                                       impl=impl, live=live)
    return logits, cache, aux.get("scores")


def accept(samp: SamplingConfig, drafts, q, target_logits, key):
    """Lossless acceptance (step 3): n_accepted int32[B] in [0, gamma] and the corrected/bonus token int32[B].
    With no drafts ("ar") the token is plain decoding's (`sampling.next_token`, the same use of `key`)."""
    if drafts.shape[1] == 0:
        return jnp.zeros(drafts.shape[:1], jnp.int32), sampling.next_token(target_logits[:, 0], samp, key)
    if samp.greedy:
        return sampling.verify_greedy(drafts, target_logits)
    p = sampling.process_logits(target_logits, samp)
    return sampling.verify_chain(drafts, q, p, key, samp)


def emitted(drafts, n_accepted, next_token):
    """The n + 1 tokens a round emits, int32[B, gamma+1] padded with -1: d1..dn, then next_token."""
    B, g = drafts.shape
    i = jnp.arange(g + 1, dtype=jnp.int32)[None]
    d = jnp.concatenate([drafts, jnp.zeros((B, 1), jnp.int32)], axis=1)
    n = n_accepted[:, None]
    return jnp.where(i < n, d, jnp.where(i == n, next_token[:, None], -1))


# ------------------------------------------------------------------------------------------------- run

@struct.dataclass
class _Loop:
    cache: kv_cache.KVCache
    mstate: object
    last: jax.Array      # int32[B] newest emitted token (not in the cache)
    out: jax.Array       # int32[B, max_new + gamma + 1]: a round may overshoot max_new by up to gamma
    n_out: jax.Array     # int32[B]
    done: jax.Array      # bool[B]
    key: jax.Array
    rounds: jax.Array    # int32[B]
    hist: jax.Array      # int32[B, depth + 1]
    tokens: object = None  # int32[B, capacity] the text by cache slot (spec.lookup, not longspec)
    verify: object = None  # sparse_verify.State (lossy spec.verify only)


_STATIC = ("cfg", "spec", "samp", "max_new_tokens", "stop_tokens", "impl")


@functools.partial(jax.jit, static_argnames=_STATIC)
def run(params, cfg: ModelConfig, spec: SpecConfig, samp: SamplingConfig, state: State, key, max_new_tokens: int,
        stop_tokens: tuple = (), impl: AttnImpl = AttnImpl(), drafter=None):
    """Generate up to max_new_tokens per sequence with self-speculative decoding (one while_loop).

    Pure and jittable (static cfg, spec, samp, max_new_tokens, stop_tokens, impl): usable inside the caller's
    own jit. Standalone, prefer `run_donating`, which updates the cache in place instead of copying it.

    Args:
      state: from `init`.
      key: PRNG key (unused for greedy sampling configs).
      max_new_tokens, stop_tokens: static; a sequence ends after emitting a stop token (kept) or
        max_new_tokens tokens. Greedy output equals plain greedy decoding's in exact arithmetic (float32 at
        HIGHEST matmul precision) and in bf16 exact mode (both with impl=AttnImpl(exact=True)); in default
        bf16 up to near-tie rounding (docs/methods.md, "Lossless"). Sampled output has the target's
        distribution.
      drafter: longspec only: the drafter block's params (traced, not donated).
    Returns:
      tokens int32[B, max_new_tokens] padded with -1, n_out int32[B], SpecStats.
    """
    return _run(params, cfg, spec, samp, state, key, max_new_tokens, stop_tokens, impl, drafter)[:3]


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames=("state",))
def run_donating(params, cfg: ModelConfig, spec: SpecConfig, samp: SamplingConfig, state: State, key,
                 max_new_tokens: int, stop_tokens: tuple = (), impl: AttnImpl = AttnImpl(), drafter=None):
    """`run` that donates `state` and also returns the final State (its cache aliases the input's buffers,
    so the while_loop updates the cache in place: no copy of a multi-GB cache per call)."""
    return _run(params, cfg, spec, samp, state, key, max_new_tokens, stop_tokens, impl, drafter)


def _run(params, cfg, spec, samp, state, key, max_new_tokens, stop_tokens, impl, drafter=None):
    st = start(spec, samp, state, key, max_new_tokens, stop_tokens)
    st = rounds(params, cfg, spec, samp, st, max_new_tokens, stop_tokens, impl, drafter)
    return finish(st, state.logits)


def rounds(params, cfg, spec, samp, st: "_Loop", max_new_tokens, stop_tokens, impl, drafter=None,
           more=None, between=None, carry=None):
    """The while_loop of rounds: until every row is done, or earlier once `more` (traced bool) is False.
    Every decoding loop in jspec is this one.

    Without `between`: returns the final _Loop; `more(st)` (continuous batching stops when enough rows are free
    for a refill). With `between(st, carry) -> (st, carry)`, run after every round with a carry of its own
    (continuous batching's refills on the device): returns (st, carry); `more(st, carry)`."""
    def one(st):
        return round_(params, cfg, spec, samp, st, max_new_tokens, stop_tokens, impl, drafter)

    if between is None:
        def cond(st):
            going = ~jnp.all(st.done)
            return going if more is None else going & more(st)

        return jax.lax.while_loop(cond, one, st)

    def cond_with(c):
        going = ~jnp.all(c[0].done)
        return going if more is None else going & more(*c)

    return jax.lax.while_loop(cond_with, lambda c: between(one(c[0]), c[1]), (st, carry))


def finish(st: "_Loop", logits):
    """(tokens [B, max_new_tokens], n_out, SpecStats, final State) of a finished loop."""
    max_new = st.out.shape[1] - st.hist.shape[1]
    final = State(cache=st.cache, logits=logits, method=st.mstate, tokens=st.tokens, verify=st.verify)
    return st.out[:, :max_new], st.n_out, SpecStats(rounds=st.rounds, accept_hist=st.hist), final


def _stop_test(stop_tokens):
    stops = jnp.asarray(stop_tokens if stop_tokens else (-1,), jnp.int32)
    return lambda t: jnp.any(t[..., None] == stops, axis=-1)


def start(spec: SpecConfig, samp: SamplingConfig, state: State, key, max_new_tokens: int, stop_tokens=()) -> "_Loop":
    """The loop carry before the first round: each row's first token drawn from the prefill's logits."""
    B = state.logits.shape[0]
    g = spec.depth
    is_stop = _stop_test(stop_tokens)
    key, sub = jax.random.split(key)
    first = sampling.next_token(state.logits, samp, sub)
    out = jnp.full((B, max_new_tokens + g + 1), -1, jnp.int32).at[:, 0].set(first)
    return _Loop(cache=state.cache, mstate=state.method, last=first, out=out, n_out=jnp.ones((B,), jnp.int32),
                 done=is_stop(first) | (max_new_tokens <= 1), key=key, rounds=jnp.zeros((B,), jnp.int32),
                 hist=jnp.zeros((B, g + 1), jnp.int32), tokens=state.tokens, verify=state.verify)


def round_(params, cfg, spec, samp, st: "_Loop", max_new_tokens, stop_tokens, impl, drafter=None) -> "_Loop":
    """One round (the while_loop body): draft, verify, accept, emit, roll back, update the selection."""
    m = _method(spec)
    g = spec.depth
    is_stop = _stop_test(stop_tokens)
    if spec.method == "ar":   # one key per step, as plain decoding splits it: the same sampled tokens
        key, k_accept = jax.random.split(st.key)
        k_draft = None
    else:
        key, k_draft, k_accept = jax.random.split(st.key, 3)
    base = st.cache.lengths
    live = ~st.done   # finished rows ride along without reading their caches (model.forward's `live`)
    vs = st.verify   # None: dense verification, exactly the lossless program
    scores = None
    if hasattr(m, "tree_round"):   # drafts = the accepted path; the cache is already compacted
        drafts, n_acc, nxt, cache, mstate, vs = m.tree_round(params, cfg, spec, samp, drafter, st.mstate, st.cache,
                                                             st.last, live, k_draft, k_accept, impl, vs)
    else:
        mstate = st.mstate
        signal = vs is not None and sparse_verify.uses_draft(spec)
        drafts, q, cache, a_d = draft(params, cfg, spec, samp, st.mstate, st.cache, st.last, k_draft, impl, live,
                                      signal)
        if spec.lookup:
            drafts, q = extend(spec, st.tokens, base, st.last, drafts, q)
        cache = kv_cache.rollback(cache, base)          # verification rewrites the drafted slots
        if vs is None:
            logits, cache, scores = verify(params, cfg, spec, cache, st.last, drafts, impl, live)
        else:
            block = jnp.concatenate([st.last[:, None], drafts], axis=1)
            logits, cache, scores, vs = sparse_verify.forward(
                params, cfg, spec, vs, block, cache, a_d, score_rows=m.score_rows(spec),
                score_mode=_score_mode(spec), impl=impl, live=live)
        n_acc, nxt = accept(samp, drafts, q, logits, k_accept)

    # Emit d1..dn + next, cut after the first stop token and at max_new_tokens; finished rows emit nothing.
    tokens = emitted(drafts, n_acc, nxt)
    i = jnp.arange(g + 1, dtype=jnp.int32)[None]
    stop_at = jnp.where(is_stop(tokens) & (i <= n_acc[:, None]), i, g + 1).min(axis=1)   # g+1: none
    count = jnp.minimum(jnp.minimum(n_acc + 1, stop_at + 1), max_new_tokens - st.n_out)
    count = jnp.where(st.done, 0, count)
    tokens = jnp.where(i < count[:, None], tokens, -1)
    # Slots >= n_out are still -1, so writing the whole padded row is safe.
    out = jax.vmap(lambda row, t, s: jax.lax.dynamic_update_slice(row, t, (s,)))(st.out, tokens, st.n_out)
    n_out = st.n_out + count
    done = st.done | (stop_at < count) | (n_out >= max_new_tokens)

    cache = cache.replace(lengths=jnp.where(live, base + n_acc + 1, base))
    rec = st.tokens
    if rec is not None:   # `last` and the accepted drafts are now at slots base .. base + n_acc
        block = jnp.concatenate([st.last[:, None], drafts], axis=1)
        rec = lookup.commit(rec, base, block, jnp.where(live, n_acc + 1, 0))
    mstate = m.update(spec, mstate, cache, scores, base)
    if vs is not None:
        vs = sparse_verify.update(spec, vs, cache, base)
    hist = st.hist + (jax.nn.one_hot(n_acc, g + 1, dtype=jnp.int32) * live[:, None].astype(jnp.int32))
    return _Loop(cache=cache, mstate=mstate, last=jnp.where(live, nxt, st.last), out=out, n_out=n_out,
                 done=done, key=key, rounds=st.rounds + live.astype(jnp.int32), hist=hist, tokens=rec, verify=vs)
