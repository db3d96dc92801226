#!/usr/bin/env bash
# Where a small-batch round waits (issue 6: LongSpec at L=8000, B=16, where a round's wall time exceeded its
# device time by ~1.4 ms in longspec_trees_h200_B16.json): the best B=16 trees profiled (device time, idle
# time between kernels and which kernel waited), with XLA's default command buffers and with WHILE +
# CONDITIONAL command buffers (the whole loop as one CUDA graph), plus whole-loop timings of ar / streaming /
# vegas at B=16 under both. Run from the repo root after staging the model, carrying .carry/heldout:
#   bash bench/launch_h200.sh
set -uo pipefail
mkdir -p /root/jspec-cache/corpus /root/jspec-cache/heldout
cp .carry/heldout/*.txt /root/jspec-cache/corpus/ && cp .carry/heldout/*.txt /root/jspec-cache/heldout/
base="${XLA_FLAGS:-}"
if [ -n "${ROWS:-}" ]; then
  timeout "${LS_T:-300}" python3 bench/longspec.py --out "$OUT/longspec_rows_h200_B16.json" --lengths 8000 \
    --batches 16 --temps 0 --modes tree,chain --widths 2,2,2,2,2 --sweep-widths "2,2,2,2,2;4,16,16,16,16" \
    --budget-s 200 2>&1 | grep '^{' | cut -c1-400
  python3 - "$OUT/longspec_rows_h200_B16.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["records"]:
    if r.get("tau_rows"):
        print(r["label"], r["widths"], "tau", r["tau"], "straggler", r["straggler"], "rows", r["tau_rows"])
PY
  exit 0
fi
for tag in default while_cmdbuf; do
  f="$base"; [ "$tag" = while_cmdbuf ] && f="$base --xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
  echo "== $tag: XLA_FLAGS=$f"
  XLA_FLAGS="$f" timeout "${LS_T:-200}" python3 bench/longspec.py --out "$OUT/launch_longspec_$tag.json" \
    --lengths 8000 --batches 16 --temps 0 --modes tree --widths 2,2,2,2,2 --sweep-widths "2,2,2,2,2;2,4,4,4" \
    --profile "2,2,2,2,2;2,4,4,4" --budget-s 150 2>&1 | grep '^{' | cut -c1-900
  XLA_FLAGS="$f" timeout "${PR_T:-120}" python3 bench/profile_round.py --out "$OUT/launch_loops_$tag.json" \
    --tag "$tag" --no-trace --loops 65 --shape 8000x16 --pieces ar_loop,vegas_loop,streaming_loop 2>&1 | grep '^{'
done
# ROWS=1: only the per-row view of the B=16 trees (which rows set a static batch's rounds), default flags.
