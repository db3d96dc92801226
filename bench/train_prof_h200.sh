#!/usr/bin/env bash
# Drafter training step on the H200: wall time per step and device time by kernel (bench/profile_train.py), one
# process per variant, after staging the model as in bench/vegas_h200.sh. Variants are tag:attn pairs (attn: the
# target forward's attention backend, xla or pallas). Writes $OUT/prof_train_<tag>_h200.json.
#   VARIANTS="xla:xla pallas:pallas" bash bench/train_prof_h200.sh
set -uo pipefail
BASE="--xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false"
for v in ${VARIANTS:-xla:xla pallas:pallas}; do
  tag="${v%%:*}"; attn="${v#*:}"
  XLA_FLAGS="$BASE" timeout "${T_RUN:-200}" python3 bench/profile_train.py --tag "$tag" --attn "$attn" \
    --batch "${BATCH:-16}" --seq-len "${SEQ:-2048}" --out "$OUT/prof_train_${tag}_h200.json" 2>&1 \
    | grep -v Warning | cut -c1-600 | tail -18
done
