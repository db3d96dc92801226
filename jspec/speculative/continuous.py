"""Continuous batching for the speculative engine: B slots fed from a queue of requests.

A static batch runs until its slowest row is done: with speculative decoding the rows accept at different
rates (vegas' slowest row at L=8000, B=64 needs 1.15x the mean row's rounds; LongSpec's at B=16 1.72x,
README "GPU results"), so the fast rows idle for the rest of the call. Here the engine's rounds run in
segments (`run_until`: a jitted while_loop that returns as soon as a row finishes) and, between segments, the
host hands each finished slot the next request: its prompt is prefilled alone (B=1, `engine.init`) and its
cache rows, method state and loop state are written into the slot (`insert`). The other rows keep their cache
and state untouched, so every request's greedy output is the one plain decoding gives it alone.

    outs, stats = serve(params, cfg, spec, samp, prompts, batch=16, capacity=8448, max_new_tokens=256)

Batch axes are found, not declared: a leaf's batch axis is the one whose size differs between the B-slot
loop state and a 1-slot one (every per-row array of the engine and of each method's state has exactly one).
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
              stop_tokens: tuple = (), impl: AttnImpl = AttnImpl(), drafter=None):
    """Rounds until some row not yet `retired` (bool[B]) is done, or every row is: the loop carry, donated."""
    def cond(st):
        return ~jnp.any(st.done & ~retired) & ~jnp.all(st.done)

    return jax.lax.while_loop(
        cond, lambda st: engine.round_(params, cfg, spec, samp, st, max_new_tokens, stop_tokens, impl, drafter), st)


def _put_row(big, small, row):
    """`big` with its batch-axis slice `row` replaced by `small` (the same array with a batch of one)."""
    diff = [a for a, (m, n) in enumerate(zip(big.shape, small.shape)) if m != n]
    if not diff:                      # a batch of one: the new row is the whole leaf
        return small
    if len(diff) != 1 or small.shape[diff[0]] != 1:
        raise ValueError(f"cannot find the batch axis of {big.shape} vs {small.shape}")
    return jax.lax.dynamic_update_index_in_dim(big, small.astype(big.dtype), row, diff[0])


@functools.partial(jax.jit, static_argnames=("spec", "samp", "max_new_tokens", "stop_tokens"),
                   donate_argnames=("st",))
def insert(st, one: engine.State, row, spec: SpecConfig, samp: SamplingConfig, key, max_new_tokens: int,
           stop_tokens: tuple = ()):
    """Slot `row` of the loop carry `st` restarted on a freshly prefilled 1-row State (`engine.init`)."""
    fresh = engine.start(spec, samp, one, key, max_new_tokens, stop_tokens)
    fresh = dataclasses.replace(fresh, key=st.key)     # the batch keeps its own PRNG stream
    return jax.tree.map(lambda b, s: _put_row(b, s, row), st, fresh)


@dataclasses.dataclass
class ServeStats:
    """Per request (in request order) and for the whole queue."""

    rounds: list            # target verifications of each request
    accept_hist: list       # accepted-length histogram of each request
    decode_s: float         # time in the rounds (run_until)
    prefill_s: float        # time prefilling and inserting requests (initial batch included)
    segments: int           # run_until calls
    new_tokens: int         # tokens emitted over the queue

    @property
    def tau(self) -> float:
        return float(engine._mean_emitted(np.asarray(self.accept_hist).sum(0)))

    def tau_per_sequence(self) -> np.ndarray:
        return engine._mean_emitted(np.asarray(self.accept_hist))

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / max(self.decode_s + self.prefill_s, 1e-9)


def _bucket(n: int, step: int = 256) -> int:
    return -(-n // step) * step


def serve(params, cfg: ModelConfig, spec: SpecConfig, samp: SamplingConfig, prompts: Sequence, *, batch: int,
          capacity: int, max_new_tokens: int, stop_tokens: tuple = (), impl: AttnImpl = AttnImpl(), drafter=None,
          seed: int = 0, progress: bool = False):
    """Generate for every prompt (lists / arrays of token ids, any count) through `batch` slots.

    Returns (outputs: one int32 array of emitted tokens per prompt, in order; ServeStats). Each prompt is
    prefilled alone, padded to a multiple of 256 tokens (one compiled prefill per bucket).
    capacity: cache slots per row, >= longest prompt + max_new_tokens + spec.capacity_margin().
    """
    prompts = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
    if not prompts:
        raise ValueError("serve needs at least one prompt")
    if batch < 1:
        raise ValueError(f"{batch=} must be >= 1")
    need = max(len(p) for p in prompts) + max_new_tokens + spec.capacity_margin()
    if min(len(p) for p in prompts) < 1:
        raise ValueError("every prompt needs at least one token")
    if capacity < need:
        raise ValueError(f"capacity {capacity} < longest prompt + max_new_tokens + margin = {need}")
    stop_tokens = tuple(stop_tokens)
    key = jax.random.key(seed)

    def prefill(ids):   # -> a 1..B-row engine.State
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
    slot_req = first + [-1] * (batch - len(first))
    retired = np.array([r < 0 for r in slot_req])
    st = st.replace(done=st.done | jnp.asarray(retired))    # idle slots ride along without decoding
    jax.block_until_ready(st)
    prefill_s, decode_s, segments = time.perf_counter() - t0, 0.0, 0
    queue = list(range(len(first), len(prompts)))
    outs: list = [None] * len(prompts)
    rounds: list = [None] * len(prompts)
    hists: list = [None] * len(prompts)
    while not retired.all():
        t = time.perf_counter()
        st = run_until(params, cfg, spec, samp, st, jnp.asarray(retired), max_new_tokens, stop_tokens, impl, drafter)
        done = np.asarray(st.done)
        decode_s += time.perf_counter() - t
        segments += 1
        t = time.perf_counter()
        finished = np.flatnonzero(done & ~retired)
        if finished.size:
            out, n_out = np.asarray(st.out), np.asarray(st.n_out)
            rnd, hist = np.asarray(st.rounds), np.asarray(st.hist)
        for row in finished:
            r = slot_req[row]
            outs[r], rounds[r], hists[r] = out[row, :n_out[row]].copy(), int(rnd[row]), hist[row].copy()
            if bar is not None:
                bar.update(1)
            if queue:
                nxt = queue.pop(0)
                key, sub = jax.random.split(key)
                st = insert(st, prefill([prompts[nxt]]), jnp.int32(row), spec, samp, sub, max_new_tokens,
                            stop_tokens)
                slot_req[row] = nxt
            else:
                retired[row] = True
        jax.block_until_ready(st)
        prefill_s += time.perf_counter() - t
    if bar is not None:
        bar.close()
    stats = ServeStats(rounds=rounds, accept_hist=hists, decode_s=decode_s, prefill_s=prefill_s, segments=segments,
                       new_tokens=int(sum(len(o) for o in outs)))
    return outs, stats
