#!/usr/bin/env bash
# `jspec bench` on a lent GPU machine (no .git, no network, the model staged by hand). From the repo root:
#   bash bench/gpu.sh stage1           (carry .gpu/z1 .carry/hgz .carry/commit .whl) \  two back-to-back calls: the gzipped
#   JSPEC_COMMIT=... bash bench/gpu.sh stage2 MODE...  (carry .gpu/z2)     /  98 MB GGUF travels in halves under
#   JSPEC_COMMIT=... bash bench/gpu.sh MODE...   later calls while warm       the 64 MiB carry limit (parts below)
# JSPEC_COMMIT is `python -m jspec.provenance` run here on a clean checkout: results are refused without it.
# Parts: `bash ../shared/gpu/prepare_smollm2.sh`, then `cat .gpu/a/* .gpu/b/* | gzip -9 | split -b 46400000 -
# /tmp/mz.` and move /tmp/mz.aa to .gpu/z1/model.gz.aa, /tmp/mz.ab to .gpu/z2/model.gz.ab; .carry/heldout holds
# prose the bundled drafter never saw in training (austen_emma.txt, austen_sensesensibility.txt); carry them gzipped
# as .carry/hgz/<name>.txt.gz (`gzip -9c`): z1 and the tracked files alone come within ~1 MB of the carry limit.
# Modes (each writes $OUT/bench_<mode>_${SUF}.json + .png + _log.txt):
#   b64 / b16 / b1   the headline grid at L=7936 (+ 256 new = 8192 positions) for one batch size: ar, streaming, vegas (pages of 8),
#                    longspec, each with and without prompt lookup; Hugging Face peers in the same run. LENGTHS=2048,7936:
#                    issue 31's two contexts; TAG: a file-name suffix; SERIAL (8): b1 decodes that many prompts one
#                    at a time (`jspec bench --serial`) instead of one prompt. `python bench/step_overhead.py --bench <the three
#                    files> --profile <profile_step file>` then sums them up against issue 31's targets
#   lossless         --check-lossless (float32, highest matmul precision) at L=7936, B=64: every lossless method
#   continue64       the `continue` workload (raw fixed-length windows, stop tokens ignored) at L=$LENGTHS (7936), B=64
#   exact            issue 29's GPU check: exact16 and exact64 in one run (B=16 first) -> $OUT/exact${TAG}_${SUF}.json;
#                    on an H100 it passed 560 s before the last two methods at B=64 (exact_h100.json): there run
#                    exact16 and exact64 in two calls and `python -m jspec.bench --merge` their files here
#   exact64 / exact16  bf16 exact mode (`--exact --exact-cost`) at L=7936 for one batch size: every lossless
#                    method and ar in exact mode, each also timed in the default mode -> $OUT/exact{64,16}${TAG}_${SUF}.json
#                    (TAG, also read by exactprof: a suffix that keeps a rerun's files apart from earlier ones)
#   heads            Dustin: `jspec profile-heads` at L=8000, budget 512, for the self drafter (vegas reads) and the
#                    LongSpec drafter -> $OUT/dustin_heads_{self,longspec}_${SUF}.json + .png; also kept in $C for
#                    later `dustin64` / `fidelity` calls on the warm machine
#   dustin64         Dustin end-to-end at L=7936, B=64: vegas (pages of 8) and longspec, each verified densely and by
#                    Dustin with its `heads` profile (budget 512) (bench_dustin64_h200.json ran ar:loop=decode too, the old loop since deleted)
#                    PROFILES=bench/results/dustin_heads PROF_CARD=h200: the committed profiles instead of a `heads`
#                    run; DM: other methods (P in DM stands for the profiles' prefix); TAG: a suffix for the file names
#   vattn            bench/kernels.py --only verify: Dustin's verification attention vs dense at Llama-3-8B shapes
#                    (32K, B=16, budget 512 first; the A_T probe as jspec runs it and through XLA beside it; the
#                    selection for each split of the tiers) -> $OUT/kernels_verify${TAG:-}_${SUF}.json; T_BUDGET:
#                    its --time-budget (150 s)
#   decode           bench/kernels.py --only decode: a B=1 step's launches (XLA's dense parts, the fused ones,
#                    each fused launch and flash_scores over a grid of launch settings; issue 31) ->
#                    $OUT/kernels_decode${TAG:-}_${SUF}.json; T_BUDGET: its --time-budget (300 s)
#   profile          bench/profile_step.py: kernels and time per step kind -> $OUT/profile_step_${SUF}.json
#   exactprof        where exact mode's cost goes: bench/profile_step.py (ar's step, vegas' verification, LongSpec's
#                    tree verification; B=$EP_BATCHES, default 64,16) in the default mode, with the fused dense
#                    kernels alone (--dense-rows) and in exact mode (EP narrows: EP=exact; EP_KINDS the step kinds)
#                    -> $OUT/profile_exact_{default,dense,exact}${TAG}_${SUF}.json
#   beforeafter       issue 28's before/after in one call: the same `jspec bench` (ar and the best lossless methods,
#                    L=7936, B=16 and 64) from the tree of commit $BEFORE (carry .before: `git archive $BEFORE jspec
#                    pallas_kernels checkpoints pyproject.toml`; BEFORE_COMMIT=<sha>:<its source hash>), then from
#                    this tree; both with cuBLAS GEMMs -> $OUT/bench_{before,after}${TAG}_<card>.json. BA_ORDER="after
#                    before" runs this tree first; BA_BATCHES (16,64) and BA (the methods) narrow the run
#   fidelity         Dustin: `jspec fidelity` teacher-forced at L=$LENGTHS (default 2048,4096,8000), budgets
#                    128..1024, with $C's profile when `heads` ran before -> $OUT/dustin_fidelity_${SUF}.json + .png
set -uo pipefail
C=/root/jspec-cache
# The flags users get: jspec adds --xla_gpu_enable_triton_gemm=false (cuBLAS GEMMs) on import unless XLA_FLAGS
# names it; `--xla_gpu_autotune_level=0` alone left XLA's Triton GEMMs untuned and made every method slower
# (bench_b64_autotune0_h200.json)
export JSPEC_CACHE=$C PYTHONPATH=/tmp/site:. XLA_FLAGS="${XLA_FLAGS:-}"
export JAX_COMPILATION_CACHE_DIR=$C/jax-cache TRANSFORMERS_VERBOSITY=error
# result names say the card that made them (the lent machine may be an H100 or an H200)
SUF=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -q H100 && echo h100 || echo h200)
METHODS="${METHODS:-ar,streaming,vegas:select_page=8,longspec,vegas+lookup8:select_page=8,longspec+lookup8}"
LOSSLESS="${LOSSLESS:-ar,streaming,quest,vegas:select_page=8,longspec,vegas+lookup8:select_page=8,longspec+lookup8}"
run() {  # run NAME TIMEOUT ARGS...
  local name=$1 t=$2; shift 2
  timeout "$t" python3 -m jspec.bench --texts $C/corpus --out "$OUT/bench_${name}_${SUF}.json" "$@" 2>&1 \
    | grep -v -e Warning -e "^  warnings.warn" | tee "$OUT/bench_${name}_${SUF}_log.txt" | tail -25
}
tool() {  # tool NAME TIMEOUT SUBCOMMAND ARGS...: a jspec offline tool, its log beside its files in $OUT
  local name=$1 t=$2; shift 2
  timeout "$t" python3 -m jspec.cli "$@" 2>&1 | grep -v -e Warning -e "^  warnings.warn" \
    | tee "$OUT/dustin_${name}_${SUF}_log.txt" | tail -25
}
for mode in "$@"; do
  case "$mode" in
    stage1) mkdir -p $C/corpus && cp .gpu/z1/* $C/ && { [ -d .carry/hgz ] && for f in .carry/hgz/*.gz; do
              zcat "$f" > $C/corpus/$(basename "$f" .gz); done || cp .carry/heldout/*.txt $C/corpus/; } &&
            python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl ;;
    stage2) cp .gpu/z2/* $C/ && cat $C/model.gz.* | gunzip > $C/smollm2-135m.gguf && rm $C/model.gz.* &&
            echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $C/smollm2-135m.gguf" | sha256sum -c - ;;
    b64|b16|b1) run "$mode${TAG:-}" "${T_RUN:-560}" --methods "$METHODS" --lengths "${LENGTHS:-7936}" --batches "${mode#b}" \
                  --serial "${SERIAL:-8}" --peers "${PEERS-hf,hf-compile}" --peer-timeout "${T_PEER:-200}" ;;
    lossless) run lossless "${T_RUN:-560}" --methods "$LOSSLESS" --lengths 7936 --batches 64 --check-lossless ;;
    exact|exact64|exact16) bs=${mode#exact}; timeout "${T_RUN:-560}" python3 -m jspec.bench --texts $C/corpus \
                  --out "$OUT/${mode}${TAG:-}_${SUF}.json" --exact --exact-cost --methods "$LOSSLESS" --lengths 7936 \
                  --batches "${bs:-16,64}" 2>&1 \
                  | grep -v -e Warning -e "^  warnings.warn" | tee "$OUT/${mode}${TAG:-}_${SUF}_log.txt" | tail -25 ;;
    continue64) run continue64 "${T_RUN:-300}" --workload continue --ignore-eos --methods ar,streaming,vegas \
                  --lengths "${LENGTHS:-7936}" --batches 64 ;;
    heads) for d in self longspec; do
             tool "heads_$d" "${T_RUN:-270}" profile-heads --texts $C/corpus --length 8000 --budget 512 --drafter $d \
               --out $C/dustin_heads_${d}_${SUF}.json && cp $C/dustin_heads_${d}_${SUF}.json $C/dustin_heads_${d}_${SUF}.png "$OUT/"
           done ;;
    dustin64) P=${PROFILES:-$C/dustin_heads} PC=${PROF_CARD:-$SUF}
              DM=${DM:-"vegas:select_page=8,vegas:select_page=8,profile=P_self,longspec,longspec:profile=P_longspec"}
              run "dustin64${TAG:-}" "${T_RUN:-560}" --lengths 7936 --batches 64 \
                --methods "$(echo "$DM" | sed -E "s#=P_(self|longspec)#=${P}_\1_${PC}.json#g")" ;;
    vattn) timeout "${T_RUN:-200}" python3 bench/kernels.py --only verify --time-budget "${T_BUDGET:-150}" \
             --out "$OUT/kernels_verify${TAG:-}_${SUF}.json" 2>&1 | grep -v Warning \
             | tee "$OUT/kernels_verify${TAG:-}_${SUF}_log.txt" | tail -25 ;;
    decode) timeout "${T_RUN:-400}" python3 bench/kernels.py --only decode --time-budget "${T_BUDGET:-300}" \
             --out "$OUT/kernels_decode${TAG:-}_${SUF}.json" 2>&1 | grep -v Warning \
             | tee "$OUT/kernels_decode${TAG:-}_${SUF}_log.txt" | tail -25 ;;
    profile) JSPEC_COMMIT=$JSPEC_COMMIT timeout "${T_RUN:-300}" python3 bench/profile_step.py --texts $C/corpus \
               --out "$OUT/profile_step_${SUF}.json" 2>&1 | grep -v Warning | tee "$OUT/profile_step_${SUF}_log.txt" | tail -25 ;;
    exactprof) for v in ${EP:-default dense exact}; do
                 flag=$([ $v = dense ] && echo --dense-rows 100000; [ $v = exact ] && echo --exact)
                 timeout "${T_RUN:-170}" python3 bench/profile_step.py --texts $C/corpus $flag --batches "${EP_BATCHES:-64,16}" \
                   --kinds "${EP_KINDS:-plain_step,vegas_verify,longspec_verify}" --reps 5 --trace-calls 3 --time-budget 150 \
                   --out "$OUT/profile_exact_${v}${TAG:-}_${SUF}.json" 2>&1 | grep -v Warning \
                   | tee "$OUT/profile_exact_${v}${TAG:-}_${SUF}_log.txt" | grep "^B=" ; done ;;
    beforeafter) BA="${BA:-ar,vegas,vegas:select_page=8,vegas+lookup8:select_page=8,longspec,longspec+lookup8}"
              export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
              for side in ${BA_ORDER:-before after}; do   # BA_ORDER="after before": this tree first
                if [ "$side" = before ]; then
                  (cd .before && JSPEC_COMMIT=$BEFORE_COMMIT PYTHONPATH=/tmp/site:. timeout "${T_RUN:-280}" python3 -m \
                     jspec.bench --texts $C/corpus --out "$OUT/bench_before${TAG:-}_${SUF}.json" --methods "$BA" --lengths 7936 \
                     --batches "${BA_BATCHES:-16,64}" 2>&1 | grep -v -e Warning -e "^  warnings.warn" \
                     | tee "$OUT/bench_before${TAG:-}_${SUF}_log.txt" | tail -12)
                else
                  run "after${TAG:-}" "${T_RUN:-280}" --methods "$BA" --lengths 7936 --batches "${BA_BATCHES:-16,64}"
                fi
              done ;;
    fidelity) prof=$([ -f $C/dustin_heads_self_${SUF}.json ] && echo "--profile $C/dustin_heads_self_${SUF}.json")
              tool fidelity "${T_RUN:-560}" fidelity --texts $C/corpus --lengths "${LENGTHS:-2048,4096,8000}" \
                --budgets 128,256,512,1024 --draft-signal "${SIGNAL:-vegas}" $prof --out "$OUT/dustin_fidelity_${SUF}.json" ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
done
