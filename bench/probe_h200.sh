#!/usr/bin/env bash
# Three probes on the H200 (after staging the model as in ../shared/gpu/README.md, from the repo root, carrying
# .carry/heldout), each writing JSON + log to $OUT:
#   bash bench/probe_h200.sh lookup   # bench/lookup_potential.py at L=7936, B=16: LongSpec's per-row tau beside a
#                                     # simulated prompt-lookup drafter's on ar's greedy output (no timing)
#   bash bench/probe_h200.sh tune64   # `jspec tune --method longspec` at L=8000, B=64 on mixed code/prose rows
#                                     # (bench/tune_longspec_h200.sh; the drafter's tuned.json had no B=64 entry)
#   bash bench/probe_h200.sh vbudget  # vegas in pages of 8 at L=8000, B=64: draft budget 256 / 384 / 512
set -uo pipefail
mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/
for mode in "$@"; do
  case "$mode" in
    lookup)
      timeout "${T_LOOKUP:-240}" python3 bench/lookup_potential.py --out "$OUT/lookup_potential_h200.json" \
        --length 7936 --batch 16 2>&1 | grep -v Warning | tee "$OUT/lookup_potential_h200_log.txt" | tail -22 ;;
    tune64)
      MIXED=1 TAG=mixed BATCHES=64 T_TUNE="${T_TUNE:-280}" bash bench/tune_longspec_h200.sh ;;
    vbudget)
      timeout "${T_SPEC:-240}" python3 bench/spec.py --out "$OUT/spec_budget64_h200.json" --impl pallas \
        --lengths 8000 --batches 64 --methods vegas-page8 --gammas 4 --gamma-methods "" --budgets 256,384,512 \
        --sweep-methods vegas-page8 --sweep-shape 8000x64 --split-shape 8000x64 --no-ablation --budget-s 200 2>&1 \
        | grep -v Warning | tee "$OUT/spec_budget64_h200_log.txt" | tail -20 ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
done
