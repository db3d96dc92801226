#!/usr/bin/env bash
# A/B of the fused dense layers (pallas_kernels/dense.py) on whole generation loops at L=8000 (ar and vegas,
# bench/flags_ab.py), one process per AttnImpl.dense_rows setting, then the greedy ar tokens of each setting
# compared with the XLA-GEMM run's. Staged model as in bench/vegas_h200.sh; writes $OUT/dense_<rows>_<shape>.json.
#   ROWS="0 64 320" SHAPES="8000x64 8000x16" bash bench/dense_h200.sh
#   ROWS=0 VARIANTS='m16={"qkv_rope":[16,64,256,4],...}' bash bench/dense_h200.sh   (launch configs, whole loops)
set -uo pipefail
mkdir -p /root/jspec-cache/corpus && cp .carry/heldout/*.txt /root/jspec-cache/corpus/ 2>/dev/null
export XLA_FLAGS="${XLA_FLAGS:---xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false}"
for shape in ${SHAPES:-8000x64}; do
  for rows in ${ROWS:-0 64 320}; do
    timeout "${T_AB:-150}" python3 bench/flags_ab.py --out "$OUT/dense_${rows}_${shape}.json" --tag "dense_$rows" \
      --shape "$shape" --dense-rows "$rows" 2>&1 | grep -v "^wrote" | tail -3
  done
  # Launch-config variants of the kernels (VARIANTS="tag=JSON ..."), each at dense_rows=${VROWS:-64}.
  for v in ${VARIANTS:-}; do
    tag=${v%%=*}
    timeout "${T_AB:-150}" python3 bench/flags_ab.py --out "$OUT/dense_${VROWS:-64}${tag}_${shape}.json" --tag "$tag" \
      --shape "$shape" --dense-rows "${VROWS:-64}" --dense-tuned "${v#*=}" 2>&1 | grep -v "^wrote" | tail -3
  done
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
import numpy as np
out = sys.argv[1]
for f in sorted(glob.glob(os.path.join(out, "dense_*.json"))):
    r = json.load(open(f))["records"][0]
    base = os.path.join(out, f"dense_0_{r['L']}x{r['B']}_ar_tokens.npy")
    r["dense_rows"] = f"{r['dense_rows']} {r['tag']}"
    mine = f[:-5] + "_ar_tokens.npy"
    same = float(np.mean(np.load(base) == np.load(mine))) if os.path.exists(base) and os.path.exists(mine) else None
    print(f"{r['L']}x{r['B']} dense_rows={r['dense_rows']}: ar {r['ar_tokens_per_s']} vegas {r['vegas_tokens_per_s']} "
          f"tok/s tau {r['vegas_tau']} vegas==ar {r['vegas_equals_ar']} ar tokens == XLA-GEMM ar {same} "
          f"compile {r['compile_s']} s")
PY
