"""Self-generated drafter training text on the benchmark machine: `jspec.drafter.selfgen.self_generate`
(the library function behind `jspec selfgen`), with the benchmark scripts' flags and a --quick smoke test.

    PYTHONPATH=. python bench/selfgen.py --data DIR --out DIR [--prompt-tokens 1024] [--new 1024] [--batch 64]
        [--temperature 0.8] [--budget-s 180] [--seed 0] [--quick]

One progress line per batch; it stops before a batch would run past --budget-s and prints the summary
(tokens/s from the batches after the compiling one). --quick is a CPU smoke test (two tiny batches).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

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

    import jax

    import jspec
    from jspec.drafter.selfgen import self_generate

    model = jspec.load(a.model, dtype="float32" if jax.default_backend() == "cpu" else None, progress=False)
    s = self_generate(model, a.data, a.out, prompt_tokens=a.prompt_tokens, new_tokens=a.new, batch=a.batch,
                      temperature=a.temperature, budget_s=a.budget_s, max_batches=2 if a.quick else None,
                      seed=a.seed)
    print(json.dumps(s))


if __name__ == "__main__":
    main()
