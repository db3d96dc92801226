"""Dustin's offline tools (jspec/offline): the teacher-forced rounds, ARR, the head greedy of `profile-heads`,
the profile it writes, the teacher-forced fidelity, and their CLI errors. Tiny models on CPU."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from conftest import random_params, runtime_params, tiny_config
from jspec import cli, kv_cache, model
from jspec.dustin import read_profile
from jspec.errors import InputError
from jspec.offline import fidelity as F
from jspec.offline import heads as Hd
from jspec.offline import rounds as R

NEEDLE = 3


def tiny(seed=0, **overrides):
    cfg = tiny_config("llama", **overrides)
    return jspec.Model(params=runtime_params(cfg, seed), cfg=cfg, tokenizer=None,
                       path="tiny")


def needle_model(head=1):
    """A qwen2-shaped tiny model where only layer 0's query head `head` attends anywhere in particular: every
    other query is 0 (uniform attention), and that head's query is a constant bias that matches the key of
    the NEEDLE token only. The query and key sit on the slowest RoPE pair (rope_theta 1e6), so position barely
    matters: the head looks at the needles wherever they are, in every block."""
    cfg = tiny_config("qwen2", dtype="float32")
    p = random_params(cfg, 0)
    lp = p["layers"]
    slow = cfg.head_dim // 2 - 1                     # the last RoPE pair (slow, slow + H/2): the slowest
    lp["wq"][:] = 0.0
    lp["bq"][:] = 0.0
    lp["bq"][0, head, slow] = 8.0
    x = p["embed"][NEEDLE]
    h = x / np.sqrt(np.mean(x * x) + cfg.norm_eps) * lp["attn_norm"][0]          # the needle after RMSNorm
    lp["wk"][0, :, head // cfg.group, :] = 0.0
    lp["wk"][0, :, head // cfg.group, slow] = 12.0 * h / (h @ h)                   # needle key: 12 on that dim
    lp["bk"][:] = 0.0
    m = jspec.Model(params=model.fuse_projections(jax.tree.map(jnp.asarray, p), cfg), cfg=cfg, tokenizer=None,
                    path="needle")
    return m


def needle_prompts(n, B=2, seed=0):
    rng = np.random.default_rng(seed)
    rows = rng.integers(4, 120, (B, n))
    for b in range(B):
        rows[b, rng.choice(np.arange(24, 150), 8, replace=False)] = NEEDLE
    return rows.tolist()


# ---------------------------------------------------------------------------------------------- rounds

def test_dense_round_equals_the_ordinary_forward():
    """The masked-attention block with dense reads gives the forward's own logits: the hook changes nothing."""
    m = tiny()
    cfg, B, L, T = m.cfg, 2, 40, 5
    toks = jnp.asarray(np.random.default_rng(1).integers(4, 120, (B, L + T + 1)), jnp.int32)
    cache = R.prefill(m.params, R.new_cache(cfg, B, 64, jnp.float32), toks[:, :L], cfg=cfg)
    probe = R.Probe(T=T, draft=True, mass=True)
    ones = jnp.ones((cfg.n_layers, cfg.n_heads))
    out, _ = R.round_step(m.params, cache, toks[:, L:L + T], toks[:, L + 1:L + T + 1], R.dense_reads(B, 64), ones,
                          ones, None, cfg=cfg, probe=probe)
    ref, _, _ = model.forward(m.params, cfg, toks[:, :L + T], kv_cache.init(cfg, batch=B, capacity=64,
                                                                               dtype=jnp.float32))
    ref = ref[:, L:]
    nll = jax.nn.logsumexp(ref, -1) - jnp.take_along_axis(ref, toks[:, L + 1:, None], -1)[..., 0]
    np.testing.assert_allclose(out["nll"], nll, atol=1e-4)
    assert (out["top1"] == jnp.argmax(ref, -1)).all()
    np.testing.assert_allclose(out["recovered"], 1.0, atol=1e-6)          # dense rows read all their mass
    count = cfg.n_layers * cfg.n_heads * T                                   # every row's weights sum to 1
    np.testing.assert_allclose(out["mass"].sum(-1) + out["tail"], count, rtol=1e-5)
    assert float(jnp.abs(out["mass"][:, L:]).max()) == 0.0                  # mass: slots before the block only


def test_quest_reads_against_brute_force():
    rng = np.random.default_rng(2)
    B, Rr, N, K, H, S, page = 2, 3, 4, 2, 8, 50, 4
    q = rng.standard_normal((B, Rr, N, H)).astype(np.float32)
    k = rng.standard_normal((B, S, K, H)).astype(np.float32)
    start, n_pages = np.array([43, 20]), np.array([3, 9])
    got = np.asarray(R.quest_reads(q, k, jnp.asarray(start), jnp.asarray(n_pages), page=page, max_pages=8))
    for b in range(B):
        complete = start[b] // page
        for r in range(Rr):
            score = [sum(max(q[b, r, n, h] * k[b, p * page:(p + 1) * page, n // 2, h].min(),
                             q[b, r, n, h] * k[b, p * page:(p + 1) * page, n // 2, h].max())
                         for n in range(N) for h in range(H)) for p in range(complete)]
            best = sorted(range(complete), key=lambda p: -score[p])[:min(n_pages[b], 8)]
            want = {j for p in best for j in range(p * page, p * page + page)} | set(range(complete * page, start[b]))
            assert set(np.flatnonzero(got[b, r])) == want, (b, r)


# ---------------------------------------------------------------------------------------------- ARR, greedy

def test_arr_on_a_hand_built_attention_map():
    """Two blocks over S = 16 slots: the selection is fixed by the signals; ARR = mean of (mass on it + tail)
    / count, with the block's own slots (tail) always read."""
    S, count = 16, 4.0
    mass = np.zeros((2, S), np.float32)
    mass[0, [0, 3, 7, 9, 12, 14]] = [0.5, 1.0, 0.5, 0.25, 0.25, 0.5]     # block 0: 3.0 before, tail 1.0
    mass[1, [1, 5, 8, 15]] = [1.0, 1.0, 0.5, 0.5]                         # block 1: 3.0 before, tail 1.0
    tail = np.array([1.0, 1.0], np.float32)
    lengths = np.array([16, 16], np.int32)
    d, t = np.zeros((2, S), np.float32), np.zeros((2, S), np.float32)
    d[:, 7], t[:, [3, 9]] = 1.0, [2.0, 1.0]
    # budget 6 = sink 1 {0} + window 2 {14, 15} + tier 1 (m=1) {7} + tier 2 {3, 9}
    got = float(Hd.arr(d, t, lengths, mass, tail, count, budget=6, sink=1, window=2, m=1, page=1))
    want = ((0.5 + 0.5 + 0.5 + 1.0 + 0.25 + 1.0) / 4 + (0.5 + 1.0) / 4) / 2
    assert got == pytest.approx(want, abs=1e-6)
    # everything selected: every row's whole mass
    assert float(Hd.arr(d, t, lengths, mass, tail, count, budget=16, sink=1, window=2, m=1, page=1)) == \
        pytest.approx(1.0)


def test_greedy_picks_the_head_that_carries_the_mass():
    """Synthetic maps: unit 2 of the target signal equals the true attention, the rest are noise; the greedy
    takes it first, then stops (the others add less than min_gain). A KV-group budget of 0 leaves nothing."""
    rng = np.random.default_rng(3)
    I, S = 4, 64
    mass = np.zeros((I, S), np.float32)
    for i in range(I):
        mass[i, rng.choice(np.arange(4, 50), 6, replace=False)] = 2.0
    tail = np.full(I, 4.0, np.float32)
    maps = rng.uniform(0, 0.01, (6, I, S)).astype(np.float32)
    maps[2] = mass
    units = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    cal = Hd.Calibration(jnp.full((I,), S, jnp.int32), jnp.asarray(mass), jnp.asarray(tail), 16.0,
                         jnp.asarray(maps), units, None, [])
    kw = dict(budget=16, sink=2, window=4, m=0, page=1, group=1, min_gain=0.002)
    res = Hd.greedy(cal, max_groups=3, **kw)
    assert res["target_heads"] == [(1, 0)] and res["steps"][1]["added"] == ["target", 1, 0]
    assert res["arr"] == pytest.approx(1.0, abs=1e-6) and res["steps"][0]["arr"] < 0.5
    assert Hd.greedy(cal, max_groups=0, **kw)["target_heads"] == []


def test_profile_heads_finds_the_needle_head(tmp_path):
    """End to end on a model built so that one head carries the non-uniform attention: every m's greedy takes
    that head first; target-only (m = 0) keeps exactly it. The profile JSON loads for this model only."""
    m = needle_model(head=1)
    prompts = needle_prompts(200 + 4 * 5 + 1)
    out = tmp_path / "heads.json"
    prof = Hd.profile_heads(m, length=200, budget=48, sink=4, window=8, rounds=4, prompts=prompts,
                            draft_support="oracle", estimation_frac=0.125, out=str(out), progress=False,
                            log=lambda s: None)
    for m_, steps in prof.curves["arr_vs_srh"].items():
        assert steps[1]["added"][1:] == [0, 1], (m_, steps)
        assert steps[1]["arr"] - steps[0]["arr"] > 0.05
    assert (0, 1) in prof.target_heads + prof.draft_heads
    assert prof.curves["estimation"]["max_groups"] == 1
    only_t = Hd.profile_heads(m, length=200, budget=48, sink=4, window=8, rounds=4, prompts=prompts,
                              m_grid=(0.0,), estimation_frac=0.125, progress=False, log=lambda s: None)
    assert only_t.m == 0 and only_t.target_heads == ((0, 1),) and only_t.draft_heads == ()
    back = read_profile(str(out), m.cfg)
    assert back == prof and (tmp_path / "heads.png").stat().st_size > 0
    with pytest.raises(InputError, match="made for another model"):
        read_profile(str(out), tiny_config("qwen2", n_layers=3))


def test_profile_heads_bad_input():
    m = tiny()
    for kw, says in [(dict(length=10_000), "exceed the model's context"),
                     (dict(length=200, budget=60, sink=4, window=64), "budget=60 < sink \\+ window"),
                     (dict(length=40, budget=48), "nothing to choose"),
                     (dict(length=200, drafter="other"), "--drafter"),
                     (dict(length=200, prompts=[[5] * 30]), "tokens each")]:
        with pytest.raises(InputError, match=says):
            Hd.profile_heads(m, **{"budget": 32, "sink": 4, "window": 8, **kw}, progress=False)


# ---------------------------------------------------------------------------------------------- fidelity

def test_fidelity_dense_when_the_budget_covers_the_context_and_lossy_below():
    """Budget >= context: every method reads everything, so agreement is 1 and the NLL unchanged, exactly.
    A budget of 24 out of 120 slots on a random model (weights of std 0.5: every position's attention matters)
    changes the target: agreement < 1 and the NLL moves, for every method."""
    m = tiny()
    prompts = np.random.default_rng(4).integers(4, 120, (2, 120 + 2 * 5 + 1)).tolist()
    doc = F.fidelity(m, lengths=[120], budgets=[24, 256], sink=4, window=8, quest_page=4, prompts=prompts, rounds=2,
                     progress=False, log=lambda s: None)
    recs = {(r["method"], r["budget"]): r for r in doc["records"]}
    assert set(recs) == {("dense", None)} | {(x, K) for x in F.METHODS for K in (24, 256)}
    for method in F.METHODS:
        full, small = recs[method, 256], recs[method, 24]
        assert full["agreement"] == 1.0 and full["nll_increase"] == 0.0 and full["nll_increase_frac"] == 0.0
        assert full["recovered"] == pytest.approx(1.0) and full["positions"] == 2 * 2 * 5
        assert small["agreement"] < 1.0 and small["nll_increase"] != 0.0 and small["recovered"] < 0.9
    assert recs["dense", None]["agreement"] == 1.0
    assert doc["summary"]["dustin_top1_agreement_L120_budget256"] == 1.0
    # paired against the baselines at the same budget: identical reads give a zero difference, the standing level
    v = recs["dustin", 256]["versus"]
    assert set(v) == {"streaming", "quest"} and v["quest"]["agreement"] == dict(diff=0.0, ci95=[0.0, 0.0])
    assert doc["summary"]["dustin_standing_L120_budget256"] == "level"
    assert set(recs["dustin", 24]["versus"]) == {"streaming", "quest"}
    assert {"commit", "dirty", "device", "jax"} <= set(doc["provenance"])


def test_paired_interval_is_students_t_over_the_rows():
    """The interval treats each row (prompt) as one observation: t over the per-row mean differences."""
    from scipy import stats
    rng = np.random.default_rng(7)
    for B in (2, 3, 8, 31, 40):
        a, b = rng.normal(0.3, 1.0, (B, 4, 5)), rng.normal(0.0, 1.0, (B, 4, 5))
        d = (a - b).reshape(B, -1).mean(-1)
        lo, hi = stats.t.interval(0.95, B - 1, loc=d.mean(), scale=stats.sem(d))
        got = F.paired(a, b)
        tol = 1e-3 * (hi - lo) if B <= 31 else 0.02 * (hi - lo)   # beyond 30 df the table's 2.0 (exact: 2.02-2.04)
        assert got["diff"] == pytest.approx(d.mean(), abs=1e-6)
        assert got["ci95"][0] == pytest.approx(lo, abs=tol) and got["ci95"][1] == pytest.approx(hi, abs=tol)
    assert F.paired(np.ones((1, 3)), np.zeros((1, 3))) == dict(diff=1.0, ci95=None)


def test_standing_needs_every_rival_beaten_beyond_noise():
    def v(a, n):
        return dict(agreement=dict(diff=0, ci95=a), nll=dict(diff=0, ci95=n))
    ahead, level, behind = v([0.01, 0.05], [-0.1, 0.02]), v([-0.01, 0.05], [-0.1, 0.02]), v([-0.05, -0.01], [0, 1])
    assert F.standing({"streaming": ahead, "quest": ahead}) == "ahead"
    assert F.standing({"streaming": ahead, "quest": level}) == "level"
    assert F.standing({"streaming": ahead, "quest": behind}) == "behind"
    assert F.standing({"streaming": v([0.01, 0.05], [0.01, 0.1])}) == "behind"   # better agreement, worse NLL
    assert F.standing({"streaming": v([-0.02, 0.05], [-0.3, -0.1])}) == "ahead"  # NLL alone, agreement level
    assert F.standing({"quest": v(None, None)}) is None


def test_fidelity_bad_input():
    m = tiny()
    for kw, says in [(dict(lengths=[5000]), "exceed the model's context"), (dict(methods=["nope"]), "unknown method"),
                     (dict(budgets=[40], window=64), "budget=40 < sink \\+ window"),
                     (dict(draft_signal="x"), "--draft-signal")]:
        with pytest.raises(InputError, match=says):
            F.fidelity(m, **{"lengths": [120], "budgets": [24], "window": 8, **kw}, progress=False)


# ---------------------------------------------------------------------------------------------- CLI

@pytest.fixture
def tiny_ckpt(tmp_path):
    from jspec import checkpoints
    cfg = tiny_config("llama", dtype="float32")
    return checkpoints.save(str(tmp_path / "tiny"), random_params(cfg), cfg)


@pytest.fixture
def no_load(monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was found")
    monkeypatch.setattr(jspec, "load", load)


@pytest.mark.parametrize("argv,says", [
    (["profile-heads", "--texts", "/nonexistent/texts"], "--texts '/nonexistent/texts' is not a folder"),
    (["profile-heads", "--length", "5000"], "exceed the model's context of 4096"),
    (["profile-heads", "--length", "1000", "--budget", "60"], "budget=60 < sink + window = 4 + 64"),
    (["profile-heads", "--length", "400", "--budget", "512"], "nothing to choose"),
    (["profile-heads", "--length", "1000", "--prompts", "0"], "--prompts 0 must be >= 1"),
    (["fidelity", "--texts", "/nonexistent/texts"], "is not a folder"),
    (["fidelity", "--lengths", "2048,5000"], "exceed the model's context of 4096"),
    (["fidelity", "--lengths", "1000", "--budgets", "0"], "--budgets needs positive integers"),
    (["fidelity", "--lengths", "1000", "--methods", "dustin,nope"], "unknown method(s) ['nope']"),
    (["fidelity", "--lengths", "1000", "--budgets", "64"], "budget=64 < sink + window"),
])
def test_cli_errors(tiny_ckpt, no_load, capsys, argv, says):
    rc = cli.main(argv + ["--model", tiny_ckpt])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and says in err and err.count("\n") == 1, err


def test_cli_fidelity_refuses_a_profile_for_another_model(tiny_ckpt, no_load, capsys, tmp_path):
    from jspec.dustin import Profile, model_signature, write_profile
    path = write_profile(str(tmp_path / "p.json"), Profile(model=model_signature(tiny_config("qwen2")),
                                                            drafter="self", budget=128))
    rc = cli.main(["fidelity", "--model", tiny_ckpt, "--lengths", "1000", "--profile", path])
    err = capsys.readouterr().err
    assert rc == 2 and "made for another model" in err and err.count("\n") == 1, err
    assert json.load(open(path))["format"] == "jspec-dustin-profile/1"


def test_longspec_drafter_signal_profile_and_fidelity():
    """drafter="longspec": the draft signal is the drafter's cross-attention over the target's last layer while
    it drafts the block -- gamma softmaxes per head over the slots before the block. Its heads are (0, h); the
    fidelity tool takes that profile with the longspec draft signal and refuses it with another."""
    from jspec.drafter import Drafter, init_drafter_params
    m = tiny(dtype="float32")
    cfg, B, L, T = m.cfg, 2, 120, 5
    dr = Drafter(params=init_drafter_params(cfg, jax.random.key(1), scale=0.5), cfg=cfg, window=16, meta={})
    toks = jnp.asarray(np.random.default_rng(5).integers(4, 120, (B, L + T + 1)), jnp.int32)
    cache = R.prefill(m.params, R.new_cache(cfg, B, 128), toks[:, :L], cfg=cfg)
    w = R.longspec_draft(dr.params, m.params, toks, cache.lengths, toks[:, L:L + T], cache.k[-1], cfg=cfg,
                         window=16)
    assert w.shape == (B, cfg.n_heads, 128)
    np.testing.assert_allclose(w.sum(-1), T - 1, rtol=1e-5)
    assert float(jnp.abs(w[..., L:]).max()) == 0.0 and float(jnp.std(w[:, 0] - w[:, 1])) > 0
    prompts = np.asarray(toks).tolist()
    prof = Hd.profile_heads(m, length=L, budget=32, sink=4, window=8, rounds=1, gamma=4, prompts=prompts,
                            drafter="longspec", drafter_dir=dr, m_grid=(1.0,), progress=False, log=lambda s: None)
    assert prof.drafter == "longspec" and prof.draft_heads and all(lay == 0 for lay, _ in prof.draft_heads)
    doc = F.fidelity(m, lengths=[L], budgets=[32], methods=["dustin"], profile=prof, draft_signal="longspec",
                     drafter_dir=dr, prompts=prompts, rounds=1, progress=False, log=lambda s: None)
    assert doc["settings"]["draft_signal"] == "longspec" and doc["records"][1]["m"] == 32 - 4 - 8
    with pytest.raises(InputError, match="made for drafter 'longspec'"):
        F.fidelity(m, lengths=[L], budgets=[32], profile=prof, prompts=prompts, rounds=1, progress=False)
