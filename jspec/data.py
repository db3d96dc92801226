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


def dir_prompts(path: str, tokenizer, n_tokens: int, count: int,
                exts=(".txt", ".py", ".md", ".rst")) -> list[list[int]]:
    """`count` prompts of exactly `n_tokens` tokens from the text files under `path`, rows taking turns over
    the files in name order (row i from file i % n; only the first `count` files when there are more), as the
    benchmarks alternate code and prose rows; the k-th row cut from one file starts k * 997 tokens further in
    (wrapping), so a file used twice gives two prompts. Raises FileNotFoundError for a folder without text
    files and ValueError naming files shorter than `n_tokens` tokens."""
    files = _text_files(path, exts)[:count]     # only the files some row is cut from
    ids = [tokenizer.encode(p.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)
           for p in files]
    short = [f"{p.name} ({len(t)})" for p, t in zip(files, ids) if len(t) < n_tokens]
    if short:
        raise ValueError(f"prompt files shorter than {n_tokens} tokens under {path}: {', '.join(short)}; "
                         f"use fewer prompt tokens or longer files")
    rows = []
    for i in range(count):
        t = ids[i % len(files)]
        start = (i // len(files) * 997) % (len(t) - n_tokens + 1)
        rows.append(list(t[start:start + n_tokens]))
    return rows


def read_dir(path: str, exts=(".txt", ".py", ".md", ".rst")) -> list[str]:
    """Every text file under `path` with one of `exts`, sorted by name."""
    return [p.read_text(encoding="utf-8", errors="replace") for p in _text_files(path, exts)]


def _text_files(path: str, exts) -> list[Path]:
    """The files under `path` (recursively) with one of `exts`, sorted; FileNotFoundError when there are none
    (or `path` is not a folder)."""
    files = sorted(p for p in Path(path).rglob("*") if p.is_file() and p.suffix in exts) if Path(path).is_dir() \
        else []
    if not files:
        raise FileNotFoundError(f"no text files ({', '.join(exts)}) under {path}")
    return files
