"""Continuous batching for the speculative engine: B slots fed from a queue of requests.

A static batch runs until its slowest row is done: with speculative decoding the rows accept at different
rates (a LongSpec batch's slowest row can need well over the mean row's rounds; docs/performance.md), so the
fast rows idle for the rest of the call. Here the engine's rounds run in
segments (`run_until`: a jitted while_loop that returns once `refill` rows are done) and, between segments,
the host hands the finished slots the next requests: their prompts are prefilled together (`engine.init`)
and their cache rows, method state and loop state are written into the slots (`insert`). The other rows keep
their cache and state untouched, so every request's greedy output is the one plain decoding gives it alone.

    outs, stats = serve(params, cfg, spec, samp, prompts, batch=16, capacity=8448, max_new_tokens=256)

With staged=True the next requests are prefilled ahead instead and the loop itself (`run_staged`: the engine's
`rounds` with a between-rounds hook) hands each finished row a staged one after the round it finished in, so
no slot waits for others to finish.

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
    return engine.rounds(params, cfg, spec, samp, st, max_new_tokens, stop_tokens, impl, drafter,
                         more=lambda st: jnp.sum(st.done & ~retired) < need)


def _take_row(big, small, slot, row, axis):
    """`big` with slot `slot` of its batch axis replaced by row `row` of `small` (traced scalars). A leaf without
    a batch axis (the batch's PRNG key) stays the batch's."""
    if axis is None:
        return big
    piece = jax.lax.dynamic_slice_in_dim(small, row, 1, axis=axis).astype(big.dtype)
    return jax.lax.dynamic_update_slice_in_dim(big, piece, slot, axis=axis)


def _put_row(st, fresh, slot, row, axes):
    """The carry `st` with slot `slot` restarted on row `row` of the started carry `fresh` (every leaf)."""
    leaves = [_take_row(b, s, slot, row, a) for b, s, a in zip(jax.tree.leaves(st), jax.tree.leaves(fresh), axes)]
    return jax.tree.unflatten(jax.tree.structure(st), leaves)


_SAVED = ("out", "n_out", "rounds", "hist")   # what run_staged keeps of a row it replaces


@functools.partial(jax.jit, static_argnames=_STATIC + ("axes",), donate_argnames=("st",))
def run_staged(params, cfg: ModelConfig, spec: SpecConfig, samp: SamplingConfig, st, retired, stage, n_stage,
               axes: tuple, max_new_tokens: int, stop_tokens: tuple = (), impl: AttnImpl = AttnImpl(),
               drafter=None):
    """Rounds that refill finished rows on the device from `stage`, a started K-row carry of the next requests
    (prefilled together before the call): after every round each finished row not `retired` takes the next
    staged row, its own results saved first. Returns once the first `n_stage` staged rows are all in (n_stage
    0: once every row is done).

    Returns (st, n_used, saved, iterations): saved = {"slot", "out", "n_out", "rounds", "hist"} with K entries,
    entry i the results of the row that staged row i replaced (`slot`; -1 past n_used), in insertion order."""
    K = stage.done.shape[0]
    saved = {"slot": jnp.full((K,), -1, jnp.int32),
             **{f: jnp.zeros((K,) + getattr(st, f).shape[1:], getattr(st, f).dtype) for f in _SAVED}}

    def swap_in(st, c):   # every finished row takes a staged one while any is left
        def one(c):
            st, used, saved = c
            slot = jnp.argmax(st.done & ~retired).astype(jnp.int32)
            row = {"slot": slot, **{f: getattr(st, f)[slot] for f in _SAVED}}
            saved = jax.tree.map(lambda buf, x: buf.at[used].set(x), saved, row)
            return _put_row(st, stage, slot, used, axes), used + 1, saved

        st, used, saved = jax.lax.while_loop(lambda c: jnp.any(c[0].done & ~retired) & (c[1] < n_stage), one,
                                             (st,) + c[:2])
        return st, (used, saved) + c[2:]

    def between(st, c):   # after each round: the refills, and the round count
        st, (used, saved, it) = swap_in(st, c)
        return st, (used, saved, it + 1)

    st, (used, saved) = swap_in(st, (jnp.int32(0), saved))     # rows that finished in the previous call
    st, (used, saved, it) = engine.rounds(params, cfg, spec, samp, st, max_new_tokens, stop_tokens, impl, drafter,
                                          more=lambda st, c: (c[0] < n_stage) | (n_stage == 0), between=between,
                                          carry=(used, saved, jnp.int32(0)))
    return st, used, saved, it


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


@functools.partial(jax.jit, static_argnames=("axes",), donate_argnames=("st",))
def insert(st, fresh, rows, axes: tuple):
    """Slots `rows` (int32[K]) of the loop carry `st` replaced by the rows of `fresh`, a started K-row carry
    (`engine.start` on `engine.init`); `axes` = batch_axes(st, a 1-row carry). Rows >= B are padding and
    write nothing. One dynamic_update_slice per row and leaf: XLA's scatter of the same rows ran at a
    small fraction of the copy's bandwidth (docs/performance.md, "Continuous batching")."""
    B = st.done.shape[0]
    for i in range(rows.shape[0]):
        st = jax.lax.cond(rows[i] < B, lambda st, i=i: _put_row(st, fresh, rows[i], i, axes), lambda st: st, st)
    return st


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
          seed: int = 0, refill: int | None = None, staged: bool = False, progress: bool = False, on_result=None,
          mesh=None):
    """Generate for every prompt (lists / arrays of token ids, any count) through `batch` slots.

    Returns (outputs: one int32 array of emitted tokens per prompt, in order; ServeStats). Prompts are
    prefilled `refill` at a time (one compiled prefill per 256-token bucket of the longest).
    staged=False (default): the rounds run until `refill` slots are free, which are then prefilled and filled
    together (`run_until` + `insert`); the free slots wait meanwhile. Default refill min(4, batch // 4) (at
    least 1): one-row refills prefill one prompt at a time, large ones leave slots idle longer; 4 measured best
    of {1, 2, 4, 8} (docs/performance.md).
    staged=True: the next `refill` requests are prefilled *ahead* into a staging carry and the rounds' loop
    hands each finished row the next staged one on the device, right after the round it finished in
    (`run_staged`): no slot waits, but every round pays a check (a host sync) and each refill a row copy, so it
    pays only where rows finish very unevenly; measured, it was even on decode for LongSpec and slower for vegas
    (docs/performance.md).
    capacity: cache slots per row, >= longest prompt + max_new_tokens + spec.capacity_margin().
    on_result: called as on_result(i, tokens) the moment the host learns request i is done (in finishing
    order), e.g. to stream answers out of a server loop.
    mesh: the params' tensor-parallel mesh (`jspec.sharding`; `jspec.load(devices=N)` sets `Model.mesh`):
    every prefill creates its cache rows head-sharded on it (`engine.init_sharded`).
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
        if mesh is not None:
            return engine.init_sharded(params, cfg, spec, toks, lens, capacity, mesh, impl=impl, drafter=drafter)
        return engine.init(params, cfg, spec, jnp.asarray(toks), jnp.asarray(lens), capacity, impl=impl,
                           drafter=drafter)

    def started(ids, key):   # a started carry of len(ids) rows
        return engine.start(spec, samp, prefill(ids), key, max_new_tokens, stop_tokens)

    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(prompts), desc=f"serve {spec.method}", unit="req")
    res = _Results(len(prompts), on_result, bar)
    t0 = time.perf_counter()
    first = list(range(min(batch, len(prompts))))
    ids = [prompts[i] for i in first] + [prompts[0]] * (batch - len(first))   # idle slots: a copy, retired
    key, sub = jax.random.split(key)
    st = started(ids, sub)
    # Batch axes from shapes only: a 1-row carry (2 rows for one slot) traced, not run.
    if batch > 1:
        axes = batch_axes(st, jax.eval_shape(lambda: started(ids[:1], sub)))
    else:
        axes = batch_axes(jax.eval_shape(lambda: started(ids * 2, sub)), st)
    slot_req = first + [-1] * (batch - len(first))
    retired = np.array([r < 0 for r in slot_req])
    st = st.replace(done=st.done | jnp.asarray(retired))    # idle slots ride along without decoding
    jax.block_until_ready(st)
    timer = _Timer(time.perf_counter() - t0)
    queue = list(range(len(first), len(prompts)))
    loop = _staged if staged else _unstaged
    loop(params, cfg, spec, samp, st, retired, slot_req, queue, axes, refill, key, prompts, started, res, timer,
         batch, max_new_tokens, stop_tokens, impl, drafter)
    if bar is not None:
        bar.close()
    stats = ServeStats(rounds=res.rounds, accept_hist=res.hists, decode_s=timer.decode_s, prefill_s=timer.prefill_s,
                       segments=timer.segments, iterations=timer.iterations, batch=batch,
                       new_tokens=int(sum(len(o) for o in res.outs)))
    return res.outs, stats


@dataclasses.dataclass
class _Timer:
    prefill_s: float
    decode_s: float = 0.0
    segments: int = 0
    iterations: int = 0


class _Results:
    """Per-request outputs as they come in (reported to on_result and the progress bar)."""

    def __init__(self, n, on_result, bar):
        self.outs, self.rounds, self.hists = [None] * n, [None] * n, [None] * n
        self.on_result, self.bar = on_result, bar

    def add(self, r, out, n_out, rounds, hist):
        self.outs[r], self.rounds[r], self.hists[r] = np.array(out[:n_out]), int(rounds), np.array(hist)
        if self.on_result is not None:
            self.on_result(r, self.outs[r])
        if self.bar is not None:
            self.bar.update(1)


def _staged(params, cfg, spec, samp, st, retired, slot_req, queue, axes, refill, key, prompts, started, res, timer,
            batch, max_new_tokens, stop_tokens, impl, drafter):
    stage, n_stage = None, 0
    while True:
        t = time.perf_counter()
        nxt = queue[:refill]
        del queue[:refill]
        if nxt:   # the last stage is padded with copies of its last request, never swapped in (n_stage)
            key, sub = jax.random.split(key)
            stage = started([prompts[i] for i in nxt + nxt[-1:] * (refill - len(nxt))], sub)
            jax.block_until_ready(stage)
        timer.prefill_s += time.perf_counter() - t
        t = time.perf_counter()
        if stage is None:   # the queue fit in the slots: nothing to refill
            st = run_until(params, cfg, spec, samp, st, jnp.asarray(retired), max_new_tokens, stop_tokens, impl,
                           drafter, jnp.int32(batch + 1))
            it = int(np.asarray(st.rounds).max())
        else:
            st, used, saved, it = run_staged(params, cfg, spec, samp, st, jnp.asarray(retired), stage,
                                             jnp.int32(len(nxt)), axes, max_new_tokens, stop_tokens, impl, drafter)
            saved = jax.tree.map(np.asarray, saved)
            for i in range(int(used)):          # in insertion order: a slot may turn over twice in one call
                slot = int(saved["slot"][i])
                res.add(slot_req[slot], saved["out"][i], saved["n_out"][i], saved["rounds"][i], saved["hist"][i])
                slot_req[slot] = nxt[i]
            it = int(it)
        timer.decode_s += time.perf_counter() - t
        timer.segments += 1
        timer.iterations += it
        if not nxt:          # that was the last call: every row ran to its end
            out, n_out, rnd, hist = (np.asarray(x) for x in (st.out, st.n_out, st.rounds, st.hist))
            for slot in np.argsort(rnd, kind="stable"):      # roughly in finishing order
                if slot_req[slot] >= 0:
                    res.add(slot_req[slot], out[slot], n_out[slot], rnd[slot], hist[slot])
            return


def _unstaged(params, cfg, spec, samp, st, retired, slot_req, queue, axes, refill, key, prompts, started, res,
              timer, batch, max_new_tokens, stop_tokens, impl, drafter):
    WAITING = -2                                             # a finished slot, output taken, not refilled yet
    rnd_before = np.zeros(batch, np.int64)                   # rounds of each slot when its segment started
    while not retired.all():
        t = time.perf_counter()
        need = min(refill, len(queue)) if queue else batch + 1     # an empty queue: run every slot to its end
        st = run_until(params, cfg, spec, samp, st, jnp.asarray(retired), max_new_tokens, stop_tokens, impl, drafter,
                       jnp.int32(need))
        done = np.asarray(st.done)
        timer.decode_s += time.perf_counter() - t
        timer.segments += 1
        t = time.perf_counter()
        rnd = np.asarray(st.rounds)
        timer.iterations += int((rnd - rnd_before).max())  # a slot still running at the end ran throughout
        rnd_before = rnd.astype(np.int64)
        finished = [r for r in np.flatnonzero(done & ~retired) if slot_req[r] >= 0]
        if finished:
            out, n_out, hist = np.asarray(st.out), np.asarray(st.n_out), np.asarray(st.hist)
        for row in finished:
            res.add(slot_req[row], out[row], n_out[row], rnd[row], hist[row])
            slot_req[row] = WAITING
        free = [r for r in range(batch) if slot_req[r] == WAITING]
        while queue and free and (len(free) >= min(refill, len(queue)) or done.all()):
            k = min(refill, len(queue), len(free))
            nxt, rows = queue[:k], free[:k]
            del queue[:k], free[:k]
            pad = refill - k                     # one compiled shape: the last request again, written nowhere
            key, sub = jax.random.split(key)
            fresh = started([prompts[i] for i in nxt + nxt[-1:] * pad], sub)
            st = insert(st, fresh, jnp.asarray(rows + [batch] * pad, jnp.int32), axes)
            for row, i in zip(rows, nxt):
                slot_req[row] = i
                rnd_before[row] = 0                             # a fresh row starts at round 0
        if not queue:
            for row in free:
                retired[row] = True
        jax.block_until_ready(st)
        timer.prefill_s += time.perf_counter() - t
