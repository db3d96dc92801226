#!/usr/bin/env bash
# The test suite (CPU; Pallas kernels in interpret mode). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
