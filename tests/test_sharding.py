"""Tensor parallelism (jspec/sharding.py) on 8 virtual CPU devices.

The checks run once in a subprocess (tests/_sharding_worker.py): XLA_FLAGS=--xla_force_host_platform_device_count
must be set before jax is first imported, and this process may already have imported it. The tests below
assert on the worker's JSON report:

- greedy prefill + decode on head-sharded params and cache is token-identical to the unsharded run (llama and
  qwen2, f32 and bf16, tp = 2 and 4; N=8, K=4), and so is greedy vegas (bf16, tp=2), also served through 2 slots
  with refills (`speculative.serve(mesh=...)`, waiting and staged);
- the params and the cache after decode carry exactly the shardings asked for;
- the Pallas kernels under `AttnImpl(mesh=...)` (shard_map per head shard, interpret mode, head_dim 64)
  match the unsharded XLA path, scores summed over the shards included;
- an indivisible head count and more devices than exist fail with messages that name the numbers.
"""
import json
import os
import subprocess
import sys

import jax
import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sharding_worker.py")


@pytest.fixture(scope="module")
def report():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, WORKER], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_greedy_sharded_matches_unsharded(report):
    cases = report["greedy"]
    assert {(c["arch"], c["dtype"], c["tp"]) for c in cases} >= {("llama", "float32", 2), ("llama", "bfloat16", 4),
                                                                ("qwen2", "float32", 4), ("qwen2", "bfloat16", 2)}
    for c in cases:
        assert c["same"], f"{c['arch']} {c['dtype']} tp={c['tp']}:\nref {c['ref']}\ngot {c['got']}"


def test_param_shardings_as_asked(report):
    got = report["specs"]["params"]
    want = {
        "['embed']": "()", "['final_norm']": "()", "['lm_head']": "(None, 'tp')",
        "['layers']['attn_norm']": "()", "['layers']['mlp_norm']": "()",
        "['layers']['wqkv']": "(None, None, 'tp')", "['layers']['wo']": "(None, 'tp')",
        "['layers']['bq']": "(None, 'tp')", "['layers']['bk']": "(None, 'tp')", "['layers']['bv']": "(None, 'tp')",
        "['layers']['w_gu']": "(None, None, None, 'tp')",
        "['layers']['w_down']": "(None, 'tp')",
    }
    assert set(got) == set(want)
    for path, (actual, asked, equivalent) in got.items():
        assert actual == asked == want[path] and equivalent, (path, actual, asked)


def test_param_specs_of_both_layouts():
    """The fused runtime layout by default (init_params, jspec.load); `stored=True` the checkpoint layout, whose
    separate projections shard on the same heads / F axis."""
    from jax.sharding import PartitionSpec as P

    from jspec import model, sharding
    from jspec.config import ModelConfig
    cfg = ModelConfig(arch="qwen2", vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                      ffn_dim=96, rope_theta=10000.0, dtype="float32", max_position=256)
    for stored in (False, True):
        specs = sharding.param_specs(cfg, "tp", 2, stored=stored)
        shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0), stored=stored))
        assert jax.tree.structure(specs, is_leaf=lambda x: isinstance(x, P)) == jax.tree.structure(shapes)
    fused, stored = (sharding.param_specs(cfg, "tp", 2, stored=s)["layers"] for s in (False, True))
    assert fused["wqkv"] == P(None, None, "tp", None, None) and fused["w_gu"] == P(None, None, None, "tp")
    assert stored["wq"] == stored["wk"] == P(None, None, "tp", None) and stored["w_up"] == P(None, None, "tp")


def test_cache_sharding_survives_prefill_and_decode(report):
    s = report["specs"]
    # P(None, None, None, 'tp', None) with the trailing None dropped: K heads on tp, lengths replicated.
    assert s["cache_k"] == s["cache_v"] == "(None, None, None, 'tp')"
    assert s["lengths"] == "()"
    assert s["cache_equiv"]
    assert s["cache_shard_shape"] == [2, 3, 64, 1, 16]   # [L, B, S, K/tp, H] at tp=4, K=4
    assert s["logits"] == "(None, 'tp')"                 # vocab-parallel lm_head


def test_pallas_kernels_per_shard(report):
    p = report["pallas"]
    for name in ("prefill", "decode", "verify", "scores", "tree", "sparse"):
        assert p[name] < 2e-4, (name, p[name])
    assert p["cache_k"] == "(None, None, None, 'tp')"


def test_vegas_greedy_sharded_matches_unsharded(report):
    v = report["vegas"]
    if isinstance(v, str):
        pytest.skip(v)
    for c in v:
        assert c["same"], c
        assert c["cache_k"] == "(None, None, None, 'tp')"


def test_serve_sharded_matches_unsharded(report):
    runs = report["serve"]
    assert [r["staged"] for r in runs] == [False, True, "generate"]   # serve twice, then jspec.generate(slots=2)
    for r in runs:
        assert r["same"], r
        # The first 2 slots, then the third prompt (its own prefill, or the staged batch of one): every
        # prefill made a head-sharded cache.
        assert r["prefills"] >= 2 and r["cache_k"] == ["(None, None, None, 'tp')"], r


def test_errors_name_the_numbers(report):
    e = report["errors"]
    assert "tp=4" in e["heads"] and "n_heads=6" in e["heads"] and "n_kv_heads=2" in e["heads"], e["heads"]
    assert "[1, 2]" in e["heads"]
    assert e["heads_params"] == e["heads"]
    assert "n_devices=16" in e["too_many"] and f"only {e['n_devices']}" in e["too_many"], e["too_many"]
