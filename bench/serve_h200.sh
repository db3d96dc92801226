#!/usr/bin/env bash
# Continuous batching vs static batches on the H200 (bench/serve.py), after staging the model as in
# bench/vegas_h200.sh (carry .carry/heldout for the prose rows). Writes $OUT/serve_<shape>_h200.json.
#   SHAPES="8000x16 8000x64" QUEUE=4 REFILL=1,4 STAGED=1,0 bash bench/serve_h200.sh
#   TAG=_exact DENSE_ROWS=320 bash bench/serve_h200.sh      (the row-independent dense kernels: --exact)
#   METHODS=ar,longspec WIDTHS=2,4,4,4 STAGED=1 bash bench/serve_h200.sh   (LongSpec tree widths)
#   METHODS=ar,longspec WIDTHS=2,4,4,4 LOOKUP=8 bash bench/serve_h200.sh    (+ a prompt-lookup chain of 8)
set -uo pipefail
mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/ 2>/dev/null
export XLA_FLAGS="${XLA_FLAGS:---xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false}"
for shape in ${SHAPES:-8000x16}; do
  timeout "${T_SERVE:-500}" python3 bench/serve.py --out "$OUT/serve_${shape}${TAG:-}_h200.json" --shape "$shape" \
    --queue "${QUEUE:-4}" --new "${NEW:-256}" --methods "${METHODS:-ar,vegas,longspec}" --widths "${WIDTHS:-2,2,2,2,2}" \
    --lookup "${LOOKUP:-0}" --refill "${REFILL:-1}" --staged "${STAGED:-0}" --dense-rows "${DENSE_ROWS:-0}" 2>&1 | grep -v Warning | tail -12
done
