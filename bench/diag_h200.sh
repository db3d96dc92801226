#!/usr/bin/env bash
# Where vegas' verification loses time against streaming's (issue 4), on a 2-GPU machine, two jobs at once:
#   GPU 0: bench/profile_round.py on the verification pieces and whole loops (L=8000, B=64): per-kernel time,
#          idle gaps between kernels by the kernel that waited, the full timeline; then the same pieces with
#          XLA command buffers off (wall time only) -- is the idle time host-side launch/graph overhead?
#   GPU 1: Hugging Face static cache on every (L, B) of bench/spec.py's grid (bench/spec_hf.py), same prompts.
# Run from the repo root after staging the model (../shared/gpu/README.md), carrying .carry/heldout:
#   bash bench/diag_h200.sh            (VARIANTS="name=XLA_FLAGS-suffix ..." adds wall-only variants)
set -uo pipefail
mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/
cb="--xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false"
pieces="ar_step,vegas_verify,streaming_verify,ar_loop,vegas_loop,streaming_loop"
cp bench/results/spec_h200.json /tmp/hf_shapes.json   # only its (L, B) shapes are read
(CUDA_VISIBLE_DEVICES=1 JAX_PLATFORMS=cpu timeout "${HF_TIMEOUT:-500}" python3 bench/spec_hf.py --spec /tmp/hf_shapes.json \
   --budget-s $(( ${HF_TIMEOUT:-500} - 30 )) 2>&1 | grep -v Warning | tail -12 > "$OUT/hf_log.txt";
 cp /tmp/jspec_spec_hf.json "$OUT/hf_h200.json") &
CUDA_VISIBLE_DEVICES=0 XLA_FLAGS="$cb" timeout "${PROF_TIMEOUT:-260}" python3 bench/profile_round.py \
  --out "$OUT/prof_default.json" --pieces "$pieces" --loops 65 --tag default --timeline "$OUT/timeline.json.gz" 2>&1 \
  | grep -v Warning
for v in ${VARIANTS:-nocb=--xla_gpu_enable_command_buffer=}; do
  CUDA_VISIBLE_DEVICES=0 XLA_FLAGS="$cb ${v#*=}" timeout "${VAR_TIMEOUT:-150}" python3 bench/profile_round.py \
    --out "$OUT/prof_${v%%=*}.json" --pieces vegas_verify,streaming_verify,vegas_loop,streaming_loop --loops 65 \
    --no-trace --tag "${v%%=*}" 2>&1 | grep -v Warning
done
wait
cat "$OUT/hf_log.txt"
