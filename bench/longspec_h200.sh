#!/usr/bin/env bash
# Issue 6 on the H200, one call: the noisy cross-attention ablation drafters (full recipe vs no noisy
# cross-attention, equal steps; their tau is measured afterwards from the returned drafters with
# bench/drafter_tau.py), then the LongSpec grid (bench/longspec.py, shapes dropped by priority to fit
# LS_BUDGET). Run from the repo root after staging the model, carrying .carry/train and .carry/heldout:
#   bash bench/longspec_h200.sh
set -uo pipefail
# the compiler setting bench/spec_h200.sh picked on this machine, if it ran
[ -f /root/jspec-xla-flags ] && export XLA_FLAGS="$(cat /root/jspec-xla-flags)" && echo "XLA_FLAGS=$XLA_FLAGS"
mkdir -p /root/jspec-cache/heldout && cp .carry/heldout/*.txt /root/jspec-cache/heldout/
ARMS=full,no_noisy_xattn STEPS="${ABL_STEPS:-300}" timeout "${ABL_TIMEOUT:-240}" bash bench/drafter_h200.sh ablation \
  2>&1 | grep -v Warning | tail -20
# If the timeout cut drafter_h200.sh after training but before it packed the drafters (it happened once), pack
# what is there: $OUT returns at most 8 files, two folders deep.
if [ -d "$OUT/ablation" ]; then
  rm -rf "$OUT"/ablation/_tokens "$OUT"/ablation/*/ckpt
  tar -C "$OUT" -cf "$OUT/ablation.tar" ablation && rm -rf "$OUT/ablation"
fi
timeout "${LS_TIMEOUT:-330}" python3 bench/longspec.py --out "$OUT/longspec_h200.json" --budget-s "${LS_BUDGET:-280}" \
  ${LS_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/longspec_log.txt" | tail -60
