#!/usr/bin/env bash
# The main job: fetch + convert the real SmolLM2-135M-Instruct (first run only), then generate from a
# long real document (~3000 tokens of the Python standard library's own source), printing text and tokens/s.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/jspec generate --model smollm2-135m --prompt-tokens 3000 --max-new-tokens 128 "$@"
