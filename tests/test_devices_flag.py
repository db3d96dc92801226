"""`jspec generate --devices N` (tensor parallelism, jspec/sharding.py) on 4 virtual CPU devices.

XLA_FLAGS=--xla_force_host_platform_device_count must be set before jax is first imported, so the checks run
once in a fresh process: this file run as a script (the `__main__` block below) writes a tiny float32
checkpoint (N=4 query heads, K=2 KV heads, F=96; a word-level tokenizer), runs the CLI in-process and prints
one JSON report on its last stdout line. The tests assert on that report:

- greedy tokens with --devices 2 equal those with --devices 1, for plain decoding and for vegas;
- the loaded params really are head-sharded over a 2-device mesh;
- --devices 4 (K=2 not divisible) and --devices 8 (only 4 devices) fail with one "error:" line naming the
  numbers, exit status 2, no traceback.
"""
import json
import os
import subprocess
import sys

import pytest

PROMPT = " ".join(f"w{3 + (7 * i) % 120}" for i in range(30))   # 30 word tokens, ids 3..122
NEW = "10"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("devices")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(out)], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_devices_match_one(report):
    runs = report["runs"]
    for method in ("ar", "vegas"):
        one, two = runs[f"{method}-1"], runs[f"{method}-2"]
        assert len(one["tokens"]) == 2 and all(len(t) == int(NEW) for t in one["tokens"])
        assert two["tokens"] == one["tokens"], method
        assert one["stats"]["method"] == two["stats"]["method"] == method
    assert runs["vegas-2"]["stats"]["knobs"]["budget"] == 8


def test_params_are_sharded(report):
    s = report["sharding"]
    assert s["mesh"] == {"tp": 2}
    # jspec.load hands out the fused runtime layout (model.fuse_projections), sharded on its K / F axis.
    assert s["wqkv"] == "(None, None, 'tp')" and s["w_gu"] == "(None, None, None, 'tp')"
    assert s["wqkv_shard"][2:4] == [1, 4]     # [L, D, K/tp, G+2, H]: 2 KV heads -> 1 per device, G = 2


def test_errors(report):
    e = report["errors"]
    heads, many, zero = e["4"], e["8"], e["0"]
    assert heads["rc"] == many["rc"] == zero["rc"] == 2
    for x in (heads, many, zero):
        assert x["err"].startswith("error: ") and "Traceback" not in x["err"], x["err"]
        assert len(x["err"].strip().splitlines()) == 1
    assert "tp=4" in heads["err"] and "n_kv_heads=2" in heads["err"] and "[1, 2]" in heads["err"]
    assert "n_devices=8" in many["err"] and "only 4" in many["err"]
    assert "n_devices=0" in zero["err"]


# ------------------------------------------------------------------------------------------------ worker

def _tokenizer(path):
    """A word-level tokenizer "w3".."w127" (+ <unk>, <s>, </s>) that AutoTokenizer can load."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 128)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
                   "eos_token": "</s>"}, f)
    return path


def _worker(out_dir):
    import contextlib
    import io

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import jax
    from jspec.checkpoints import save
    from conftest import random_params, tiny_config

    import jspec
    from jspec import cli

    assert jax.device_count() == 4, jax.devices()
    cfg = tiny_config("llama", dtype="float32")           # N=4, K=2, F=96, vocab 128
    ckpt = save(os.path.join(out_dir, "ckpt"), random_params(cfg, seed=3), cfg,
                tokenizer_src=_tokenizer(os.path.join(out_dir, "tok")))

    def run(*args):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["generate", "--model", ckpt, "--prompt", PROMPT, "--batch", "2", "--max-new-tokens",
                           NEW, "--ignore-eos", "--json", *args])
        return rc, out.getvalue(), err.getvalue()

    report = {"runs": {}, "errors": {}}
    for method, extra in (("ar", []), ("vegas", ["--gamma", "3", "--budget", "8", "--min-tokens", "4"])):
        for n in ("1", "2"):
            rc, out, err = run("--method", method, "--devices", n, *extra)
            assert rc == 0, err
            report["runs"][f"{method}-{n}"] = json.loads(out.strip().splitlines()[-1])
    for n in ("4", "8", "0"):
        rc, _, err = run("--devices", n)
        report["errors"][n] = {"rc": rc, "err": err}
    m = jspec.load(ckpt, devices=2)
    wqkv, w_gu = m.params["layers"]["wqkv"], m.params["layers"]["w_gu"]
    report["sharding"] = {"mesh": dict(m.mesh.shape), "wqkv": _spec(wqkv), "w_gu": _spec(w_gu),
                          "wqkv_shard": list(wqkv.addressable_shards[0].data.shape)}
    print(json.dumps(report))


def _spec(a):
    parts = list(a.sharding.spec)
    while parts and parts[-1] is None:
        parts.pop()
    return str(tuple(parts))


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    _worker(sys.argv[1])
