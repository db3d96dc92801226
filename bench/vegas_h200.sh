#!/usr/bin/env bash
# Issue 4 follow-ups on the H200 (run from the repo root after staging the model, ../shared/gpu/README.md,
# carrying .carry/heldout):
#   bash bench/vegas_h200.sh profile   # where a B=64, L=8000 draft step's time goes (per-kernel device time)
#   bash bench/vegas_h200.sh gamma     # vegas and streaming at gamma 4/6/8 and budgets 128-512, L=8000 B=64
#   bash bench/vegas_h200.sh grid      # the full bench/spec.py grid (no Hugging Face run: hf_static_h200.json)
#   bash bench/vegas_h200.sh fuse      # A/B of jspec.load's fused q/k/v + gate/up weights, L=8000, B=64 and 16
#   bash bench/vegas_h200.sh flash     # flash_scores launch-parameter sweep at B=64, L=8000 (T=1 and T=5 + scores)
#   bash bench/vegas_h200.sh epilogue  # score_weights (the softmax-weights epilogue) launch sweep at B=64, L=8000
set -uo pipefail
mode=${1:?profile, gamma, grid, fuse, flash or epilogue}
mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/
case "$mode" in
  profile)
    timeout "${T1:-300}" python3 bench/profile_round.py --out "$OUT/prof_draft_h200.json" --shape 8000x64 \
      --pieces "${PIECES:-ar_step,streaming_draft,vegas_draft,vegas_verify}" --reps 5 --top 40 ${PROF_ARGS:-} 2>&1 \
      | grep -v Warning | tee "$OUT/prof_draft_h200_log.txt" | tail -150 ;;
  gamma)
    timeout "${T2:-560}" python3 bench/spec.py --out "$OUT/spec_gamma_h200.json" --impl pallas --lengths 8000 \
      --batches 64 --methods streaming,vegas --gamma "${GAMMA:-6}" --gammas "${GAMMAS:-4,6,8}" \
      --gamma-methods vegas,streaming --budgets "${BUDGETS:-128,256,512}" --sweep-shape 8000x64 \
      --split-shape 8000x64 --budget-s "${BUDGET_S:-420}" 2>&1 | grep -v Warning | tee "$OUT/spec_gamma_h200_log.txt" \
      | tail -60 ;;
  grid)
    timeout "${T3:-560}" python3 bench/spec.py --out "$OUT/spec_h200.json" --impl pallas --budget-s "${BUDGET_S:-400}" \
      ${SPEC_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/spec_h200_log.txt" | tail -70 ;;
  fuse)
    for arm in fused separate; do
      extra=""; [ "$arm" = separate ] && extra="--no-fuse"
      timeout "${T4:-270}" python3 bench/spec.py --out "$OUT/spec_fuse_${arm}_h200.json" --impl pallas --lengths 8000 \
        --batches 64,16 --methods streaming,vegas --gammas 4 --budgets 512 --sweep-shape 8000x16 \
        --split-shape 8000x64 --budget-s 240 $extra 2>&1 | grep -v Warning | tee "$OUT/spec_fuse_${arm}_log.txt" \
        | grep -A12 "method          L"
    done ;;
  flash)
    timeout "${T5:-200}" python3 bench/flash_sweep.py --out "$OUT/flash_sweep_h200.json" --budget-s "${BUDGET_S:-170}" \
      2>&1 | grep -v Warning | tee "$OUT/flash_sweep_h200_log.txt" | tail -8 ;;
  epilogue)
    timeout "${T6:-300}" python3 bench/epilogue_sweep.py --out "$OUT/epilogue_sweep_h200.json" 2>&1 | grep -v Warning \
      | tee "$OUT/epilogue_sweep_h200_log.txt" | tail -20 ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
