#!/usr/bin/env bash
# The main job: fetch + convert the real SmolLM2-135M-Instruct (first run only), then a real speculative
# generation (Vegas: the model drafts for itself over KV entries chosen by its last verification) from a
# long real document (~3000 tokens of the Python standard library's own source), printing text and tokens/s.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/jspec generate --model smollm2-135m --method vegas --gamma 4 --budget 512 --prompt-tokens 3000 \
  --max-new-tokens 128 "$@"
