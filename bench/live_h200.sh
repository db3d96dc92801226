#!/usr/bin/env bash
# Finished rows that stop reading their caches (`model.forward(live=)`, engine.round_ passes ~done) on the H200,
# after staging the model (../shared/gpu/README.md), from the repo root, carrying .carry/heldout and .carry/old
# (the files before the change: jspec/model.py, jspec/speculative/{engine,longspec}.py):
#   bash bench/live_h200.sh ab     # whole loops, 256 new tokens, static batches: LongSpec (2,4,4,4) at L=8000,
#                                  # B=16 and vegas-page8 at L=8000, B=64, with (live) and without (ride) the change
#   bash bench/live_h200.sh grid   # the issue shapes with the change: bench/longspec.py at L=8000, B=16 (tree and
#                                  # chain, ar and vegas in the same run) and bench/spec.py at L=8000, B=64
#   bash bench/live_h200.sh more   # LongSpec tree sizes at L=8000, B=16 (tau and tokens/s vs nodes), then LongSpec
#                                  # served (refills of 4, staged and not) on 128 prompts of 8000 tokens, B=16
#   bash bench/live_h200.sh spec   # the issue-4 grid refreshed: bench/spec.py (L 2048/4096/8000, B 1/16/64, sweeps)
#                                  # with vegas in pages of 8 beside streaming, quest and vegas
#   bash bench/live_h200.sh lgrid  # the issue-6 grid refreshed: bench/longspec.py at L=8000 (+ tree sizes), then
#                                  # L=4096,2048; B 16/1/64, T 0/1, tuned trees (merge: bench/merge_longspec.py)
set -uo pipefail
mode=${1:?ab, grid, more, spec or lgrid}
case "$mode" in
  ab)
    VARIANTS="live= ride=:.carry/old" RUNS="8000x16:ar,longspec" NEW=256 WIDTHS=2,4,4,4 T_RUN=200 \
      bash bench/pdl_h200.sh
    VARIANTS="live= ride=:.carry/old" RUNS="8000x64:ar,vegas-page8" NEW=256 T_RUN=200 bash bench/pdl_h200.sh ;;
  grid)
    mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/
    timeout "${T1:-300}" python3 bench/longspec.py --lengths 8000 --batches 16 --temps 0 --modes tree,chain \
      --widths tuned --sweep-widths "" --out "$OUT/longspec_live_8000x16_h200.json" 2>&1 | grep -v Warning \
      | tee "$OUT/longspec_live_8000x16_h200_log.txt" | tail -12
    timeout "${T2:-280}" python3 bench/spec.py --out "$OUT/spec_live_h200.json" --impl pallas --lengths 8000 \
      --batches 64 --methods streaming,vegas-page8 --gammas 4 --gamma-methods "" --budgets 512 --sweep-methods "" \
      --no-ablation --sweep-shape 8000x64 --split-shape 8000x64 --budget-s 260 2>&1 | grep -v Warning \
      | tee "$OUT/spec_live_h200_log.txt" | grep -A6 "method          L" ;;
  more)
    timeout "${T1:-300}" python3 bench/longspec.py --lengths 8000 --batches 16 --temps 0 --modes tree \
      --widths tuned --out "$OUT/longspec_live_trees_8000x16_h200.json" 2>&1 | grep -v Warning \
      | tee "$OUT/longspec_live_trees_8000x16_h200_log.txt" | grep -A12 "label             L"
    SHAPES=8000x16 METHODS=ar,longspec WIDTHS=2,4,4,4 STAGED=1,0 REFILL=4 QUEUE=8 TAG=_live T_SERVE=280 \
      bash bench/serve_h200.sh ;;
  spec)
    mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/
    timeout "${T1:-560}" python3 bench/spec.py --out "$OUT/spec_h200.json" --impl pallas --budget-s 400 \
      --methods streaming,quest,vegas,vegas-page8 2>&1 | grep -v Warning | tee "$OUT/spec_h200_log.txt" | tail -40 ;;
  lgrid)
    timeout "${T1:-280}" python3 bench/longspec.py --lengths 8000 --batches 16,1,64 --temps 0,1 --widths tuned \
      --out "$OUT/longspec_nd_h200_grid8000.json" 2>&1 | grep -v Warning \
      | tee "$OUT/longspec_nd_h200_grid8000_log.txt" | grep -A30 "label             L"
    timeout "${T2:-290}" python3 bench/longspec.py --lengths 4096,2048 --batches 16,1,64 --temps 0,1 --widths tuned \
      --out "$OUT/longspec_nd_h200_grid4096_2048.json" 2>&1 | grep -v Warning \
      | tee "$OUT/longspec_nd_h200_grid4096_2048_log.txt" | grep -A40 "label             L" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
