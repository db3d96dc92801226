"""Flags of `jspec train-drafter` and `jspec selfgen`, ready to hook into jspec/cli.py:

    p = sub.add_parser("train-drafter", help="train the LongSpec drafter block against a frozen target")
    drafter_cli.add_arguments(p)
    ...
    if args.command == "train-drafter": return drafter_cli.run(args)
"""
from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="target: known name or converted checkpoint dir")
    p.add_argument("--data", default=None, help="folder of text files (.txt .py .md .rst); default: the stdlib")
    p.add_argument("--out", required=True, help="run folder: ckpt/, drafter/, loss.jsonl, loss.png")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--window", type=int, default=512, help="the drafter's self-attention window")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--overwrite", action="store_true", help="discard an existing run in --out")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--ckpt-every", type=int, default=500)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=None, help="seconds; stop with a checkpoint after that")
    p.add_argument("--no-anchor-offset", action="store_true", help="ablation: positions 0..T-1")
    p.add_argument("--no-noisy-xattn", action="store_true", help="ablation: fixed lag p = 1")
    p.add_argument("--objective", default="ce", choices=["ce", "distill"],
                   help="ce: the text's next token; distill: the target's next-token distribution (soft labels)")
    p.add_argument("--export-every", type=int, default=0, help="bf16 snapshots to OUT/drafters/step_N (0: off)")
    p.add_argument("--no-progress", action="store_true")


def add_selfgen_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="target: known name or converted checkpoint dir")
    p.add_argument("--data", required=True, help="folder of text files (.txt .py .md .rst) to take windows from")
    p.add_argument("--out", required=True, help="folder for the generated .txt files (created)")
    p.add_argument("--prompt-tokens", type=int, default=1024, help="window of source text per row")
    p.add_argument("--new", type=int, default=1024, help="tokens the target generates per row")
    p.add_argument("--batch", type=int, default=64, help="rows per generate call")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--budget-s", type=float, default=180.0, help="stop before a batch would run past this")
    p.add_argument("--batches", type=int, default=None, help="stop after this many batches")
    p.add_argument("--seed", type=int, default=0)


def run_selfgen(args: argparse.Namespace) -> int:
    from jspec.api import load
    from .selfgen import self_generate

    summary = self_generate(load(args.model), args.data, args.out, prompt_tokens=args.prompt_tokens,
                            new_tokens=args.new, batch=args.batch, temperature=args.temperature,
                            budget_s=args.budget_s, max_batches=args.batches, seed=args.seed)
    print(json.dumps(summary, indent=1))
    return 0


def run(args: argparse.Namespace) -> int:
    from .train import train_drafter

    summary = train_drafter(
        model=args.model, data_dir=args.data, out=args.out, steps=args.steps, batch=args.batch,
        seq_len=args.seq_len, lr=args.lr, warmup=args.warmup, window=args.window, seed=args.seed,
        resume=args.resume, overwrite=args.overwrite, log_every=args.log_every, ckpt_every=args.ckpt_every,
        eval_every=args.eval_every, time_limit_s=args.time_limit, anchor_offset=not args.no_anchor_offset,
        noisy_xattn=not args.no_noisy_xattn, progress=not args.no_progress,
        objective=args.objective, export_every=args.export_every)
    print(json.dumps(summary, indent=1))
    return 0
