"""Shared benchmark plumbing: timing, device facts, JSON records, model loading on the GPU machine."""
from __future__ import annotations

import json
import os
import subprocess
import time

import jax
import numpy as np

HBM_BYTES_PER_S = 4.3e12   # measured device-to-device copy ceiling on the H200 (../shared/gpu/README.md)


def device_name() -> str:
    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '?')}"


def commit() -> str:
    if os.environ.get("JSPEC_COMMIT"):
        return os.environ["JSPEC_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


def peak_memory_bytes() -> int | None:
    try:
        return int(jax.devices()[0].memory_stats()["peak_bytes_in_use"])
    except Exception:
        return None


def timed(fn, *args, **kw):
    """(result, seconds) with the result blocked on."""
    t = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kw))
    return out, time.perf_counter() - t


def base_record(**kw) -> dict:
    return {"device": device_name(), "jax": jax.__version__, "commit": commit(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""), **kw}


def write_json(path: str, records: list, summary: dict, **extra):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"records": records, "summary": summary, **extra}, f, indent=1)
    print(f"wrote {path}")


class CompilePool:
    """Lower programs on the calling thread, compile them in a thread pool (XLA releases the GIL).

    Benchmarks with dozens of programs submit every (name, lower) first, use `projected_end` to stop adding
    shapes that would not finish compiling in their time budget, then collect with `results`."""

    def __init__(self, jobs: int, t_start: float, first_guess_s: float = 20.0):
        from concurrent.futures import ThreadPoolExecutor
        self.pool, self.jobs, self.t_start, self.first_guess_s = ThreadPoolExecutor(max(1, jobs)), max(1, jobs), \
            t_start, first_guess_s
        self.futures, self.names, self.durations = {}, [], []

    def _compile(self, lowered):
        t = time.perf_counter()
        out = lowered.compile()
        self.durations.append(time.perf_counter() - t)
        return out

    def submit(self, name, lower):
        """Queue `lower()`'s compile under `name`, unless a program of that name is already queued."""
        if name not in self.futures:
            self.futures[name] = self.pool.submit(self._compile, lower())
            self.names.append(name)

    def __contains__(self, name):
        return name in self.futures

    def result(self, name):
        return self.futures[name].result()

    def projected_end(self) -> float:
        """Seconds since t_start when the queued compiles should be done (the mean compile time so far, or
        first_guess_s before any is done, spread over the pool)."""
        pending = sum(not f.done() for f in self.futures.values())
        mean = sum(self.durations) / len(self.durations) if self.durations else self.first_guess_s
        return time.perf_counter() - self.t_start + pending * mean / self.jobs

    def results(self) -> dict:
        """Wait for every program, with progress every 10; {name: compiled}."""
        print(f"lowered {len(self.names)} programs in {time.perf_counter() - self.t_start:.0f} s; compiling with "
              f"{self.jobs} threads", flush=True)
        out = {}
        for i, name in enumerate(self.names):
            out[name] = self.futures[name].result()
            if (i + 1) % 10 == 0 or i + 1 == len(self.names):
                print(f"  compiled {i + 1}/{len(self.names)} ({time.perf_counter() - self.t_start:.0f} s)", flush=True)
        self.pool.shutdown()
        return out

    def stats(self) -> dict:
        d = self.durations
        return dict(programs=len(self.names), compile_each_s_mean=round(sum(d) / len(d), 1) if d else None,
                    compile_each_s_max=round(max(d), 1) if d else None)


def row_stats(stats) -> dict:
    """Per-sequence acceptance of a speculative run (jspec.speculative.engine.SpecStats): each row's tau, the
    smallest, and `straggler` = rounds of the slowest row / mean rounds per row. A static batch runs as many
    rounds as its slowest row, so its tokens/s is the mean-rounds rate divided by `straggler`."""
    rounds = np.asarray(stats.rounds)
    taus = stats.tau_per_sequence()
    return dict(tau_rows=[round(float(x), 3) for x in taus], tau_row_min=round(float(taus.min()), 3),
                rounds_mean=round(float(rounds.mean()), 2),
                straggler=round(float(rounds.max() / max(rounds.mean(), 1e-9)), 3))
