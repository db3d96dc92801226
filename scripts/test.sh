#!/usr/bin/env bash
# The test suite (CPU; Pallas kernels in interpret mode). With arguments: one pytest run with them.
# Without: one pytest process per test file, JSPEC_TEST_JOBS of them at a time (default: one per 4 CPUs, at
# most 4, one per ~5 GB of available memory; so one at a time on 2 cores, where two at a time each ran 2.1-2.3x
# longer: XLA's compiler and CPU runtime use both cores). A single process that compiles the whole suite's
# programs (hundreds of XLA CPU executables) crashed once with a segfault inside XLA's compiler, ~300 tests in,
# while the same file passed on its own; separate processes bound what one process accumulates.
# Each file's output is printed whole when it ends ("== file (exit N, S s)").
# Exit: 0 if every file passed, 1 if any failed, 5 if no file collected a test (pytest's code).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# JAX's persistent compilation cache, shared by the test processes (and kept between runs): an XLA program
# that took >= 1 s to compile is stored once and loaded by every later file that builds the same program
# (tests/test_speculative_smollm2.py alone: 264 s with an empty cache, 113 s with a warm one). Capped at 2 GB
# (least recently used entries go); JAX_COMPILATION_CACHE_DIR=... points it elsewhere.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$PWD/.venv/jax-cache}"
export JAX_COMPILATION_CACHE_MAX_SIZE="${JAX_COMPILATION_CACHE_MAX_SIZE:-2000000000}"

# XLA's CPU backend without LLVM's optimisations: the suite is mostly compile time (hundreds of small programs,
# each run a few times), and -O0 compiles them faster than it slows them down (tests/test_model.py 202 -> 139 s,
# tests/test_speculative_smollm2.py 302 -> 234 s on 2 cores). Every comparison in the suite is between programs
# built with the same flags. Tests run only here; what users run is compiled with XLA's defaults.
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_backend_optimization_level=0"

if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi

jobs=${JSPEC_TEST_JOBS:-}
if [ -z "$jobs" ]; then
  mem_gb=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo 2>/dev/null || echo 8)
  jobs=$(( $(nproc 2>/dev/null || echo 1) / 4 ))
  [ "$jobs" -gt 4 ] && jobs=4
  [ "$jobs" -gt $((mem_gb / 5)) ] && jobs=$((mem_gb / 5))
  [ "$jobs" -lt 1 ] && jobs=1
fi
# The real model is converted once here, not by two test processes at the same time.
.venv/bin/python -c "from jspec.checkpoints import fetch_default; fetch_default(progress=False)" >/dev/null 2>&1 ||
  echo "test.sh: could not stage the default model; the tests that need it will say why" >&2

# Files that take minutes start first (a hint for balance only; every tests/test_*.py runs).
first="longspec speculative_smollm2 api dustin_verify speculative serve model bench exact tune"
files=()
for n in $first; do [ -f "tests/test_$n.py" ] && files+=("tests/test_$n.py"); done
for f in tests/test_*.py; do
  case " ${files[*]} " in *" $f "*) ;; *) files+=("$f") ;; esac
done

results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
run_one() {  # run_one FILE: pytest on one file; its log printed whole (under a lock), its exit code kept
  local f=$1 log="$results/$(basename "$1").log" t0=$SECONDS rc
  .venv/bin/python -m pytest -q "$f" >"$log" 2>&1
  rc=$?
  echo "$rc" >"$results/$(basename "$f").rc"
  flock "$results/.print" bash -c 'echo "== $1 (exit $2, $3 s)"; cat "$4"' _ "$f" "$rc" "$((SECONDS - t0))" "$log"
}
export -f run_one
export results
echo "test.sh: ${#files[@]} test files, $jobs at a time"
printf '%s\n' "${files[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one "$1"' _ {}

failed=() collected=0
for f in "${files[@]}"; do
  rc=$(cat "$results/$(basename "$f").rc" 2>/dev/null || echo missing)
  case "$rc" in
    0) collected=1 ;;
    5) ;;                                   # this file collected nothing (e.g. all skipped by marker)
    *) collected=1; failed+=("$f (exit $rc)") ;;
  esac
done
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
[ "$collected" -eq 1 ] || exit 5
echo "all test files passed"
