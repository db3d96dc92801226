#!/usr/bin/env bash
# XLA compiler settings against whole decode loops on the H200 (bench/round_table.py, one process per setting
# and shape), after staging the model as in bench/vegas_h200.sh (carry .carry/heldout for the prose rows).
# Writes $OUT/rounds_<variant>_<shape>_h200.json. Variants are name=extra-flags pairs on top of the benchmarks'
# base flags; only the first variant is traced (kernels per round), the others are timed.
#   VARIANTS="base= nopdl=--xla_gpu_enable_pdl=false" RUNS="8000x64:ar,vegas 8000x16:ar,longspec" bash bench/pdl_h200.sh
set -uo pipefail
mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/ 2>/dev/null
BASE="--xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false"
first=1
for v in ${VARIANTS:-base= nopdl=--xla_gpu_enable_pdl=false,--xla_gpu_enable_pdl_launch=false}; do
  tag="${v%%=*}"; extra="${v#*=}"; extra="${extra//,/ }"
  for run in ${RUNS:-8000x64:ar,vegas 8000x16:ar,longspec}; do
    shape="${run%%:*}"; methods="${run#*:}"
    trace=""; [ "$first" = 1 ] || trace="--no-trace"
    XLA_FLAGS="$BASE $extra" timeout "${T_RUN:-280}" python3 bench/round_table.py --tag "$tag" --shape "$shape" \
      --methods "$methods" --new "${NEW:-128}" $trace --out "$OUT/rounds_${tag}_${shape}_h200.json" 2>&1 \
      | grep -v Warning | cut -c1-400 | tail -4
  done
  first=0
done
