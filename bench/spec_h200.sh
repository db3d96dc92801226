#!/usr/bin/env bash
# Issue 4 benchmark on the H200: bench/spec.py (ar / streaming / quest / vegas + sweeps + ablations + time
# split) then Hugging Face's static cache on the same prompts (bench/spec_hf.py). Run from the repo root after
# staging the model (../shared/gpu/README.md), carrying .carry/heldout (prose held out from drafter training):
#   BUDGET_S=330 bash bench/spec_h200.sh
set -euo pipefail
mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/
set -o pipefail
timeout "${SPEC_TIMEOUT:-420}" python3 bench/spec.py --out "$OUT/spec_h200.json" --impl pallas \
  --budget-s "${BUDGET_S:-330}" ${SPEC_ARGS:-} 2>&1 | tee "$OUT/spec_log.txt"
JAX_PLATFORMS=cpu timeout "${HF_TIMEOUT:-170}" python3 bench/spec_hf.py --spec "$OUT/spec_h200.json" \
  --shapes "${HF_SHAPES:-8000x64,8000x16,8000x1,4096x16,2048x16}" 2>&1 | grep -v Warning | tail -15
