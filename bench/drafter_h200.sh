#!/usr/bin/env bash
# LongSpec drafter for SmolLM2-135M on the H200 (issue 6). Run from the repo root on the GPU machine after the
# model is staged (../shared/gpu/README.md), with .carry/train (training text) carried:
#   bash bench/drafter_h200.sh main      # the committed drafter: --budget-s 450 of training
#   bash bench/drafter_h200.sh ablation  # full / no-anchor-offset / no-noisy-xattn, equal steps
#   bash bench/drafter_h200.sh pair      # two GPUs: distilled drafters, 16 x 2048 (GPU 0) and 4 x 8192 (GPU 1)
#                                        # tokens per step, BUDGET_S each, EXPORTS bf16 snapshots kept in
#                                        # /root/drafter-runs (tau vs training tokens: `curve`, same machine)
#   bash bench/drafter_h200.sh curve     # greedy tree tau at L=8000, B=16 of every snapshot + the finals
#   bash bench/drafter_h200.sh selfgen   # add the target's own continuations of training-text windows to the
#                                        # training folder (SELFGEN_S seconds, bench/selfgen.py); then main/pair
#   bash bench/drafter_h200.sh selfgen2  # two GPUs: continuations with seeds 0 and 1 at once (SELFGEN_B rows per
#                                        # batch), then the folder /root/drafter-train-sg = training text + both
#   bash bench/drafter_h200.sh selfgen1  # one GPU: continuations with seed 0 for SELFGEN_S seconds, then the folder
#                                        # /root/drafter-train-sg = training text + them; $OUT/selfgen.tar.gz keeps
#                                        # the generated files (carry them back as .carry/selfgen to skip this)
#   bash bench/drafter_h200.sh long      # one distilled run (named RUN, default long) of STEPS steps on
#                                        # /root/drafter-train-sg on GPU $GPU, BUDGET_S seconds per call: a later
#                                        # call continues it (--resume); snapshots every EVERY steps stay in
#                                        # /root/drafter-runs/$RUN
# TRAIN_SRC: where the training text lies (default .carry/train).
# Training text: the corpus files in .carry/train (kjv, jargon, python-docs, Mansfield Park, stdtypes.rst) and
# the machine's stdlib (.py, tests excluded), minus every text the benchmarks draw prompts from (held out:
# Emma, Sense and Sensibility, the corpus's stdlib-*.py modules and bench/spec.py's CODE_MODULES).
set -euo pipefail
mode=${1:?main or ablation}
data=/root/drafter-train
if [ ! -d "$data" ]; then
  mkdir -p "$data" && cp "${TRAIN_SRC:-.carry/train}"/* "$data/"
  python3 - "$data" <<'PY'
import pathlib, shutil, sys, sysconfig
held = {"inspect", "typing", "argparse", "dataclasses", "functools", "pathlib", "subprocess", "_pydecimal",
        "turtle", "decimal"}
root = pathlib.Path(sysconfig.get_paths()["stdlib"])
n = 0
for p in sorted(root.rglob("*.py")):
    rel = p.relative_to(root)
    if p.stem in held or rel.parts[0] in ("site-packages", "dist-packages", "test", "idlelib") or \
            "collections" in rel.parts:   # collections/__init__ is a benchmark prompt
        continue
    shutil.copy(p, pathlib.Path(sys.argv[1]) / ("stdlib-" + "_".join(rel.parts)))
    n += 1
print(f"training text: {n} stdlib modules + corpus files")
PY
fi
du -sh "$data"
case "$mode" in
  main) python3 bench/train_drafter.py --data "$data" --out "$OUT/drafter_smollm2" --budget-s "${BUDGET_S:-450}" \
          --steps "${STEPS:-0}" --overwrite
        rm -rf "$OUT/drafter_smollm2/ckpt" && tar -C "$OUT/drafter_smollm2" -cf "$OUT/drafter_smollm2/drafter.tar" drafter ;;
  ablation) python3 bench/drafter_ablation.py --data "$data" --out "$OUT/ablation" --steps "${STEPS:-150}" \
              --arms "${ARMS:-full,no_anchor_offset,no_noisy_xattn}"
            # one file back ($OUT returns at most 8): every arm's drafter (bf16), loss log and the summary
            rm -rf "$OUT"/ablation/_tokens "$OUT"/ablation/*/ckpt
            tar -C "$OUT" -cf "$OUT/ablation.tar" ablation && rm -rf "$OUT/ablation" ;;
  pair) runs=/root/drafter-runs
        common="--data $data --budget-s ${BUDGET_S:-480} --objective distill --export-count ${EXPORTS:-5} --overwrite"
        CUDA_VISIBLE_DEVICES=0 python3 bench/train_drafter.py $common --out $runs/d2048 --seq-len 2048 --batch 16 \
          > "$OUT/d2048_log.txt" 2>&1 &
        CUDA_VISIBLE_DEVICES=1 python3 bench/train_drafter.py $common --out $runs/d8192 --seq-len 8192 --batch 4 \
          > "$OUT/d8192_log.txt" 2>&1 &
        wait
        for r in d2048 d8192; do
          tar -C $runs/$r -cf "$OUT/$r.tar" drafter loss.jsonl loss.png summary.json train_config.json || true
        done ;;
  curve) runs=/root/drafter-runs
         list="default=checkpoints/drafters/smollm2-135m"
         for r in ${RUNS:-d2048 d8192}; do
           for d in $runs/$r/drafters/step_* $runs/$r/drafter; do
             [ -d "$d" ] && list="$list,$r-$(basename $d)=$d"
           done
         done
         python3 bench/drafter_tau.py --drafters "$list" --out "$OUT/drafter_curve_h200.json" --length 8000 \
           --batch 16 --new "${NEW:-128}" --modes tree ;;
  selfgen) python3 bench/selfgen.py --data "$data" --out "$data/selfgen" --budget-s "${SELFGEN_S:-180}" \
             --batch "${SELFGEN_B:-64}" > "$OUT/selfgen_log.txt" 2>&1
           tail -1 "$OUT/selfgen_log.txt"; du -sh "$data/selfgen" ;;
  selfgen2) for g in 0 1; do
              CUDA_VISIBLE_DEVICES=$g python3 bench/selfgen.py --data "$data" --out "/root/selfgen$g" --seed "$g" \
                --budget-s "${SELFGEN_S:-200}" --batch "${SELFGEN_B:-256}" > "$OUT/selfgen${g}_log.txt" 2>&1 &
            done
            wait
            rm -rf "$data-sg" && mkdir -p "$data-sg" && cp "$data"/* "$data-sg/" && cp -r /root/selfgen0 /root/selfgen1 "$data-sg/"
            tail -qn1 "$OUT"/selfgen*_log.txt; du -sh "$data-sg" ;;
  selfgen1) if [ -d .carry/selfgen ]; then mkdir -p /root/selfgen0 && tar -C /root/selfgen0 -xzf .carry/selfgen/selfgen.tar.gz
            else python3 bench/selfgen.py --data "$data" --out /root/selfgen0 --seed 0 --budget-s "${SELFGEN_S:-300}" \
                   --batch "${SELFGEN_B:-256}" > "$OUT/selfgen0_log.txt" 2>&1
                 tail -n1 "$OUT/selfgen0_log.txt"; tar -C /root/selfgen0 -czf "$OUT/selfgen.tar.gz" .
            fi
            rm -rf "$data-sg" && mkdir -p "$data-sg" && cp "$data"/* "$data-sg/" && cp -r /root/selfgen0 "$data-sg/"
            du -sh "$data-sg" ;;
  long) run=/root/drafter-runs/${RUN:-long}
        [ -d "$data-sg" ] || { echo "error: $data-sg is missing: run 'bash bench/drafter_h200.sh selfgen2' first" >&2; exit 2; }
        if [ -d "$run/ckpt" ]; then again=--resume; else again=--overwrite; fi
        CUDA_VISIBLE_DEVICES=${GPU:-0} python3 bench/train_drafter.py --data "$data-sg" --out $run --objective distill \
          --steps "${STEPS:-3400}" --export-every "${EVERY:-425}" --budget-s "${BUDGET_S:-540}" $again
        tar -C $run -cf "$OUT/long.tar" drafter loss.jsonl loss.png summary.json train_config.json || true ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
