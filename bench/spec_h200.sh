#!/usr/bin/env bash
# Issue 4 benchmark on the H200: (1) a whole-loop A/B of two compiler settings (bench/flags_ab.py: XLA's Triton
# GEMM fusions vs cuBLAS, both with GEMM autotuning off, which keeps compiles ~25 s per program) -- the faster
# setting is used for the rest; (2) bench/spec.py (ar / streaming / quest / vegas + sweeps + ablations + time
# split); (3) Hugging Face's static cache on the same prompts (bench/spec_hf.py). Run from the repo root after
# staging the model (../shared/gpu/README.md), carrying .carry/heldout (prose held out from drafter training):
#   BUDGET_S=300 bash bench/spec_h200.sh        (SKIP_AB=1: keep the XLA_FLAGS given)
set -uo pipefail
mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/
base="--xla_gpu_autotune_level=0"
if [ -z "${SKIP_AB:-}" ]; then
  for tag in triton_gemm cublas_gemm; do
    f="$base"; [ "$tag" = cublas_gemm ] && f="$base --xla_gpu_enable_triton_gemm=false"
    XLA_FLAGS="$f" timeout "${AB_TIMEOUT:-110}" python3 bench/flags_ab.py --out "$OUT/flags_$tag.json" --tag "$tag" \
      2>&1 | grep '^{'
  done
  XLA_FLAGS=$(python3 - "$OUT" "$base" <<'PY'
import json, os, sys
out, base = sys.argv[1], sys.argv[2]
got = {}
for tag in ("triton_gemm", "cublas_gemm"):
    p = os.path.join(out, f"flags_{tag}.json")
    if os.path.exists(p):
        r = json.load(open(p))["records"][0]
        got[r["xla_flags"]] = r["total_s"]
print(min(got, key=got.get) if got else base)
PY
)
  export XLA_FLAGS
fi
echo "XLA_FLAGS for the benchmark: $XLA_FLAGS"
echo "$XLA_FLAGS" > /root/jspec-xla-flags   # bench/longspec_h200.sh, later on the same machine, uses them too
timeout "${SPEC_TIMEOUT:-380}" python3 bench/spec.py --out "$OUT/spec_h200.json" --impl pallas \
  --budget-s "${BUDGET_S:-300}" ${SPEC_ARGS:-} 2>&1 | tee "$OUT/spec_log.txt"
hf_t="${HF_TIMEOUT:-150}"   # the HF process gets 30 s less, so the finished shapes are merged before the kill
JAX_PLATFORMS=cpu timeout "$hf_t" python3 bench/spec_hf.py --spec "$OUT/spec_h200.json" --budget-s $((hf_t - 30)) \
  --shapes "${HF_SHAPES:-8000x64,8000x16,8000x1}" 2>&1 | grep -v Warning | tail -15
