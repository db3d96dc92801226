#!/usr/bin/env bash
# `jspec tune --method longspec` on the H200 with the bundled drafter: the draft-shape search at L=8000 for each
# batch size in BATCHES (default stdlib prompts), after staging the model as in bench/vegas_h200.sh. Writes
# $OUT/tune_longspec_B<b>_h200.json and the search's log. The results become the drafter's shipped shapes
# (checkpoints/drafters/<model>/tuned.json, via bench/tuned_shapes.py; `--save-shape` does it in one go).
# MIXED=1: rows alternate a held-out stdlib module (inspect.py) and held-out prose (.carry/heldout's
# austen_emma.txt), as bench/spec.py's rows do (`--prompt-dir`); TAG names the output files' variant.
#   BATCHES="16 1" bash bench/tune_longspec_h200.sh
#   MIXED=1 TAG=mixed BATCHES="16 1" bash bench/tune_longspec_h200.sh
set -uo pipefail
export XLA_FLAGS="${XLA_FLAGS:---xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false}"
prompts=()
if [ "${MIXED:-0}" = 1 ]; then
  dir=/root/tune-prompts && mkdir -p $dir
  cp "$(python3 -c 'import inspect; print(inspect.__file__)')" $dir/a_inspect.py && cp .carry/heldout/austen_emma.txt $dir/b_emma.txt
  prompts=(--prompt-dir $dir)
fi
tag=${TAG:+_$TAG}
for b in ${BATCHES:-16 1}; do
  timeout "${T_TUNE:-280}" python3 -m jspec.cli tune --method longspec --prompt-tokens "${L:-8000}" --batch "$b" \
    "${prompts[@]}" --max-new-tokens "${NEW:-128}" --reps 2 --jobs 8 --out "$OUT/tune_longspec${tag}_B${b}_h200.json" 2>&1 \
    | grep -v Warning | tr '\r' '\n' | grep -v "it/s\]$\|shape/s\]$\|s/shape\]$" | tee "$OUT/tune_longspec${tag}_B${b}_h200_log.txt" | tail -14
done
