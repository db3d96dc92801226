#!/usr/bin/env bash
# XLA compiler settings or code variants against whole decode loops on the H200 (bench/round_table.py, one
# process per variant and shape), after staging the model as in bench/vegas_h200.sh (carry .carry/heldout for
# the prose rows). Writes $OUT/rounds_<variant>_<shape>_h200.json. Variants are name=extra-flags pairs on top of
# the benchmarks' base flags, optionally name=extra-flags:overlay, where overlay is a carried folder of files
# laid over a copy of the repo for that variant (e.g. .carry/old/jspec/model.py: the previous version of one
# file). Only the first variant is traced (kernels per round), the others are timed. DUMP=1 also dumps the
# first variant's optimized HLO and writes $OUT/fusions_<variant>_<shape>_<method>.json: what each of the
# method's top fusion kernels computes (bench/hlo_fusions.py). NEW: new tokens per row (128); WIDTHS: LongSpec's
# tree (2,2,2,2,2).
#   VARIANTS="base= nopdl=--xla_gpu_enable_pdl=false" RUNS="8000x64:ar,vegas 8000x16:ar,longspec" bash bench/pdl_h200.sh
#   VARIANTS="new= old=:.carry/old" RUNS="8000x64:ar,vegas-page16" DUMP=1 bash bench/pdl_h200.sh
set -uo pipefail
mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/ 2>/dev/null
BASE="--xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false"
root=$PWD
first=1
for v in ${VARIANTS:-base= nopdl=--xla_gpu_enable_pdl=false,--xla_gpu_enable_pdl_launch=false}; do
  tag="${v%%=*}"; rest="${v#*=}"; extra="${rest%%:*}"; extra="${extra//,/ }"; overlay=""
  [ "$rest" != "${rest#*:}" ] && overlay="${rest#*:}"
  dir=$root
  if [ -n "$overlay" ]; then   # a copy of the code with the overlay's files on top
    dir=/tmp/variant_$tag && rm -rf "$dir" && mkdir -p "$dir"
    cp -r "$root"/jspec "$root"/pallas_kernels "$root"/bench "$root"/checkpoints "$dir"/
    cp -r "$root/$overlay"/. "$dir"/ || { echo "error: overlay $overlay missing"; exit 1; }
  fi
  for run in ${RUNS:-8000x64:ar,vegas 8000x16:ar,longspec}; do
    shape="${run%%:*}"; methods="${run#*:}"
    trace=""; [ "$first" = 1 ] || trace="--no-trace"
    dump=""; [ "$first" = 1 ] && [ "${DUMP:-0}" = 1 ] && dump="--xla_dump_to=/tmp/dump_${shape} --xla_dump_hlo_as_text"
    out="$OUT/rounds_${tag}_${shape}_h200.json"
    (cd "$dir" && XLA_FLAGS="$BASE $extra $dump" timeout "${T_RUN:-280}" python3 bench/round_table.py --tag "$tag" \
      --shape "$shape" --methods "$methods" --new "${NEW:-128}" --widths "${WIDTHS:-2,2,2,2,2}" $trace --out "$out" 2>&1 \
      | grep -v Warning | cut -c1-400 | tail -4)
    if [ -n "$dump" ]; then
      for m in ${methods//,/ }; do
        python3 bench/hlo_fusions.py "/tmp/dump_${shape}" --rounds "$out" --method "$m" \
          --out "$OUT/fusions_${tag}_${shape}_${m}.json" | head -30
      done
    fi
  done
  first=0
done
