"""Prompt sources. The default is the running Python's own standard library, present on every machine."""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path

DEFAULT_STDLIB_MODULES = ("inspect", "typing", "argparse", "dataclasses")


def stdlib_text(module: str = "inspect") -> str:
    """Source text of a standard-library module (e.g. "inspect" -> .../lib/python3.12/inspect.py)."""
    path = Path(sysconfig.get_paths()["stdlib"]) / f"{module.replace('.', os.sep)}.py"
    if not path.exists():
        raise FileNotFoundError(f"no standard-library module {module!r} at {path}")
    return path.read_text(encoding="utf-8", errors="replace")


def long_prompts(tokenizer, n_tokens: int, count: int = 1, *, sources=None, texts=None) -> list[list[int]]:
    """`count` prompts of exactly `n_tokens` tokens each, cut from real text (stdlib code by default, or
    `texts`); prompt i starts at a different offset so a batch is not `count` copies of one sequence."""
    texts = list(texts) if texts else [stdlib_text(m) for m in (sources or DEFAULT_STDLIB_MODULES)]
    ids: list[int] = []
    for t in texts:
        ids.extend(tokenizer.encode(t, add_special_tokens=False))
    if len(ids) < n_tokens:
        raise ValueError(f"the prompt source has {len(ids)} tokens, fewer than the {n_tokens} asked for")
    span = len(ids) - n_tokens
    return [ids[(i * 997) % (span + 1):][:n_tokens] for i in range(count)]


def read_dir(path: str, exts=(".txt", ".py", ".md", ".rst")) -> list[str]:
    """Every text file under `path` with one of `exts`, sorted by name."""
    files = sorted(p for p in Path(path).rglob("*") if p.is_file() and p.suffix in exts)
    if not files:
        raise FileNotFoundError(f"no text files ({', '.join(exts)}) under {path}")
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]
