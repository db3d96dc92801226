#!/usr/bin/env bash
# Where a round's GPU time goes (bench/profile_round.py: per piece wall time + per kernel device time), and
# what XLA's WHILE/CONDITIONAL command buffers (CUDA graphs with conditional nodes) do to whole generation
# loops. Run from the repo root on the GPU machine after staging the model (../shared/gpu/README.md),
# carrying .carry/heldout:   bash bench/profile_h200.sh
set -uo pipefail
mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/
timeout "${T1:-240}" python3 bench/profile_round.py --out "$OUT/profile_round_h200.json" --tag default \
  --loops 65 --shape "${SHAPE:-8000x64}" 2>&1 | grep -v Warning | tail -80
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL" timeout "${T2:-200}" \
  python3 bench/profile_round.py --out "$OUT/profile_round_h200_cmdbuf.json" --tag while_cmdbuf --no-trace \
  --loops 65 --shape "${SHAPE:-8000x64}" 2>&1 | grep -v Warning | tail -12
