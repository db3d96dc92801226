"""How far does LongSpec drafter training get in a wall-clock budget? Trains the drafter for SmolLM2-135M
(the bundled one took ~11 minutes of script time on one H200: docs/performance.md) and records tokens/s, loss
and the exported block.

    PYTHONPATH=. python bench/train_drafter.py --out $OUT/drafter_smollm2 [--data DIR] [--budget-s 600]
        [--no-anchor-offset] [--no-noisy-xattn] [--steps N] [--objective ce|distill] [--export-every N]
        [--resume] [--quick]

--steps 0 (default) sizes the run to the budget: a short calibration run measures tokens/s (compiling the
step once; the real run reuses the compiled step), then the schedule's length is what fits in the time
left. Without --data the text is the whole Python stdlib (present on every machine). Written to --out:
ckpt/ (Orbax, resumable), drafter/ (bf16 block, `jspec.drafter.load_drafter`), loss.jsonl, loss.png,
train_config.json, summary.json. --quick is a CPU smoke test (a few steps on one stdlib module).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import base_record, peak_memory_bytes  # noqa: E402
from jspec.offline.train_drafter import train_drafter  # noqa: E402

QUICK = dict(batch=2, seq_len=128, window=32, steps=4, warmup=1, log_every=1, eval_every=2, n_eval_chunks=2,
             ckpt_every=2, stdlib_modules=("inspect",))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m", help="target: known name or converted checkpoint dir")
    ap.add_argument("--data", default=None, help="folder of text files (.txt .py .md .rst); default: the stdlib")
    ap.add_argument("--budget-s", type=float, default=600.0, help="wall-clock budget of the whole script")
    ap.add_argument("--steps", type=int, default=0, help="0: as many as fit in the budget (calibrated)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-anchor-offset", action="store_true", help="ablation: positions 0..T-1")
    ap.add_argument("--no-noisy-xattn", action="store_true", help="ablation: fixed lag p = 1")
    ap.add_argument("--objective", default="ce", choices=["ce", "distill"],
                    help="ce: the text's next token; distill: the target's next-token distribution")
    ap.add_argument("--export-every", type=int, default=0, help="bf16 snapshots every N steps (0: off)")
    ap.add_argument("--export-count", type=int, default=0,
                    help="with --steps 0: about this many evenly spaced snapshots (tau vs training tokens)")
    ap.add_argument("--eval-every", type=int, default=0, help="0: five evaluations over the run")
    ap.add_argument("--ckpt-every", type=int, default=500)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--attn", default="auto", choices=["xla", "auto"],
                    help="the frozen target's attention during training (auto: the Pallas flash kernel where it "
                         "runs, 2.1x faster steps on the H200; xla: plain XLA attention)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: a few tiny steps")
    a = ap.parse_args()
    t0 = time.perf_counter()

    import jax
    from jspec.api import load

    # CPU matmuls in bf16 are emulated and ~10x slower: the smoke test runs the target in float32 there.
    model = load(a.model, dtype="float32" if jax.default_backend() == "cpu" else None)
    print(f"target {model.path}: {model.cfg.n_layers} layers, D {model.cfg.d_model}, V {model.cfg.vocab_size} "
          f"(loaded in {time.perf_counter() - t0:.0f}s)", flush=True)
    kw = dict(model=model, data_dir=a.data, out=a.out, batch=a.batch, seq_len=a.seq_len, window=a.window,
              lr=a.lr, warmup=a.warmup, seed=a.seed, anchor_offset=not a.no_anchor_offset,
              noisy_xattn=not a.no_noisy_xattn, ckpt_every=a.ckpt_every, log_every=a.log_every,
              attn_backend=None if a.attn == "auto" else "xla", resume=a.resume, overwrite=a.overwrite,
              token_cache=a.out, objective=a.objective)
    steps = a.steps
    if a.quick:
        kw.update({k: v for k, v in QUICK.items() if k != "steps"})
        steps = steps or QUICK["steps"]
    if a.resume and not steps:
        cfg_path = os.path.join(a.out, "train_config.json")
        if os.path.isfile(cfg_path):
            with open(cfg_path) as f:
                steps = json.load(f)["steps"]   # a resume keeps the original schedule
    tok_per_step = kw["batch"] * kw["seq_len"]

    if not steps:
        # Calibrate: 8 steps in a scratch run; the jitted step is cached in-process.
        # Twice: the first pass's rate still includes compiles past its first step (seen on the H200: a rate
        # ~6x too low, so the schedule filled a third of the budget); the second reuses every compiled step.
        cal = os.path.join(a.out, "_calibrate")
        for _ in range(2):
            s = train_drafter(**{**kw, "out": cal, "resume": False, "overwrite": True, "ckpt_every": 0},
                              steps=10**6, stop_at=8, eval_every=0, plot=False, progress=False)
        shutil.rmtree(cal, ignore_errors=True)
        tps = s["tokens_per_s"]
        left = a.budget_s - (time.perf_counter() - t0) - 45.0   # reserve: evals, checkpoint, export, plot
        steps = max(10, int(0.95 * left * tps / tok_per_step))
        print(f"calibration: {tps:,.0f} tokens/s -> {steps} steps of {tok_per_step} tokens "
              f"({steps * tok_per_step / 1e6:.1f}M tokens) in the {left:.0f}s left", flush=True)

    export_every = a.export_every or (max(1, steps // (a.export_count + 1)) if a.export_count else 0)
    quick_eval = kw.pop("eval_every", 0)
    eval_every = a.eval_every or quick_eval or max(1, steps // 5)
    limit = a.budget_s - (time.perf_counter() - t0) - 20.0
    s = train_drafter(**kw, steps=steps, eval_every=eval_every, export_every=export_every,
                      time_limit_s=None if a.quick else limit)

    recs = [json.loads(line) for line in open(s["log"])]
    evals = [r for r in recs if "eval_loss" in r]
    summary = base_record(
        bench="train_drafter", model=str(model.path), steps_done=s["step"], steps=steps, finished=s["finished"],
        tokens=s["step"] * tok_per_step, tokens_per_s=s["tokens_per_s"], loss=s["loss"],
        eval_loss=evals[-1]["eval_loss"] if evals else None, eval_acc=evals[-1]["eval_acc"] if evals else None,
        eval_agree=evals[-1].get("eval_agree") if evals else None, objective=a.objective, export_every=export_every,
        anchor_offset=kw["anchor_offset"], noisy_xattn=kw["noisy_xattn"], batch=kw["batch"], seq_len=kw["seq_len"],
        window=kw["window"], lr=a.lr, peak_memory_bytes=peak_memory_bytes(),
        wall_s=time.perf_counter() - t0, drafter=s["drafter"], plot=s.get("plot"))
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
