"""Self-generated training text for the LongSpec drafter: the target's own continuations of training-text
windows.

    PYTHONPATH=. python bench/selfgen.py --data DIR --out DIR [--prompt-tokens 1024] [--new 1024] [--batch 64]
        [--temperature 0.8] [--budget-s 180] [--seed 0] [--quick]

At inference the drafter predicts what the target generates, not human text; the bundled drafter's tau
flattened after ~8 passes over its 5.4M tokens of text (bench/results/drafter_curve_h200.json). This
writes on-distribution text: each batch takes --batch windows of --prompt-tokens tokens at seeded random
offsets of the tokenized --data text, the target continues each by --new tokens (plain sampling at
--temperature, stop tokens ignored, one compiled program for every batch), and prompt + continuation go to
one .txt file per row under --out (selfgen-<batch>-<row>.txt), ready to sit beside the original text in
`train_drafter.py --data`. One progress line per batch; it stops before a batch would run past --budget-s
and prints tokens/s.
--quick is a CPU smoke test (two tiny batches).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="folder of text files (.txt .py .md .rst) to take prompts from")
    ap.add_argument("--out", required=True, help="folder for the generated .txt files (created)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--new", type=int, default=1024, help="tokens generated per row")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--budget-s", type=float, default=180.0, help="wall-clock budget of the whole script")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: 2 batches of 2 x (32 + 16) tokens")
    a = ap.parse_args()
    if a.quick:
        a.prompt_tokens, a.new, a.batch = 32, 16, 2
    t0 = time.perf_counter()

    import jax

    import jspec
    from jspec import data

    model = jspec.load(a.model, dtype="float32" if jax.default_backend() == "cpu" else None, progress=False)
    ids = []
    for text in data.read_dir(a.data):
        ids.extend(model.tokenizer.encode(text, add_special_tokens=False))
    ids = np.asarray(ids, np.int64)
    if len(ids) < a.prompt_tokens:
        raise SystemExit(f"error: {a.data} holds {len(ids)} tokens, fewer than --prompt-tokens {a.prompt_tokens}")
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    n_batches, made, gen_s, batch_s = 0, 0, 0.0, None
    while not a.quick or n_batches < 2:
        left = a.budget_s - (time.perf_counter() - t0)
        if batch_s is not None and left < 1.2 * batch_s:
            break
        starts = rng.integers(0, len(ids) - a.prompt_tokens + 1, a.batch)
        prompts = [ids[s:s + a.prompt_tokens].tolist() for s in starts]
        t = time.perf_counter()
        out = jspec.generate(model, prompts, max_new_tokens=a.new, temperature=a.temperature,
                             seed=a.seed * 100003 + n_batches, ignore_eos=True)
        dt = time.perf_counter() - t
        batch_s = dt          # bounds the next batch (the first one's includes the compile: conservative)
        if n_batches:         # tokens/s from the batches after the compiling one
            gen_s += dt
            made += sum(len(x) for x in out.tokens)
        for r, (p, c) in enumerate(zip(prompts, out.tokens)):
            path = os.path.join(a.out, f"selfgen-{n_batches:05d}-{r:03d}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(model.tokenizer.decode(p + list(c)))
        n_batches += 1
        print(f"batch {n_batches}: {a.batch} rows x {a.new} new tokens in {dt:.1f}s "
              f"({time.perf_counter() - t0:.0f}s of the {a.budget_s:.0f}s budget)", flush=True)
    summary = dict(batches=n_batches, rows=n_batches * a.batch, prompt_tokens=a.prompt_tokens, new=a.new,
                   temperature=a.temperature, generated_tokens_timed=made,
                   tokens_per_s=round(made / gen_s, 1) if gen_s else None, wall_s=round(time.perf_counter() - t0, 1),
                   device=str(jax.devices()[0].device_kind if hasattr(jax.devices()[0], "device_kind") else "cpu"))
    with open(os.path.join(a.out, "selfgen_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
