"""Self-generated drafter training text: the target's own continuations of windows of a text folder.

At inference the drafter predicts what the target generates, not human text. `self_generate` takes `batch`
windows of `prompt_tokens` tokens at seeded random offsets of the tokenized folder, lets the target continue
each by `new_tokens` (plain sampling at `temperature`, stop tokens ignored; one compiled program serves every
batch) and writes prompt + continuation as one .txt file per row, ready to sit beside the original text as
`train-drafter --data`. The bundled SmolLM2 drafter was trained this way; what the self-generated text added
to its acceptance is in docs/performance.md ("Drafter training"). CLI: `jspec selfgen`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

import jax
import numpy as np

from jspec import data as _data
from jspec.errors import InputError

from jspec.offline.training_text import tokenize


def self_generate(model, data_dir: str, out_dir: str, *, prompt_tokens: int = 1024, new_tokens: int = 1024,
                  batch: int = 64, temperature: float = 0.8, budget_s: float = 180.0,
                  max_batches: Optional[int] = None, seed: int = 0, progress: bool = True) -> dict:
    """Write `out_dir/selfgen-<batch>-<row>.txt` files until `budget_s` (a batch that would run past it is not
    started) or `max_batches`; returns the summary also written to `out_dir/selfgen_summary.json`.

    model: a `jspec.Model`. Each file is written under a temporary name and renamed, so an interrupted run
    leaves only whole files."""
    t0 = time.perf_counter()
    if prompt_tokens < 1 or new_tokens < 1 or batch < 1:
        raise InputError(f"prompt_tokens={prompt_tokens}, new_tokens={new_tokens} and batch={batch} must be >= 1")
    ids = tokenize(_data.read_dir(data_dir), model.tokenizer, sep=None)
    if len(ids) < prompt_tokens:
        raise InputError(f"{data_dir} holds {len(ids)} tokens, fewer than prompt_tokens={prompt_tokens}")
    from jspec.api import generate

    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    n, made, gen_s, batch_s = 0, 0, 0.0, None
    while max_batches is None or n < max_batches:
        if batch_s is not None and budget_s - (time.perf_counter() - t0) < 1.2 * batch_s:
            break
        starts = rng.integers(0, len(ids) - prompt_tokens + 1, batch)
        prompts = [ids[s:s + prompt_tokens].tolist() for s in starts]
        t = time.perf_counter()
        out = generate(model, prompts, max_new_tokens=new_tokens, temperature=temperature,
                       seed=seed * 100003 + n, ignore_eos=True)
        batch_s = time.perf_counter() - t   # bounds the next batch (the first one's includes the compile)
        if n:                                # tokens/s from the batches after the compiling one
            gen_s += batch_s
            made += sum(len(x) for x in out.tokens)
        for r, (p, c) in enumerate(zip(prompts, out.tokens)):
            path = os.path.join(out_dir, f"selfgen-{n:05d}-{r:03d}.txt")
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(model.tokenizer.decode(p + list(c)))
            os.replace(path + ".tmp", path)
        n += 1
        if progress:
            print(f"selfgen batch {n}: {batch} rows x {new_tokens} new tokens in {batch_s:.1f}s "
                  f"({time.perf_counter() - t0:.0f}s of the {budget_s:.0f}s budget)", file=sys.stderr, flush=True)
    summary = dict(batches=n, rows=n * batch, prompt_tokens=prompt_tokens, new=new_tokens, temperature=temperature,
                   source_tokens=int(len(ids)), generated_tokens_timed=made,
                   tokens_per_s=round(made / gen_s, 1) if gen_s else None,
                   wall_s=round(time.perf_counter() - t0, 1),
                   device=str(getattr(jax.devices()[0], "device_kind", "cpu")))
    with open(os.path.join(out_dir, "selfgen_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def add_arguments(p: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
    from jspec.api import load

    summary = self_generate(load(args.model), args.data, args.out, prompt_tokens=args.prompt_tokens,
                            new_tokens=args.new, batch=args.batch, temperature=args.temperature,
                            budget_s=args.budget_s, max_batches=args.batches, seed=args.seed)
    print(json.dumps(summary, indent=1))
    return 0
