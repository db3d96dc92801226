"""Training text for the drafter: any folder of text files (or the stdlib), tokenized with the target's
tokenizer, packed into fixed-length chunks, batched by a stateless function of (seed, step) so a resumed run
draws exactly the batches an uninterrupted one would.
"""
from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from typing import Optional, Sequence

import numpy as np

from jspec import data as _data

_PIECE_CHARS = 1 << 16   # texts are cut at newlines into ~64K-char pieces for batched (parallel) tokenization


def source_texts(data_dir: Optional[str], *, stdlib_modules: Optional[Sequence[str]] = None) -> tuple[list[str], str]:
    """(texts, description). `data_dir` None: the whole Python stdlib (.py files; present on every machine),
    or only `stdlib_modules` (via jspec.data.stdlib_text) when given."""
    if data_dir:
        return _data.read_dir(data_dir), os.path.abspath(data_dir)
    if stdlib_modules:
        return [_data.stdlib_text(m) for m in stdlib_modules], "stdlib:" + ",".join(stdlib_modules)
    root = sysconfig.get_paths()["stdlib"]
    return _data.read_dir(root, exts=(".py",)), f"stdlib:{root}"


def tokenize(texts: Sequence[str], tokenizer, *, sep: Optional[int]) -> np.ndarray:
    """One int32 stream: every text's tokens, `sep` (the EOS id, if any) between documents."""
    pieces, owners = [], []
    for i, t in enumerate(texts):
        for p in _split(t):
            pieces.append(p)
            owners.append(i)
    if callable(tokenizer):   # Hugging Face tokenizers: one batched call runs on every core
        ids = tokenizer(pieces, add_special_tokens=False)["input_ids"]
    else:
        ids = [tokenizer.encode(p, add_special_tokens=False) for p in pieces]
    out: list[int] = []
    for k, (piece_ids, owner) in enumerate(zip(ids, owners)):
        out.extend(piece_ids)
        last_of_doc = k + 1 == len(owners) or owners[k + 1] != owner
        if last_of_doc and sep is not None:
            out.append(int(sep))
    return np.asarray(out, np.int32)


def _split(text: str) -> list[str]:
    parts, start = [], 0
    while start < len(text):
        end = start + _PIECE_CHARS
        if end < len(text):
            nl = text.rfind("\n", start, end)
            end = nl + 1 if nl > start else end
        parts.append(text[start:end])
        start = end
    return parts


def cached_stream(texts: Sequence[str], tokenizer, *, sep: Optional[int], cache_dir: Optional[str],
                  tag: str) -> np.ndarray:
    """`tokenize`, memoised in cache_dir/tokens-<hash>.npy (keyed by the texts and `tag`, e.g. the model):
    tokenizing a large folder is minutes on one core, and a resumed run should not pay it twice."""
    if cache_dir is None:
        return tokenize(texts, tokenizer, sep=sep)
    h = hashlib.sha256(json.dumps([tag, sep]).encode())
    for t in texts:
        h.update(hashlib.sha256(t.encode("utf-8", "replace")).digest())
    path = os.path.join(cache_dir, f"tokens-{h.hexdigest()[:16]}.npy")
    if os.path.isfile(path):
        return np.load(path)
    ids = tokenize(texts, tokenizer, sep=sep)
    os.makedirs(cache_dir, exist_ok=True)
    tmp = path + ".tmp.npy"
    np.save(tmp, ids)
    os.replace(tmp, path)
    return ids


def pack(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """int32[n_chunks, seq_len]: consecutive non-overlapping chunks (the tail shorter than seq_len dropped)."""
    n = len(stream) // seq_len
    if n == 0:
        raise ValueError(f"the training text has {len(stream)} tokens, fewer than one {seq_len=} chunk")
    return np.asarray(stream[: n * seq_len], np.int32).reshape(n, seq_len)


def split_eval(chunks: np.ndarray, n_eval: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, eval): the last n_eval chunks are held out (0 = none), never fewer than one training chunk."""
    n_eval = min(n_eval, len(chunks) - 1)
    if n_eval <= 0:
        return chunks, chunks[:0]
    return chunks[:-n_eval], chunks[-n_eval:]


def batch_rows(n_chunks: int, batch: int, step: int, seed: int) -> np.ndarray:
    """Chunk indices of `step`'s batch: epochs are seeded permutations of all chunks, read in order, so
    every chunk is seen once per epoch and the result depends only on (seed, step)."""
    g = step * batch + np.arange(batch)
    epochs, within = g // n_chunks, g % n_chunks
    perms = {int(e): np.random.default_rng([seed, int(e), 0xD5]).permutation(n_chunks) for e in np.unique(epochs)}
    return np.array([perms[int(e)][int(i)] for e, i in zip(epochs, within)], np.int64)
