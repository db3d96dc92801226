"""The command line's usage errors: one style (`error: ...` on stderr, no traceback), one exit code (2), and
found before the model loads (no model is loaded here: `jspec.load` fails the test if reached)."""
import os
import re
import subprocess
import sys

import jax
import pytest

import jspec
from conftest import CharTokenizer
from jspec import cli, model
from jspec.config import ModelConfig


@pytest.fixture
def no_load(monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was found")

    monkeypatch.setattr(jspec, "load", load)


def usage_error(capsys, argv) -> str:
    """Run the CLI, check it failed as a usage error, return its stderr."""
    rc = cli.main(argv)
    captured = capsys.readouterr()
    assert rc == 2, (rc, captured.err)
    assert captured.err.startswith("error: ") and "Traceback" not in captured.err, captured.err
    assert captured.out == ""
    return captured.err


@pytest.mark.parametrize("argv,says", [
    (["--batch", "0"], "--batch 0 must be >= 1"),
    (["--batch", "-2"], "--batch -2 must be >= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0 must be >= 1"),
    (["--max-new-tokens", "-5"], "--max-new-tokens -5 must be >= 1"),
    (["--prompt-tokens", "0"], "--prompt-tokens 0 must be >= 1"),
    (["--slots", "0"], "--slots 0 must be >= 1"),
    (["--slots", "2", "--refill", "0"], "--refill 0 must be >= 1"),
    (["--refill", "2"], "refill and staged apply to continuous batching only: --refill and --staged need --slots N"),
    (["--temperature", "-1"], "--temperature -1.0 must be >= 0"),
    (["--temperature", "nan"], "--temperature nan must be >= 0"),
    (["--top-k", "-1"], "--top-k -1 must be >= 0"),
    (["--top-p", "0"], "--top-p 0.0 must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p 1.5 must be in (0, 1]"),
    (["--method", "vegas", "--widths", "4,x"], "--widths '4,x' must be comma-separated integers"),
])
def test_generate_bad_numbers(no_load, capsys, argv, says):
    err = usage_error(capsys, ["generate", "--prompt", "hi"] + argv)
    assert says in err and "self." not in err and "concatenate" not in err


@pytest.mark.parametrize("argv,flags", [
    (["--method", "ar", "--gamma", "4"], "--gamma only applies"),
    (["--method", "ar", "--budget", "64"], "--budget only applies"),
    (["--method", "ar", "--ratio", "0.1"], "--ratio only applies"),
    (["--method", "ar", "--gamma", "4", "--lookup", "2"], "--gamma, --lookup only apply"),
    (["--method", "ar", "--widths", "2,2"], "--widths only applies"),
    (["--gamma", "4"], "--gamma only applies"),   # no --method: ar
])
def test_speculative_flags_with_ar_are_an_error(no_load, capsys, argv, flags):
    err = usage_error(capsys, ["generate", "--prompt", "hi"] + argv)
    assert flags in err and "speculative methods (streaming, quest, vegas, longspec), not ar" in err
    assert ("without --method" in err) == ("--method" not in argv)


@pytest.mark.parametrize("argv,says", [
    (["--method", "vegas", "--sink", "4"],
     "--sink is a streaming option; --method vegas takes --select-page, --score-mode, --collect, --topk"),
    (["--method", "streaming", "--select-page", "4"], "--select-page is a vegas option; --method streaming takes --sink"),
    (["--method", "longspec", "--sink", "4"], "--sink is a streaming option; --method longspec takes --mode, --widths"),
    (["--method", "longspec", "--budget", "64", "--ratio", "0.1"],
     "--budget, --ratio only apply to the sparse drafts of streaming, quest and vegas; --method longspec drafts"),
])
def test_another_methods_flag_is_named_as_a_flag(no_load, capsys, argv, says):
    err = usage_error(capsys, ["generate", "--prompt", "hi"] + argv)
    assert says in err, err


def tiny_model():
    cfg = ModelConfig(arch="llama", vocab_size=96, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16,
                      ffn_dim=48, dtype="float32", max_position=256, eos_token_ids=())
    return jspec.Model(params=model.init_params(cfg, jax.random.key(0)), cfg=cfg, tokenizer=CharTokenizer(),
                       path="tiny")


def test_python_api_rejects_the_same_inputs():
    m = tiny_model()
    for kw in (dict(gamma=4), dict(budget=64), dict(ratio=0.1), dict(lookup=2)):
        with pytest.raises(jspec.InputError, match=re.escape(f"{sorted(kw)} only apply to speculative methods")):
            jspec.generate(m, "hi", method="ar", **kw)
        with pytest.raises(jspec.InputError, match="only apply to speculative methods"):
            jspec.generate(m, "hi", **kw)   # no method: ar
    with pytest.raises(jspec.InputError, match="no prompts given"):
        jspec.generate(m, [], max_new_tokens=4)
    with pytest.raises(jspec.InputError, match="max_new_tokens=0 must be >= 1"):
        jspec.generate(m, "hi", max_new_tokens=0)
    for kw, says in ((dict(temperature=-1.0), r"temperature=-1.0 must be >= 0"),
                     (dict(top_k=-1), r"top_k=-1 must be >= 0"),
                     (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]")):
        with pytest.raises(jspec.InputError, match=says):
            jspec.generate(m, "hi", max_new_tokens=4, **kw)
    # The config file's knobs are no explicit knobs: "ar" with a config runs plain decoding.
    assert jspec.api.spec_config("ar", {"method": "vegas", "gamma": 3}) is None


def test_bad_files_and_dirs(no_load, capsys, tmp_path):
    err = usage_error(capsys, ["generate", "--prompt-file", str(tmp_path / "missing.txt")])
    assert "--prompt-file" in err and "no such file" in err
    err = usage_error(capsys, ["generate", "--prompt-file", str(tmp_path)])
    assert "is a directory" in err
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\xfa")
    assert "not UTF-8 text" in usage_error(capsys, ["generate", "--prompt-file", str(tmp_path / "bin.txt")])
    err = usage_error(capsys, ["generate", "--prompt", "hi", "--config", str(tmp_path / "missing.json")])
    assert "does not exist" in err
    err = usage_error(capsys, ["tune", "--prompt-file", str(tmp_path / "missing.txt")])
    assert "--prompt-file" in err
    assert "--prompt-dir" in usage_error(capsys, ["tune", "--prompt-dir", str(tmp_path / "none")])
    assert "cannot be tuned" in usage_error(capsys, ["tune", "--method", "ar"])
    assert "--batch 0 must be >= 1" in usage_error(capsys, ["tune", "--batch", "0"])
    assert "--reps 0 must be >= 1" in usage_error(capsys, ["tune", "--reps", "0"])


def test_bad_model_dirs(capsys, tmp_path):
    """Checked by the checkpoint reader before any weight is read."""
    (tmp_path / "empty").mkdir()
    assert "no config.json" in usage_error(capsys, ["generate", "--model", str(tmp_path / "empty"), "--prompt", "hi"])
    (tmp_path / "file").write_text("x")
    assert "unknown model" in usage_error(capsys, ["generate", "--model", str(tmp_path / "file"), "--prompt", "hi"])
    err = usage_error(capsys, ["generate", "--model", "model.gguf", "--prompt", "hi"])
    assert "convert it first: `jspec convert --from-gguf model.gguf" in err and "Create a directory" not in err


def test_convert_needs_exactly_one_source(capsys, tmp_path):
    out = str(tmp_path / "out")
    err = usage_error(capsys, ["convert", "--out", out])
    assert "give exactly one of --from-hf DIR or --from-gguf FILE" in err
    usage_error(capsys, ["convert", "--out", out, "--from-hf", str(tmp_path), "--from-gguf", "x.gguf"])
    assert not os.path.exists(out)


def test_import_prints_no_pytorch_notice():
    """transformers (for the tokenizers) announces that PyTorch was not found; jspec drops that notice only."""
    code = ("import jspec, transformers\n"
            "from transformers import AutoTokenizer\n"
            "transformers.logging.get_logger('transformers').warning('a real warning')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(jspec.__file__))]
                                                      + sys.path))
    env.pop("TRANSFORMERS_VERBOSITY", None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "PyTorch was not found" not in res.stderr, res.stderr
    assert "a real warning" in res.stderr


HIDDEN = ("--score-mode", "--collect", "--topk", "--verify-m", "--verify-signals", "--staged")


def test_ablations_leave_the_main_help_and_help_all_lists_them(capsys):
    """`generate --help` lists the method knobs but not the ablations / implementation settings; `--help-all`
    lists both; a hidden flag still parses (it reaches the same checks as any flag)."""
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--help"])
    assert e.value.code == 0
    main_help = capsys.readouterr().out
    for flag in ("--gamma", "--select-page", "--lookup", "--verify-budget", "--help-all"):
        assert flag in main_help, flag
    for flag in HIDDEN:
        assert flag not in main_help, flag
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--help-all"])
    assert e.value.code == 0
    full = capsys.readouterr().out
    for flag in HIDDEN + ("--gamma", "--select-page"):
        assert flag in full, flag
    assert "ablations and implementation settings" in full


def test_hidden_flags_still_parse(no_load, capsys):
    err = usage_error(capsys, ["generate", "--prompt", "hi", "--method", "ar", "--topk", "sort"])
    assert "--topk only applies to the speculative methods" in err
