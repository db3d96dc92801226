"""Shared benchmark plumbing: timing, device facts, JSON records, parallel compiles, per-row acceptance, and
reading a profiler trace into a per-kernel table (which kernels a jitted call launched, and their device time)."""
from __future__ import annotations

import glob
import gzip
import json
import os
import tempfile
import time
from collections import defaultdict

import jax
import numpy as np

# The HBM ceiling rooflines are drawn against: an H200's device-to-device copy bandwidth, measured with a plain
# array copy on the machines the committed results come from. Other GPUs: pass your own measurement.
HBM_BYTES_PER_S = 4.3e12


def device_name() -> str:
    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '?')}"


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
    """The per-record device facts; the file's provenance (commit, dirty flag, command) is `write_json`'s."""
    return {"device": device_name(), "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""), **kw}


def read_result(path: str) -> dict:
    """A result file for a summary script; an unreadable one ends the script with a one-line error."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: cannot read {path}: {e}") from None


def source_of(doc: dict) -> dict:
    """The provenance fields a summary cites for one of its source files."""
    p = doc.get("provenance") or doc.get("calibration", {}).get("provenance", {})
    return {k: p.get(k) for k in ("commit", "dirty", "command", "device")}


def write_json(path: str, records: list, summary: dict, **extra):
    """Write a result file with its provenance (`jspec.provenance`): refused when the source tree differs from
    its commit or has none, unless JSPEC_ALLOW_DIRTY=1 (the file then says dirty)."""
    from jspec import provenance
    try:
        prov = provenance.record(allow_dirty=os.environ.get("JSPEC_ALLOW_DIRTY") == "1")
    except provenance.ProvenanceError as e:
        raise SystemExit(f"error: {e} (JSPEC_ALLOW_DIRTY=1 records it as dirty)") from None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".part", "w") as f:
        json.dump({"provenance": prov, "records": records, "summary": summary, **extra}, f, indent=1)
    os.replace(path + ".part", path)
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


# --- profiler traces ------------------------------------------------------------------------------------------

# Kernel-name patterns -> coarse kinds, first match wins (Pallas kernels by name, cuBLAS/cutlass GEMMs, XLA's
# fusions by what their names say they are).
KINDS = (("flash_scores", "flash_scores"), ("tree_attention", "tree_attention"),
         ("sparse_attention", "sparse_attention"), ("topk_select", "topk_select"), ("score_weights", "score_weights"),
         ("gemm", "gemm"), ("nvjet", "gemm"), ("xmma", "gemm"), ("cutlass", "gemm"), ("memcpy", "memcpy"),
         ("memset", "memcpy"), ("reduce", "reduce fusion"), ("scatter", "scatter fusion"),
         ("dynamic_update_slice", "dus fusion"), ("fusion", "other fusion"))


def kind(name: str) -> str:
    """The coarse kind of a kernel name (KINDS), "other" when no pattern matches."""
    low = name.lower()
    return next((k for pat, k in KINDS if pat in low), "other")


def read_trace(trace_dir: str):
    """(events, {pid: process name}) of the newest Perfetto trace under trace_dir, or None."""
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)) or \
        sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True))
    if not files:
        return None
    with gzip.open(files[-1], "rt") as f:
        tr = json.load(f)
    events = tr["traceEvents"] if isinstance(tr, dict) else tr
    pname = {e["pid"]: e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    return events, pname


def _is_device(process_name: str) -> bool:
    return "GPU" in process_name.upper() and "HOST" not in process_name.upper()


def kernel_table(trace, n_calls: int) -> dict:
    """{kernel name: [total us, count]} per call, from the trace's device-side events."""
    events, pname = trace
    dev = {p for p, n in pname.items() if _is_device(n)}
    tab = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") == "X" and e.get("pid") in dev:
            t = tab[e["name"]]
            t[0] += float(e.get("dur", 0.0))
            t[1] += 1
    return {k: [v[0] / n_calls, v[1] / n_calls] for k, v in tab.items()}


def trace_table(fn, n: int = 1) -> dict:
    """Run `fn` n times under the JAX profiler; {kernel name: [us, count]} per call ({} without a GPU trace).
    `fn` should block on its result (jax.block_until_ready) so every kernel lands inside the trace."""
    d = tempfile.mkdtemp()
    jax.profiler.start_trace(d, create_perfetto_trace=True)
    for _ in range(n):
        fn()
    jax.profiler.stop_trace()
    trace = read_trace(d)
    return kernel_table(trace, n) if trace else {}


_DERIVED = ("xla op", "xla module", "tensorflow", "framework", "steps", "source")   # XProf's per-op summary lines


def device_calls(trace, n_calls: int):
    """The trace's device kernels split into n_calls calls at the n_calls - 1 widest gaps (the caller separates
    calls by a sleep): (a list per call of (name, start us, duration us), the device thread names read). Only
    stream threads are read when the trace names them, else every thread but XProf's derived per-op lines,
    which would count each kernel twice."""
    events, pname = trace
    dev = {p for p, n in pname.items() if _is_device(n)}
    threads = {(e["pid"], e.get("tid")): e.get("args", {}).get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") in dev}
    streams = {k for k, n in threads.items() if "stream" in n.lower()}
    derived = {k for k, n in threads.items() if any(d in n.lower() for d in _DERIVED)}
    read = (lambda k: k in streams) if streams else (lambda k: k not in derived)   # noqa: E731
    ks = sorted((float(e.get("ts", 0)), float(e.get("dur", 0)), e["name"]) for e in events
                if e.get("ph") == "X" and e.get("pid") in dev and read((e["pid"], e.get("tid"))))
    if not ks:
        return [], []
    end, gaps = ks[0][0] + ks[0][1], []
    for i in range(1, len(ks)):
        gaps.append((ks[i][0] - end, i))
        end = max(end, ks[i][0] + ks[i][1])
    cuts = sorted(i for _, i in sorted(gaps, reverse=True)[:n_calls - 1])
    bounds = [0] + cuts + [len(ks)]
    return [[(nm, ts, d) for ts, d, nm in ks[a:b]] for a, b in zip(bounds, bounds[1:])], \
        sorted({n for k, n in threads.items() if read(k)})
