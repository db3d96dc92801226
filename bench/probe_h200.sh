#!/usr/bin/env bash
# Three probes on the H200 (after staging the model as in ../shared/gpu/README.md, from the repo root, carrying
# .carry/heldout), each writing JSON + log to $OUT:
#   bash bench/probe_h200.sh lookup   # bench/lookup_potential.py at L=7936, B=16: LongSpec's per-row tau beside a
#                                     # simulated prompt-lookup drafter's on ar's greedy output (no timing)
#   bash bench/probe_h200.sh tune64   # `jspec tune --method longspec` at L=8000, B=64 on mixed code/prose rows
#                                     # (bench/tune_longspec_h200.sh; the drafter's tuned.json had no B=64 entry)
#   bash bench/probe_h200.sh vbudget  # vegas in pages of 8 at L=8000, B=64: draft budget 256 / 384 / 512
#   bash bench/probe_h200.sh leafab lookup8000 lserve   # (carry .carry/old for leafab; see each mode below)
#   bash bench/probe_h200.sh lgrid8; bash bench/probe_h200.sh lgrid42   # the issue-6 grid with lookup chains
#   bash bench/probe_h200.sh vlookup  # vegas / streaming + prompt-lookup tokens after the drafts, L=8000, B=64
#   bash bench/probe_h200.sh vexact vgrid   # the same with the row-independent dense kernels (bf16 output vs ar);
#                                           # vegas-page8 +lookup 4/8 at L=8000 B=16/1 and L=4096/2048 B=64
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
    leafab)   # the draft tree's leaf K/V fix (commit 378e849) against the code before it (.carry/old: longspec.py,
              # drafter/model.py and engine.py of commit 76d4bfe), whole loops, LongSpec (2,4,4,4), L=8000, B=16
      VARIANTS="leaf= zero=:.carry/old" RUNS="8000x16:ar,longspec" NEW=256 WIDTHS=2,4,4,4 T_RUN=200 \
        bash bench/pdl_h200.sh ;;
    lookup8000)   # LongSpec with prompt-lookup chains of 4 and 8 beside the tuned tree / chain, L=8000, greedy
      timeout "${T_LOOKUP:-330}" python3 bench/longspec.py --lengths 8000 --batches 16,64,1 --temps 0 \
        --modes tree,chain --widths tuned --lookups 4,8 --sweep-widths "" --budget-s 300 \
        --out "$OUT/longspec_lookup_h200.json" 2>&1 | grep -v Warning | tee "$OUT/longspec_lookup_h200_log.txt" \
        | grep -A30 "label             L" ;;
    lserve)   # LongSpec (2,4,4,4) + a lookup chain of ${LOOKUP:-8} served (refills of 4, staged and not), 128 prompts
      SHAPES=8000x16 METHODS=ar,longspec WIDTHS=2,4,4,4 LOOKUP="${LOOKUP:-8}" STAGED=1,0 REFILL=4 QUEUE=8 \
        TAG=_lookup T_SERVE=280 bash bench/serve_h200.sh ;;
    lgrid8|lgrid42)   # the issue-6 grid (bench/longspec.py, tuned trees, T 0/1, B 16/1/64) with a lookup chain of 8
      [ "$mode" = lgrid8 ] && lens=8000 || lens=4096,2048
      timeout "${T_GRID:-290}" python3 bench/longspec.py --lengths $lens --batches 16,1,64 --temps 0,1 --widths tuned \
        --lookups 8 --sweep-widths "" --budget-s 280 --out "$OUT/longspec_${mode}_h200.json" 2>&1 | grep -v Warning \
        | tee "$OUT/longspec_${mode}_h200_log.txt" | grep -A40 "label             L" ;;
    vlookup)   # the issue-4 shape with lookup chains of ${VLOOKUPS:-4 8 16} after vegas' / streaming's gamma=4 drafts
      ms=vegas,vegas-page8,streaming
      for n in ${VLOOKUPS:-4 8 16}; do ms="$ms,vegas-page8+lookup$n"; done
      ms="$ms,vegas+lookup8,streaming+lookup8"
      timeout "${T_SPEC:-300}" python3 bench/spec.py --out "$OUT/spec_lookup64_h200.json" --impl pallas \
        --lengths 8000 --batches 64 --methods "$ms" --gammas 4 --gamma-methods "" --sweep-methods "" \
        --sweep-shape 8000x64 --split-shape 8000x64 --no-ablation --budget-s 280 2>&1 \
        | grep -v Warning | tee "$OUT/spec_lookup64_h200_log.txt" | tail -24 ;;
    vexact)   # AttnImpl(dense_rows=576): every step's dense part on the Pallas kernels whose rounding of a row does
              # not depend on the step's row count, so bf16 greedy output can equal ar's token for token
      timeout "${T_SPEC:-240}" python3 bench/spec.py --out "$OUT/spec_lookup64_exact_h200.json" --impl pallas \
        --dense-rows 576 --lengths 8000 --batches 64 --methods vegas-page8,vegas-page8+lookup4 --gammas 4 \
        --gamma-methods "" --sweep-methods "" --sweep-shape 8000x64 --split-shape 8000x64 --no-ablation \
        --budget-s 220 2>&1 | grep -v Warning | tee "$OUT/spec_lookup64_exact_h200_log.txt" | tail -8 ;;
    vgrid)
      timeout "${T_SPEC:-330}" python3 bench/spec.py --out "$OUT/spec_lookup_grid_h200.json" --impl pallas \
        --lengths 8000,4096,2048 --batches 64,16,1 --methods vegas-page8,vegas-page8+lookup4,vegas-page8+lookup8 \
        --gammas 4 --gamma-methods "" --sweep-methods "" --sweep-shape 8000x64 --split-shape 8000x64 --no-ablation \
        --budget-s 310 2>&1 | grep -v Warning | tee "$OUT/spec_lookup_grid_h200_log.txt" | tail -8 ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
done
