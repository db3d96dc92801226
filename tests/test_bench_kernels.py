"""bench/kernels.py's verify section (Dustin's verification attention vs dense, issue 30 part 8b) on tiny shapes:
the records it writes and that it times the right thing (the sparse attention over a budget covering the cache is
the dense attention; the probe is the A_T estimate; the selection fills the budget); and its decode section
(issue 31: a B=1 step's launches) on a tiny model. CPU: interpret mode, ~15 s each."""
import os
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import kernels  # noqa: E402
import pallas_kernels as pk  # noqa: E402

INTERPRET = jax.default_backend() != "gpu"
B, S = 2, 512


def test_verify_section_records():
    run = kernels.Runner(reps=1, time_budget_s=300)
    kernels.bench_verify(run, "tiny", B, S, budgets=(128,), heads_variants=("srh4", "default"), interpret=INTERPRET,
                         calls=2)
    recs = run.records
    assert all(r["calls_per_program"] == 2 for r in recs if "time_ms" in r)
    assert not [r for r in recs if "error" in r or "skipped" in r], recs
    parts = {(r["kernel"], r.get("heads"), r.get("budget"), r.get("signals")) for r in recs if "time_ms" in r}
    assert parts == {("verify_dense", None, None, None), ("verify_probe", "srh4", None, None),
                     ("verify_probe", "default", None, None), ("verify_probe_xla", "srh4", None, None),
                     ("verify_probe_xla", "default", None, None), ("verify_sparse", None, 128, None),
                     ("verify_select", None, 128, "hybrid"), ("verify_select", None, 128, "draft"),
                     ("verify_select", None, 128, "target"), ("verify_sparse_splits", None, 128, None)}
    assert sorted(r["num_splits"] for r in recs if r["kernel"] == "verify_sparse_splits") == \
        sorted(kernels.SPARSE_SPLIT_SWEEP)
    assert all(r["time_ms"] > 0 for r in recs if "time_ms" in r)
    every = [r for r in recs if r["kernel"] == "dustin_verify"]
    assert sorted((r["signals"], r["heads"]) for r in every) == [
        ("draft", "none"), ("hybrid", "default"), ("hybrid", "srh4"), ("target", "srh4")]
    # draft-only: no A_T, so no probe in the estimation; target-only: the summary heads' probe
    by = {(r["signals"], r["heads"]): r for r in every}
    draft, target, hybrid = by["draft", "none"], by["target", "srh4"], by["hybrid", "srh4"]
    assert draft["probe_ms"] == 0 and draft["n_target_heads"] == 0
    assert draft["estimation_ms"] == pytest.approx(draft["select_ms"], abs=1e-4)
    assert target["probe_ms"] == hybrid["probe_ms"] > 0 and target["select_ms"] != hybrid["select_ms"]
    derived = [r for r in every if r["signals"] == "hybrid"]
    for r in derived:
        assert r["n_layers"] == kernels.VERIFY_LAYERS["tiny"] and r["budget"] == 128 and r["T"] == 5
        for k in ("dense_ms", "sparse_ms", "probe_ms", "select_ms", "estimation_ms", "speedup_per_layer",
                  "attention_speedup_per_layer", "speedup_verification", "estimation_frac",
                  "estimation_frac_per_layer"):
            assert r[k] > 0, k
        assert r["estimation_ms"] == pytest.approx(r["probe_ms"] + r["select_ms"], abs=1e-3)
        L = r["n_layers"]
        assert r["speedup_verification"] == pytest.approx(
            L * r["dense_ms"] / (r["estimation_ms"] + L * r["sparse_ms"]), rel=1e-2)
        assert r["speedup_verification_probe_xla"] == pytest.approx(
            L * r["dense_ms"] / (r["probe_xla_ms"] + r["select_ms"] + L * r["sparse_ms"]), rel=1e-2)
    assert {r["n_target_heads"] for r in derived} == {4, 2 * 4}   # srh4; default: every head of 2 layers (N=4)
    s = kernels.verify_summary(recs, "tiny", B, S, budget=128)
    assert s["verify_attention_speedup_8b_32k_b16"] == hybrid["speedup_verification"] > 0
    assert s["estimation_overhead_frac"] == hybrid["estimation_frac"] > 0
    assert s["verify_attention_speedup_by_signals"] == {
        k: by[k, h]["speedup_verification"] for k, h in (("hybrid", "srh4"), ("draft", "none"), ("target", "srh4"))}
    assert set(s["estimation_overhead_frac_by_signals"]) == {"hybrid", "draft", "target"}
    splits = s["verify_sparse_ms_by_splits"]
    assert splits["auto"] == hybrid["sparse_ms"] and set(splits) == {"auto", *kernels.SPARSE_SPLIT_SWEEP}
    assert all(v > 0 for v in splits.values())
    assert kernels.verify_summary(recs, kernels.SUMMARY_MODEL, 16, 32768) == {}


def test_verify_case_times_the_right_attention():
    case = kernels.verify_case("tiny", B, S, budgets=(128, 512), heads_variants=("srh4",), interpret=INTERPRET)
    T = kernels.VERIFY_T
    idx, n = case["idx"][512]   # base = S - T <= budget: I_verify is the whole prefix
    np.testing.assert_array_equal(np.asarray(n), S - T)
    np.testing.assert_array_equal(np.asarray(idx)[:, :S - T], np.broadcast_to(np.arange(S - T), (B, S - T)))
    np.testing.assert_array_equal(np.asarray(case["idx"][128][1]), 128)
    fn, args = case["dense"]
    q, k_all, v_all, kv_len = args
    want = np.asarray(pk.flash_scores_reference(q, k_all, v_all, kv_len, layer=0)[0], np.float32)
    dense = np.asarray(jax.jit(fn)(*args), np.float32)
    fn, args = case["sparse", 512]
    sparse = np.asarray(jax.jit(fn)(*args), np.float32)
    np.testing.assert_allclose(dense, want, atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(sparse, want, atol=2e-2, rtol=2e-2)
    # the split sweep reads the first budget's selection: the same attention whatever the split count
    for n in kernels.SPARSE_SPLIT_SWEEP:
        fn, args = case["sparse_splits", n]
        np.testing.assert_allclose(np.asarray(jax.jit(fn)(*args), np.float32),
                                   np.asarray(jax.jit(case["sparse", 128][0])(*case["sparse", 128][1]), np.float32),
                                   atol=2e-2, rtol=2e-2, err_msg=f"num_splits={n}")
    # The probe: softmax weights of rows 0 and T-1 on the 4 target heads, each row summing to 1 over the prefix.
    fn, args = case["probe", "srh4"]
    a_t = np.asarray(jax.jit(fn)(*args))
    assert a_t.shape == (B, S) and (a_t[:, S - T:] == 0).all()
    np.testing.assert_allclose(a_t.sum(-1), 4 * 2, rtol=1e-4)
    # The one-tier selections: draft-only ranks the free slots by A_D alone, target-only by A_T alone.
    from jspec.dustin import select_verify
    sig_d, sig_t, base = case["select", 128, "draft"][1]
    free = 128 - 4 - 64
    for signals, m in (("draft", free), ("target", 0)):
        got = jax.jit(case["select", 128, signals][0])(sig_d, sig_t, base)
        want = select_verify(sig_d, sig_t, base, budget=128, m=m)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]), err_msg=signals)
    assert not np.array_equal(np.asarray(jax.jit(case["select", 128, "draft"][0])(sig_d, sig_t, base)[0]),
                              np.asarray(case["idx"][128][0]))   # hybrid's differs
    fn, args = case["probe_xla", "srh4"]   # the same probe through XLA
    np.testing.assert_allclose(np.asarray(jax.jit(fn)(*args)), a_t, rtol=1e-4, atol=1e-6)


def test_instances_in_one_program_are_independent_calls():
    """calls=2: each part returns one result per instance, each equal to the part run alone on that instance's
    own inputs (its queries, signals, selection); the instances' inputs differ, so none reads another's data."""
    case = kernels.verify_case("tiny", B, S, budgets=(128,), heads_variants=("srh4",), interpret=INTERPRET, calls=2)
    one = kernels.verify_case("tiny", B, S, budgets=(128,), heads_variants=("srh4",), interpret=INTERPRET)
    for part in ("dense", ("sparse", 128), ("select", 128), ("probe", "srh4")):
        fn, args = case[part]
        single, _ = one[part]
        n_varied = {"dense": 1, "sparse": 3, "select": 2, "probe": 1}[part if isinstance(part, str) else part[0]]
        got = jax.jit(fn)(*args)
        assert len(got) == 2
        for c in range(2):
            want = jax.jit(single)(*(a[c] for a in args[:n_varied]), *args[n_varied:])
            for g, w in zip(jax.tree.leaves(got[c]), jax.tree.leaves(want)):
                np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        assert not np.array_equal(np.asarray(args[0][0]), np.asarray(args[0][1]))


def test_decode_section_records():
    """Every part through XLA (1 and 16 rows) and the fused path (1 row), each fused launch with the library's
    settings then the grid's (transposed weights included), flash_scores likewise; the summary names the best."""
    from jspec.config import ModelConfig
    cfg = ModelConfig(arch="llama", vocab_size=64, d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=64,
                      ffn_dim=64, dtype="bfloat16", max_position=512)
    run = kernels.Runner(reps=1, time_budget_s=300)
    dense_grid = ((True, 32, 64, 2), (False, 64, 128, 4))
    flash_grid = ((64, 2, 2, 1), (128, 4, 1, 2))    # the second asks more splits than 256 / 128 key tiles: skipped
    kernels.bench_decode(run, "tiny", cfg, S=256, valid=200, dense_grid=dense_grid, flash_grid=flash_grid,
                         interpret=INTERPRET)
    recs = run.records
    assert not [r for r in recs if "time_ms" not in r], [r for r in recs if "time_ms" not in r]
    got = {(r["kernel"], r.get("part"), r.get("M")) for r in recs if r["kernel"] in ("decode_xla", "decode_fused")}
    assert got == {("decode_xla", p, M) for p in ("qkv", "out", "mlp") for M in (1, 16)} | \
        {("decode_fused", p, 1) for p in ("qkv", "out", "mlp")}
    dense = [r for r in recs if r["kernel"] == "decode_dense"]
    for part in ("qkv_rope", "glu", "residual_o", "residual_down"):
        mine = [r for r in dense if r["part"] == part]
        assert mine[0]["launch"] == "library"
        # qkv_rope's programs are one head each: only grid entries of block_n = H apply
        want = [(False, 64, 128, 4)] if part == "qkv_rope" else sorted(dense_grid)
        assert sorted((r["transposed"], r["block_n"], r["max_chunk"], r["num_warps"]) for r in mine[1:]) == want
    flash = [r for r in recs if r["kernel"] == "decode_flash"]
    assert [r["launch"] for r in flash] == ["library", "grid"] and flash[1]["num_splits"] == 2
    assert all(r["time_ms"] > 0 and r["calls_per_program"] == cfg.n_layers for r in recs)
    s = kernels.decode_summary(recs)
    assert s["decode_flash_attention_best"] == {"block_k": 64, "num_splits": 2, "num_warps": 2, "num_stages": 1}
    glu = [r for r in dense if r["part"] == "glu"]
    assert s["decode_dense_glu_best_us"] == min(round(r["time_ms"] * 1e3, 2) for r in glu[1:])
    assert s["decode_dense_glu_library_us"] == round(glu[0]["time_ms"] * 1e3, 2)
    assert s["decode_xla_mlp_M1_us"] > 0 and s["decode_fused_qkv_M1_us"] > 0
