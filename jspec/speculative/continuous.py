"""Continuous batching for the speculative engine: B slots fed from a queue of requests.

A static batch runs until its slowest row is done: with speculative decoding the rows accept at different
rates (vegas' slowest row at L=8000, B=64 needs 1.15x the mean row's rounds; LongSpec's at B=16 1.72x,
README "GPU results"), so the fast rows idle for the rest of the call. Here the engine's rounds run in
segments (`run_until`: a jitted while_loop that returns once `refill` rows are done) and, between segments,
the host hands the finished slots the next requests: their prompts are prefilled together (`engine.init`)
and their cache rows, method state and loop state are written into the slots (`insert`). The other rows keep
their cache and state untouched, so every request's greedy output is the one plain decoding gives it alone.

    outs, stats = serve(params, cfg, spec, samp, prompts, batch=16, capacity=8448, max_new_tokens=256)

Batch axes are found, not declared (`batch_axes`): a leaf's batch axis is the one whose size differs between
the B-slot loop state and a 1-slot one (every per-row array of the engine and of each method's state has exactly one).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jspec.attention import AttnImpl
from jspec.config import ModelConfig, SamplingConfig
from jspec.speculative import engine
from jspec.speculative.config import SpecConfig

_STATIC = ("cfg", "spec", "samp", "max_new_tokens", "stop_tokens", "impl")


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames=("st",))
def run_until(params, cfg: ModelConfig, spec: SpecConfig, samp: SamplingConfig, st, retired, max_new_tokens: int,
              stop_tokens: tuple = (), impl: AttnImpl = AttnImpl(), drafter=None, need=1):
    """Rounds until `need` rows not `retired` (bool[B]) are done, or every row is: the loop carry, donated.

    `need` is traced (one program for any value); rows done and waiting for a refill count towards it."""
    def cond(st):
        return (jnp.sum(st.done & ~retired) < need) & ~jnp.all(st.done)

    return jax.lax.while_loop(
        cond, lambda st: engine.round_(params, cfg, spec, samp, st, max_new_tokens, stop_tokens, impl, drafter), st)


def batch_axes(big, small) -> tuple:
    """Per leaf of two trees of one structure, B > 1 rows and 1 row: the axis whose size differs (None: the
    leaf has no batch axis)."""
    axes = []
    for (path, b), s in zip(jax.tree_util.tree_leaves_with_path(big), jax.tree.leaves(small)):
        diff = [a for a, (m, n) in enumerate(zip(b.shape, s.shape)) if m != n]
        if len(diff) > 1 or (diff and s.shape[diff[0]] != 1) or len(b.shape) != len(s.shape):
            raise ValueError(f"cannot find the batch axis of {jax.tree_util.keystr(path)}: {b.shape} vs {s.shape}")
        axes.append(diff[0] if diff else None)
    return tuple(axes)


def _put_rows(big, small, rows, axis):
    """`big` with the slices `rows` (int32[K]) of its batch axis replaced by `small` (K rows on that axis);
    a row index past the end drops its update (padding). A leaf without a batch axis (axis None) becomes `small`."""
    if axis is None:
        return small
    return big.at[(slice(None),) * axis + (rows,)].set(small.astype(big.dtype), mode="drop")


@functools.partial(jax.jit, static_argnames=("axes", "spec", "samp", "max_new_tokens", "stop_tokens"),
                   donate_argnames=("st",))
def insert(st, fresh: engine.State, rows, axes: tuple, spec: SpecConfig, samp: SamplingConfig, key,
           max_new_tokens: int, stop_tokens: tuple = ()):
    """Slots `rows` (int32[K]) of the loop carry `st` restarted on a freshly prefilled K-row State
    (`engine.init`); `axes` = batch_axes(st, a 1-row carry). Rows >= B are padding: their State rows are
    dropped (not written twice: sampled first tokens of two copies of a prompt differ, and a scatter with a
    repeated index may take each leaf from a different copy)."""
    new = engine.start(spec, samp, fresh, key, max_new_tokens, stop_tokens)
    new = dataclasses.replace(new, key=st.key)     # the batch keeps its own PRNG stream
    leaves = [_put_rows(b, s, rows, a) for b, s, a in zip(jax.tree.leaves(st), jax.tree.leaves(new), axes)]
    return jax.tree.unflatten(jax.tree.structure(st), leaves)


@dataclasses.dataclass
class ServeStats:
    """Per request (in request order) and for the whole queue."""

    rounds: list            # target verifications of each request
    accept_hist: list       # accepted-length histogram of each request
    decode_s: float         # time in the rounds (run_until)
    prefill_s: float        # time prefilling and inserting requests (initial batch included)
    segments: int           # run_until calls
    iterations: int         # loop iterations (rounds of the whole batch) over all segments
    batch: int              # slots
    new_tokens: int         # tokens emitted over the queue

    @property
    def tau(self) -> float:
        return float(engine._mean_emitted(np.asarray(self.accept_hist).sum(0)))

    def tau_per_sequence(self) -> np.ndarray:
        return engine._mean_emitted(np.asarray(self.accept_hist))

    @property
    def occupancy(self) -> float:
        """Share of the batch's row-rounds that advanced a request (1.0: no slot ever idle or waiting)."""
        return float(sum(self.rounds)) / max(self.batch * self.iterations, 1)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / max(self.decode_s + self.prefill_s, 1e-9)


def _bucket(n: int, step: int = 256) -> int:
    return -(-n // step) * step


def serve(params, cfg: ModelConfig, spec: SpecConfig, samp: SamplingConfig, prompts: Sequence, *, batch: int,
          capacity: int, max_new_tokens: int, stop_tokens: tuple = (), impl: AttnImpl = AttnImpl(), drafter=None,
          seed: int = 0, refill: int | None = None, progress: bool = False, on_result=None):
    """Generate for every prompt (lists / arrays of token ids, any count) through `batch` slots.

    Returns (outputs: one int32 array of emitted tokens per prompt, in order; ServeStats). Prompts are
    prefilled `refill` at a time (one compiled prefill per 256-token bucket of the longest): the rounds run
    until `refill` slots are free (fewer when the queue holds fewer), which are then filled together.
    refill=1 fills a slot as soon as it finishes; larger values trade idle slots for batched prefills and
    fewer host round trips. Default min(4, batch // 4) (at least 1): the best measured at L=8000 on the H200
    (refill 4 of {1, 2, 4, 8} at B=16; 4 and 8 ahead of 1 and 16 at B=64; bench/results/serve_*_h200.json).
    capacity: cache slots per row, >= longest prompt + max_new_tokens + spec.capacity_margin().
    on_result: called as on_result(i, tokens) the moment request i is done (in finishing order), e.g. to
    stream answers out of a server loop.
    """
    prompts = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
    if not prompts:
        raise ValueError("serve needs at least one prompt")
    if batch < 1:
        raise ValueError(f"{batch=} must be >= 1")
    if refill is None:
        refill = max(1, min(4, batch // 4))
    if refill < 1:
        raise ValueError(f"{refill=} must be >= 1")
    refill = min(refill, batch)
    required = max(len(p) for p in prompts) + max_new_tokens + spec.capacity_margin()
    if min(len(p) for p in prompts) < 1:
        raise ValueError("every prompt needs at least one token")
    if capacity < required:
        raise ValueError(f"capacity {capacity} < longest prompt + max_new_tokens + margin = {required}")
    stop_tokens = tuple(stop_tokens)
    key = jax.random.key(seed)

    def prefill(ids):   # -> a len(ids)-row engine.State
        P = min(_bucket(max(len(p) for p in ids)), capacity)
        toks = np.zeros((len(ids), P), np.int32)
        for i, p in enumerate(ids):
            toks[i, :len(p)] = p
        lens = np.array([len(p) for p in ids], np.int32)
        return engine.init(params, cfg, spec, jnp.asarray(toks), jnp.asarray(lens), capacity, impl=impl,
                           drafter=drafter)

    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(prompts), desc=f"serve {spec.method}", unit="req")
    t0 = time.perf_counter()
    first = list(range(min(batch, len(prompts))))
    ids = [prompts[i] for i in first] + [prompts[0]] * (batch - len(first))   # idle slots: a copy, retired
    st = engine.start(spec, samp, prefill(ids), key, max_new_tokens, stop_tokens)
    if batch > 1:   # shapes only: a 1-row carry traced, not run
        axes = batch_axes(st, jax.eval_shape(
            lambda: engine.start(spec, samp, prefill(ids[:1]), key, max_new_tokens, stop_tokens)))
    else:           # one slot: every leaf is that slot's
        axes = (None,) * len(jax.tree.leaves(st))
    WAITING = -2                                             # a finished slot, output taken, not refilled yet
    slot_req = first + [-1] * (batch - len(first))
    retired = np.array([r < 0 for r in slot_req])
    st = st.replace(done=st.done | jnp.asarray(retired))    # idle slots ride along without decoding
    jax.block_until_ready(st)
    prefill_s, decode_s, segments, iterations = time.perf_counter() - t0, 0.0, 0, 0
    rnd_before = np.zeros(batch, np.int64)                   # rounds of each slot when its segment started
    queue = list(range(len(first), len(prompts)))
    outs: list = [None] * len(prompts)
    rounds: list = [None] * len(prompts)
    hists: list = [None] * len(prompts)
    while not retired.all():
        t = time.perf_counter()
        need = min(refill, len(queue)) if queue else batch + 1     # an empty queue: run every slot to its end
        st = run_until(params, cfg, spec, samp, st, jnp.asarray(retired), max_new_tokens, stop_tokens, impl, drafter,
                       jnp.int32(need))
        done = np.asarray(st.done)
        decode_s += time.perf_counter() - t
        segments += 1
        t = time.perf_counter()
        rnd = np.asarray(st.rounds)
        iterations += int((rnd - rnd_before).max())        # a slot still running at the end ran throughout
        rnd_before = rnd.astype(np.int64)
        finished = [r for r in np.flatnonzero(done & ~retired) if slot_req[r] >= 0]
        if finished:
            out, n_out, hist = np.asarray(st.out), np.asarray(st.n_out), np.asarray(st.hist)
        for row in finished:
            r = slot_req[row]
            outs[r], rounds[r], hists[r] = out[row, :n_out[row]].copy(), int(rnd[row]), hist[row].copy()
            slot_req[row] = WAITING
            if on_result is not None:
                on_result(r, outs[r])
            if bar is not None:
                bar.update(1)
        free = [r for r in range(batch) if slot_req[r] == WAITING]
        while queue and free and (len(free) >= min(refill, len(queue)) or done.all()):
            k = min(refill, len(queue), len(free))
            nxt, rows = queue[:k], free[:k]
            del queue[:k], free[:k]
            pad = refill - k                     # one compiled shape: the last request again, written nowhere
            key, sub = jax.random.split(key)
            fresh = prefill([prompts[i] for i in nxt + nxt[-1:] * pad])
            st = insert(st, fresh, jnp.asarray(rows + [batch] * pad, jnp.int32), axes, spec, samp, sub,
                        max_new_tokens, stop_tokens)
            for row, i in zip(rows, nxt):
                slot_req[row] = i
                rnd_before[row] = 0                             # a fresh row starts at round 0
        if not queue:
            for row in free:
                retired[row] = True
        jax.block_until_ready(st)
        prefill_s += time.perf_counter() - t
    if bar is not None:
        bar.close()
    stats = ServeStats(rounds=rounds, accept_hist=hists, decode_s=decode_s, prefill_s=prefill_s, segments=segments,
                       iterations=iterations, batch=batch, new_tokens=int(sum(len(o) for o in outs)))
    return outs, stats
