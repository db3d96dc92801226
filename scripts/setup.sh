#!/usr/bin/env bash
# Create .venv with a Python >= 3.12 and install jspec (+ test extras) into it. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {  # Python 3.12 first (the GPU machine's version), then any newer one
  local c v
  if [ -n "${PYTHON:-}" ] && "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
    command -v "$PYTHON"; return 0
  fi
  for v in 3.12 3.13 3.14; do
    for c in "python$v" python3; do
      [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
      if "$c" -c "import sys; sys.exit(0 if '%d.%d' % sys.version_info[:2] == '$v' else 1)" 2>/dev/null; then
        command -v "$c"; return 0
      fi
    done
    if command -v pyenv >/dev/null 2>&1; then  # pyenv installs that are not on PATH
      for c in $(ls -d "$(pyenv root)"/versions/$v.* 2>/dev/null | sort -V -r); do
        [ -x "$c/bin/python3" ] && { echo "$c/bin/python3"; return 0; }
      done
    fi
  done
  return 1
}

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)'; then
  PY=$(find_python) || { echo "error: jspec needs Python >= 3.12; none found on PATH or in pyenv (set PYTHON=/path/to/python3.12)" >&2; exit 1; }
  echo "setup: creating .venv with $PY ($("$PY" --version))"
  rm -rf .venv
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c 'import jspec, jspec.checkpoints, pallas_kernels, pytest, hypothesis, scipy' 2>/dev/null; then
  echo "setup: installing jspec and its dependencies into .venv (jax==0.11.2, first time only)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
fi
