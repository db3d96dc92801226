"""`jspec selfgen`: the target's own continuations of windows of a text folder (drafter training text)."""
import json
import os

import numpy as np
import pytest

import jspec
from jspec import cli, data
from jspec.errors import InputError
from jspec.offline.training_text import tokenize
from jspec.offline.selfgen import self_generate

from conftest import CharTokenizer, runtime_params, tiny_config


@pytest.fixture(scope="module")
def tiny():
    cfg = tiny_config("llama")
    params = runtime_params(cfg, seed=3)
    return jspec.Model(params=params, cfg=cfg, tokenizer=CharTokenizer(), path="tiny")


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "text"
    d.mkdir()
    (d / "a.txt").write_text("The quick brown fox jumps over the lazy dog. " * 6)
    (d / "b.py").write_text("def f(x):\n    return x * 2 + 1\n" * 5)
    return d


def test_rows_are_source_windows_continued_by_the_target(tiny, folder, tmp_path):
    """Each file = a contiguous window of the tokenized folder + the target's own continuation (greedy here,
    so it must equal plain generate on that window)."""
    out = tmp_path / "gen"
    s = self_generate(tiny, str(folder), str(out), prompt_tokens=12, new_tokens=6, batch=3, temperature=0.0,
                      max_batches=2, budget_s=1e9, progress=False)
    assert s["batches"] == 2 and s["rows"] == 6 and s["source_tokens"] > 12
    files = sorted(p for p in os.listdir(out) if p.endswith(".txt"))
    assert files == [f"selfgen-{b:05d}-{r:03d}.txt" for b in range(2) for r in range(3)]
    assert json.load(open(out / "selfgen_summary.json"))["rows"] == 6
    stream = tokenize(data.read_dir(str(folder)), tiny.tokenizer, sep=None).tolist()
    windows = {tuple(stream[i:i + 12]) for i in range(len(stream) - 11)}
    for name in files:
        ids = [int(x) for x in (out / name).read_text().split()]   # CharTokenizer decodes to the ids
        prompt, cont = ids[:12], ids[12:]
        assert tuple(prompt) in windows and len(cont) == 6
        ref = jspec.generate(tiny, [prompt], max_new_tokens=6, ignore_eos=True).tokens[0]
        assert cont == list(ref)
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


def test_budget_seed_and_errors(tiny, folder, tmp_path):
    a = self_generate(tiny, str(folder), str(tmp_path / "a"), prompt_tokens=8, new_tokens=4, batch=2,
                      max_batches=1, seed=7, progress=False)
    b = self_generate(tiny, str(folder), str(tmp_path / "b"), prompt_tokens=8, new_tokens=4, batch=2,
                      max_batches=1, seed=7, progress=False)
    assert a["rows"] == b["rows"] == 2
    for r in range(2):   # same seed: same windows and the same sampled continuations
        name = f"selfgen-00000-{r:03d}.txt"
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    # a budget already spent after the first batch: exactly one batch, then stop
    c = self_generate(tiny, str(folder), str(tmp_path / "c"), prompt_tokens=8, new_tokens=4, batch=2,
                      budget_s=0.0, progress=False)
    assert c["batches"] == 1
    with pytest.raises(InputError, match="fewer than prompt_tokens"):
        self_generate(tiny, str(folder), str(tmp_path / "d"), prompt_tokens=10**6, progress=False)
    with pytest.raises(InputError, match="must be >= 1"):
        self_generate(tiny, str(folder), str(tmp_path / "d"), batch=0, progress=False)


def test_cli_errors_are_one_line(tmp_path, capsys, monkeypatch, tiny):
    monkeypatch.setattr(jspec.api, "load", lambda name: tiny)
    rc = cli.main(["selfgen", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error:") and "Traceback" not in err
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "x.txt").write_text("abc")
    rc = cli.main(["selfgen", "--data", str(tmp_path / "t"), "--out", str(tmp_path / "o"), "--prompt-tokens", "64"])
    err = capsys.readouterr().err
    assert rc == 2 and "fewer than prompt_tokens" in err
