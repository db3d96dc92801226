"""The user's surface on the real default model: generate, chat, and every bad input's clear error."""
import json
import os
import subprocess
import sys

import pytest

import jspec
from jspec import cli


@pytest.fixture(scope="module")
def smol(smollm2_ckpt):
    return jspec.load(smollm2_ckpt)


def test_generate_greedy_ragged_batch_is_per_sequence(smol):
    prompts = ["The capital of France is", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"]
    both = jspec.generate(smol, prompts, max_new_tokens=12)
    for i, p in enumerate(prompts):
        alone = jspec.generate(smol, [p], max_new_tokens=12)
        assert both.tokens[i] == alone.tokens[0]
    assert both.stats.batch == 2 and both.stats.tokens_per_s > 0
    assert all(1 <= n <= 12 for n in both.stats.new_tokens)
    assert isinstance(both.texts[1], str) and both.texts[1]


def test_chat_template_and_stop_token(smol):
    out = jspec.generate(smol, "What is 2+2? Answer with one word.", chat=True, max_new_tokens=48)
    toks = out.tokens[0]
    # An instruct model answers and ends its turn (this prompt's greedy answer is 7 tokens): the stop token is
    # kept and nothing follows it.
    assert len(toks) < 48 and toks[-1] in smol.stop_tokens and sum(t in smol.stop_tokens for t in toks) == 1
    assert out.texts[0].strip()


def test_sampling_is_seeded(smol):
    """The same seed gives the same tokens; other seeds give other tokens (a sampler that ignored the seed,
    or the temperature, would pass the first check alone)."""
    kw = dict(max_new_tokens=10, temperature=0.9, top_p=0.95, top_k=50)
    a = jspec.generate(smol, "Once upon a time", seed=1, **kw).tokens
    b = jspec.generate(smol, "Once upon a time", seed=1, **kw).tokens
    assert a == b
    others = [jspec.generate(smol, "Once upon a time", seed=s, **kw).tokens for s in (2, 3)]
    assert all(o != a for o in others) and others[0] != others[1], (a, others)


def test_bad_inputs_give_clear_errors(smol):
    with pytest.raises(jspec.InputError, match="empty"):
        jspec.generate(smol, [""], max_new_tokens=4)
    with pytest.raises(jspec.InputError, match="cache holds 64"):
        jspec.generate(smol, "word " * 100, max_new_tokens=8, capacity=64)
    with pytest.raises(jspec.InputError, match="context of 8192"):
        jspec.generate(smol, [[5] * 8190], max_new_tokens=8)
    with pytest.raises(jspec.InputError, match="unknown method"):
        jspec.generate(smol, "hi", method="nope")
    with pytest.raises(jspec.InputError, match=r"\[0, 49152\)"):
        jspec.generate(smol, [[1, 2, 99999]], max_new_tokens=2)


def test_cli_reports_errors_without_a_trace(tmp_path, capsys):
    rc = cli.main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error:") and "Traceback" not in err
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    rc = cli.main(["convert", "--from-gguf", str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error:")
    assert not os.path.exists(tmp_path / "out")
    assert [p for p in os.listdir(tmp_path) if p not in ("bad.gguf",)] == []


def test_cli_generate_json(smollm2_ckpt, capsys):
    rc = cli.main(["generate", "--model", smollm2_ckpt, "--prompt", "Hello", "--max-new-tokens", "5", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(out["tokens"][0]) == 5 or out["tokens"][0][-1] in (2,)
    assert out["stats"]["method"] == "ar"


def test_generate_longspec_with_the_bundled_drafter(smollm2_ckpt):
    """`generate(method="longspec")` finds the committed drafter and, in float32, emits plain greedy's tokens:
    trees alone and with a prompt-lookup chain, on a prompt that repeats itself (one prompt, so ar's programs
    compile once)."""
    m = jspec.load(smollm2_ckpt, dtype="float32")
    prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n" * 6
    ar = jspec.generate(m, prompt, max_new_tokens=24, ignore_eos=True)
    ls = jspec.generate(m, prompt, method="longspec", max_new_tokens=24, ignore_eos=True,
                        tree_widths=(2, 4, 4))
    assert ls.tokens == ar.tokens
    assert ls.stats.method == "longspec" and 1.0 <= ls.stats.tau <= 4.0
    assert ls.stats.knobs["tree_widths"] == (2, 4, 4) or list(ls.stats.knobs["tree_widths"]) == [2, 4, 4]
    assert ls.stats.knobs["lookup"] == 0
    lk = jspec.generate(m, prompt, method="longspec", max_new_tokens=24, ignore_eos=True, tree_widths=(2, 4, 4),
                        lookup=6)
    assert lk.tokens == ar.tokens and lk.stats.knobs["lookup"] == 6
    assert lk.stats.accept_hist[4:] and sum(lk.stats.accept_hist[4:]) >= 1, lk.stats.accept_hist  # past depth 3


def test_cli_lookup_flag(smollm2_ckpt, capsys, monkeypatch):
    """--lookup N reaches `generate` and the SpecConfig it runs, for LongSpec and vegas (that generate records it
    in Stats.knobs is test_generate_longspec_with_the_bundled_drafter's); with plain decoding it is a clear
    error. `generate` is replaced by a recorder: what it does with the knobs is tested through the API."""
    class Called(Exception):
        pass

    calls = []

    def record(model, prompts, **kw):
        calls.append(kw)
        raise Called

    monkeypatch.setattr(jspec, "generate", record)
    for method, n in (("longspec", 4), ("vegas", 3)):
        with pytest.raises(Called):
            cli.main(["generate", "--model", smollm2_ckpt, "--method", method, "--lookup", str(n), "--prompt",
                      "one two three one two three one two", "--max-new-tokens", "6", "--json"])
        kw = calls[-1]
        assert kw["method"] == method and kw["lookup"] == n, kw
        spec = jspec.api.spec_config(kw["method"], kw["config"], lookup=kw["lookup"])
        assert spec.method == method and spec.lookup == n
    rc = cli.main(["generate", "--model", smollm2_ckpt, "--prompt", "hi", "--lookup", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and "--lookup" in err and "Traceback" not in err, err
    assert len(calls) == 2


def test_longspec_drafter_errors(smol, tmp_path, capsys):
    import dataclasses

    from jspec.drafter import Drafter
    with pytest.raises(jspec.InputError, match="does not exist"):
        jspec.generate(smol, "hi", method="longspec", drafter=str(tmp_path / "none"), max_new_tokens=4)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "config.json").write_text("{not json")
    with pytest.raises(jspec.InputError, match="cannot read the drafter"):
        jspec.generate(smol, "hi", method="longspec", drafter=str(tmp_path / "junk"), max_new_tokens=4)
    other = Drafter(params={}, cfg=dataclasses.replace(smol.cfg, d_model=64), window=512, meta={})
    with pytest.raises(jspec.InputError, match="another model"):
        jspec.generate(smol, "hi", method="longspec", drafter=other, max_new_tokens=4)
    rc = cli.main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "hi", "--drafter", "x"])
    err = capsys.readouterr().err
    assert rc == 2 and "--drafter only applies" in err and "Traceback" not in err


def test_load_hands_out_the_fused_layout(smollm2_ckpt):
    """jspec.load hands out the one runtime layout (the stored checkpoint's weights fused); forward refuses the
    stored layout with an InputError that says how to convert it."""
    import jax
    import jax.numpy as jnp

    from jspec import checkpoints, kv_cache, model
    m = jspec.load(smollm2_ckpt, dtype="float32")
    assert {"wqkv", "w_gu"} <= set(m.params["layers"]) and "wq" not in m.params["layers"]
    stored, _ = checkpoints.load(smollm2_ckpt, dtype="float32")
    assert {"wq", "wk", "wv", "w_gate", "w_up"} <= set(stored["layers"]) and "wqkv" not in stored["layers"]
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), model.fuse_projections(stored, m.cfg),
                                     m.params))
    toks = jnp.asarray([jspec.encode(m, "def fibonacci(n):\n    return")[0]], jnp.int32)
    with pytest.raises(jspec.InputError, match="fuse_projections"):
        model.forward(stored, m.cfg, toks, kv_cache.init(m.cfg, batch=1, capacity=32))


@pytest.mark.parametrize("user_flags, before, expect", [
    ("", False, "--xla_gpu_enable_triton_gemm=false"),                        # jspec's default added
    ("--xla_dump_to=/tmp/x", False, "--xla_dump_to=/tmp/x --xla_gpu_enable_triton_gemm=false"),
    ("--xla_gpu_enable_triton_gemm=true", False, "--xla_gpu_enable_triton_gemm=true"),   # the user's choice kept
    ("", True, ""),                       # JAX already started: too late to change flags, so none are added
])
def test_import_prefers_cublas_gemms_unless_told(user_flags, before, expect):
    code = ("import os, jax\n"
            + ("jax.numpy.zeros(1).block_until_ready()\n" if before else "")
            + "import jspec\nprint(repr(os.environ.get('XLA_FLAGS', '')))")
    env = dict(os.environ, XLA_FLAGS=user_flags, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repr(expect)
