#!/usr/bin/env bash
# Issues 4 and 6 in one call on a 2-GPU machine: bench/spec.py (ar / streaming / quest / vegas grid, sweeps,
# ablations, time split) on GPU 0 while bench/longspec.py (chain / tree grid, T=0/1, tree-size sweep) runs on
# GPU 1; then both JSONs get the Hugging Face static-cache figures measured earlier in the same session on the
# same prompts (bench/diag_h200.sh -> bench/results/hf_static_h200.json; HF=path overrides). cuBLAS GEMMs with
# autotuning off, the setting bench/flags_ab.py picked (bench/results/flags_ab_h200.json).
# Run from the repo root after staging the model (../shared/gpu/README.md), carrying .carry/heldout:
#   bash bench/pair_h200.sh        (SPEC_BUDGET / LS_BUDGET: each script's time target in s)
set -uo pipefail
mkdir -p /root/jspec-cache/corpus /root/jspec-cache/heldout
cp .carry/heldout/*.txt /root/jspec-cache/corpus/ && cp .carry/heldout/*.txt /root/jspec-cache/heldout/
export XLA_FLAGS="${XLA_FLAGS:---xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false}"
hf="${HF:-bench/results/hf_static_h200.json}"
(CUDA_VISIBLE_DEVICES=1 timeout "${LS_TIMEOUT:-550}" python3 bench/longspec.py --out "$OUT/longspec_h200.json" \
   --budget-s "${LS_BUDGET:-480}" 2>&1 | grep -v Warning > "$OUT/longspec_log.txt") &
CUDA_VISIBLE_DEVICES=0 timeout "${SPEC_TIMEOUT:-550}" python3 bench/spec.py --out "$OUT/spec_h200.json" --impl pallas \
  --budget-s "${SPEC_BUDGET:-470}" 2>&1 | grep -v Warning | tee "$OUT/spec_log.txt" | tail -25
wait
for f in spec_h200 longspec_h200; do
  [ -f "$OUT/$f.json" ] && JAX_PLATFORMS=cpu python3 bench/spec_hf.py --spec "$OUT/$f.json" --hf-json "$hf"
done
tail -25 "$OUT/longspec_log.txt"
