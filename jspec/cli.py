"""`jspec` command line: each subcommand parses flags and calls a keyword-only function tests can import."""
from __future__ import annotations

import argparse
import json
import sys


def cmd_fetch(*, model: str = "smollm2-135m", progress: bool = True) -> str:
    import checkpoints
    path = checkpoints.resolve(model, progress=progress)
    print(path)
    return path


def cmd_convert(*, out: str, from_hf=None, from_gguf=None, dtype="bfloat16", overwrite=False, progress=True) -> str:
    import checkpoints
    if (from_hf is None) == (from_gguf is None):
        raise SystemExit("error: give exactly one of --from-hf DIR or --from-gguf FILE")
    path = checkpoints.convert(out=out, from_hf=from_hf, from_gguf=from_gguf, dtype=dtype, overwrite=overwrite,
                               progress=progress)
    print(f"converted -> {path}")
    return path


def cmd_generate(*, model: str = "smollm2-135m", method: str = "ar", prompt=None, prompt_file=None,
                 prompt_tokens: int = 3000, batch: int = 1, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, chat: bool = False, seed: int = 0, ignore_eos: bool = False,
                 as_json: bool = False, gamma: int = 4, budget: int = 512, ratio=None, sink=None, page_size=None,
                 min_tokens=None, max_tokens=None, score_mode=None, collect=None):
    import jspec
    from jspec import data

    # Speculative knobs left unset keep SpecConfig's defaults; gamma/budget/ratio are ignored for "ar".
    knobs = {k: v for k, v in dict(sink=sink, page_size=page_size, min_tokens=min_tokens, max_tokens=max_tokens,
                                   score_mode=score_mode, collect=collect).items() if v is not None}
    if method != "ar":
        knobs.update(gamma=gamma, budget=budget, ratio=ratio)
    elif knobs:
        raise jspec.InputError(f"--{sorted(knobs)[0].replace('_', '-')} only applies to speculative methods")

    m = jspec.load(model)
    if prompt is not None or prompt_file is not None:
        text = prompt if prompt is not None else open(prompt_file, encoding="utf-8").read()
        prompts = [text] * batch
    else:  # default: real long documents from the running Python's standard library
        prompts = data.long_prompts(m.tokenizer, prompt_tokens, count=batch)
    out = jspec.generate(m, prompts, method=method, max_new_tokens=max_new_tokens, temperature=temperature,
                         top_k=top_k, top_p=top_p, chat=chat, seed=seed, ignore_eos=ignore_eos, **knobs)
    s = out.stats
    if as_json:
        print(json.dumps({"texts": out.texts, "tokens": out.tokens, "stats": vars(s)}))
    else:
        for i, t in enumerate(out.texts):
            print(f"--- sequence {i} ({s.prompt_tokens[i]} prompt tokens, {s.new_tokens[i]} new) ---")
            print(t)
        print(f"--- {method}: batch {s.batch}, prefill {s.prefill_s:.2f} s, decode {s.decode_s:.2f} s "
              f"(includes compilation on first use), {s.tokens_per_s:.1f} tokens/s, tau {s.tau:.2f}"
              + (f", accepted-length histogram {s.accept_hist}" if s.accept_hist else ""))
    return out


def main(argv=None):
    import os
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner: jspec needs none
    p = argparse.ArgumentParser(prog="jspec", description="Lossless long-context speculative decoding in JAX.")
    sub = p.add_subparsers(dest="cmd", required=True)

    f = sub.add_parser("fetch", help="download + convert a known model into the cache dir ($JSPEC_CACHE)")
    f.add_argument("model", nargs="?", default="smollm2-135m")

    c = sub.add_parser("convert", help="convert a Hugging Face dir or a GGUF file to a jspec (Orbax) checkpoint")
    c.add_argument("--from-hf", metavar="DIR")
    c.add_argument("--from-gguf", metavar="FILE")
    c.add_argument("--out", required=True, metavar="DIR")
    c.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    c.add_argument("--overwrite", action="store_true")

    g = sub.add_parser("generate", help="generate text (default: a long stdlib document, greedy)")
    g.add_argument("--model", default="smollm2-135m", help="known name or converted checkpoint dir")
    g.add_argument("--method", default="ar", help="ar | streaming | quest | vegas")
    g.add_argument("--gamma", type=int, default=4, help="draft tokens per round (speculative methods)")
    g.add_argument("--budget", type=int, default=512, help="KV slots each draft step attends to")
    g.add_argument("--ratio", type=float, default=None,
                   help="dynamic budget: clamp(ceil(ratio * context), --min-tokens, --max-tokens or --budget)")
    g.add_argument("--sink", type=int, default=None, help="streaming: always-kept first tokens (default 4)")
    g.add_argument("--page-size", type=int, default=None, help="quest: tokens per page (default 16)")
    g.add_argument("--min-tokens", type=int, default=None, help="lower clamp of the --ratio rule (default 256)")
    g.add_argument("--max-tokens", type=int, default=None, help="upper clamp of the --ratio rule")
    g.add_argument("--score-mode", choices=["weights", "logits"], default=None, help="vegas ranking")
    g.add_argument("--collect", choices=["c2q", "all"], default=None,
                   help="vegas: Collect-2-Query rows (c2q) or all gamma+1 verified rows")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--prompt")
    src.add_argument("--prompt-file")
    g.add_argument("--prompt-tokens", type=int, default=3000, help="length of the default stdlib prompt")
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--json", action="store_true", dest="as_json")

    from jspec.drafter import cli as drafter_cli
    t = sub.add_parser("train-drafter", help="train the LongSpec drafter block against a frozen target")
    drafter_cli.add_arguments(t)

    a = p.parse_args(argv)
    from checkpoints import CheckpointError
    from jspec.decoding import InputError
    try:
        if a.cmd == "fetch":
            cmd_fetch(model=a.model)
        elif a.cmd == "convert":
            cmd_convert(out=a.out, from_hf=a.from_hf, from_gguf=a.from_gguf, dtype=a.dtype, overwrite=a.overwrite)
        elif a.cmd == "train-drafter":
            return drafter_cli.run(a)
        elif a.cmd == "generate":
            kw = {k: v for k, v in vars(a).items() if k != "cmd"}
            cmd_generate(**kw)
    except (CheckpointError, InputError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
