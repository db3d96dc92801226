#!/usr/bin/env bash
# Gamma 5/6 after the 17-32-row flash_scores defaults (commit 73da462), on the H200, from the repo root:
#   bash bench/gamma_h200.sh probe   # model-free: verification flash_scores per layer at T=5,6,7 (B=64) and T=6
#                                    # (B=16, block grid), draft-step sparse_attention in the 30-layer cache
#   bash bench/gamma_h200.sh spec    # after staging the model (../shared/gpu/README.md), carrying .carry/heldout:
#                                    # vegas-page8 and streaming at gammas 4,5,6, L=8000, B=64, budget 512
#   bash bench/gamma_h200.sh tune    # after staging: `jspec tune --method vegas` at L=8000, B=64 with gammas 3-6 on
#                                    # held-out inspect.py + Emma rows (the README's tune run, refreshed)
#   bash bench/gamma_h200.sh write   # after staging, carrying .carry/old (the pre-change files): the draft step's
#                                    # K/V appended by sparse_attention itself against a scatter per layer; ran at
#                                    # commit 71d7311 (`git checkout 71d7311`), reverted after it measured slower
set -uo pipefail
mode=${1:?probe, spec, tune or write}
case "$mode" in
  probe)
    timeout 200 python3 bench/verify_rows.py --B 64 --Ts 5,6,7 --settings layers30 \
      --out "$OUT/verify_rows_new_B64_h200.json" 2>&1 | grep -v Warning | tail -12
    timeout 200 python3 bench/verify_rows.py --B 16 --Ts 6 --settings layers30 --grid \
      --out "$OUT/verify_rows_new_B16_h200.json" 2>&1 | grep -v Warning | tail -8
    timeout 150 python3 bench/verify_rows.py --kernel sparse --B 64 --Ts 1 --settings isolated,layers30 --profile \
      --out "$OUT/verify_rows_sparse_h200.json" 2>&1 | grep -v Warning | tail -12 ;;
  spec)
    mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/
    timeout "${T1:-570}" python3 bench/spec.py --out "$OUT/spec_gamma5_h200.json" --impl pallas --lengths 8000 \
      --batches 64 --methods streaming,vegas-page8 --gamma 4 --gammas "${GAMMAS:-4,5,6}" \
      --gamma-methods streaming,vegas-page8 --budgets 512 --sweep-methods "" --no-ablation --sweep-shape 8000x64 \
      --split-shape 8000x64 --budget-s "${BUDGET_S:-480}" 2>&1 | grep -v Warning \
      | tee "$OUT/spec_gamma5_h200_log.txt" | tail -40 ;;
  tune)
    dir=/root/tune-prompts && mkdir -p $dir
    cp "$(python3 -c 'import inspect; print(inspect.__file__)')" $dir/a_inspect.py && cp .carry/heldout/austen_emma.txt $dir/b_emma.txt
    timeout "${T2:-560}" python3 -m jspec.cli tune --method vegas --prompt-dir $dir --prompt-tokens 8000 --batch 64 \
      --max-new-tokens 128 --ratios 0.02,0.05,0.1 --gammas "${GAMMAS:-3,4,5,6}" --pages 1,8,16 \
      --out "$OUT/tune_vegas_8000x64_h200.json" 2>&1 | grep -v Warning | tr '\r' '\n' \
      | grep -v "it/s\]$\|shape/s\]$\|s/shape\]$" | tee "$OUT/tune_vegas_8000x64_h200_log.txt" | tail -20 ;;
  write)   # A/B: sparse_attention appending the draft step's K/V itself (kwrite) against the scatter per layer
           # (scatter: the previous files, carried as .carry/old), then the issue-4 shape with the new code
    VARIANTS="kwrite= scatter=:.carry/old" RUNS="8000x64:vegas-page8,streaming" NEW=256 T_RUN=200 \
      bash bench/pdl_h200.sh
    timeout 300 python3 bench/spec.py --out "$OUT/spec_kwrite_h200.json" --impl pallas --lengths 8000 --batches 64 \
      --methods streaming,vegas-page8 --gammas 4 --gamma-methods "" --budgets 512 --sweep-methods "" --no-ablation \
      --sweep-shape 8000x64 --split-shape 8000x64 --budget-s 280 2>&1 | grep -v Warning \
      | tee "$OUT/spec_kwrite_h200_log.txt" | grep -A6 "method          L" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
