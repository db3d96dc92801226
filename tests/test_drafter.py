"""LongSpec drafter: training regimes against hand-computed cases, training / resume / export on a tiny
model, the tuned draft shapes it carries (tuned.json: the by-batch rule, merging, bad files) and the bundled
drafter's against their results."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec import kv_cache
from jspec.api import Model
from jspec.config import preset
from jspec.drafter import (anchor_positions, attend, cross_mask, drafter_forward_train, init_drafter_params,
                           load_drafter, noisy_cross_len, read_shapes, sample_anchor_positions, save_drafter,
                           write_shape)
from jspec.offline.train_drafter import drafter_loss, lr_at, target_last_kv, train_drafter
from jspec.model import forward

from conftest import runtime_params, tiny_config


def _tiny(arch="llama", **kw):
    cfg = tiny_config(arch, dtype="float32", **kw)
    return cfg, runtime_params(cfg)


# --- training regimes --------------------------------------------------------------------------------------

def test_anchor_positions_hand_computed():
    assert anchor_positions(8, 2, 100).tolist() == [0, 1, 102, 103, 104, 105, 106, 107]
    assert anchor_positions(5, 0, 7).tolist() == [7, 8, 9, 10, 11]          # no sink: a pure shift
    assert anchor_positions(4, 4, 1000).tolist() == [0, 1, 2, 3]             # all sink
    assert anchor_positions(6, 3, 0).tolist() == [0, 1, 2, 3, 4, 5]          # offset 0: plain indices


def test_sample_anchor_positions_fixed_rng():
    # default_rng(0).integers(0, 5, 3) -> sinks [4, 3, 2]; then .integers(0, 64 - 8 + 1, 3) -> offsets [15, 17, 2]
    pos = sample_anchor_positions(np.random.default_rng(0), 3, 8, 64)
    assert pos.dtype == np.int32 and pos.shape == (3, 8)
    assert pos.tolist() == [[0, 1, 2, 3, 19, 20, 21, 22],
                            [0, 1, 2, 20, 21, 22, 23, 24],
                            [0, 1, 4, 5, 6, 7, 8, 9]]
    big = sample_anchor_positions(np.random.default_rng(1), 64, 32, 4096)
    assert big.max() < 4096 and big.max() > 1000                            # long distances get exercised


def test_noisy_cross_attention_mask_hand_computed():
    cl = noisy_cross_len(2, 6, 2)
    assert cl.tolist() == [[0, 0, 1, 2, 3, 4]] * 2
    # query t sees target slot j iff j <= t - 2
    expect = np.array([[0, 0, 0, 0, 0, 0],
                       [0, 0, 0, 0, 0, 0],
                       [1, 0, 0, 0, 0, 0],
                       [1, 1, 0, 0, 0, 0],
                       [1, 1, 1, 0, 0, 0],
                       [1, 1, 1, 1, 0, 0]], bool)
    np.testing.assert_array_equal(np.asarray(cross_mask(cl, 6))[0], expect)
    assert noisy_cross_len(1, 4, 1).tolist() == [[0, 1, 2, 3]]               # lag 1: every slot before t


def test_attend_hidden_rows_are_zero_with_finite_grads():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(k1, (1, 3, 4, 8))
    k = jax.random.normal(k2, (1, 5, 2, 8))
    v = jax.random.normal(k3, (1, 5, 2, 8))
    vis = cross_mask(noisy_cross_len(1, 3, 2), 5)                          # rows 0, 1 see nothing; row 2 slot 0
    out, g = jax.jit(lambda q: (attend(q, k, v, vis), jax.grad(lambda q: jnp.sum(attend(q, k, v, vis) ** 2))(q)))(q)
    np.testing.assert_array_equal(np.asarray(out[0, :2]), 0.0)
    np.testing.assert_allclose(out[0, 2], jnp.repeat(v[0, 0], 2, axis=0), rtol=1e-6, atol=1e-6)  # one key: its value
    assert np.isfinite(np.asarray(g)).all()


def test_init_final_norm_from_target():
    for arch, factor in (("llama", 1.0), ("qwen3", 0.1)):                   # qwen3 tiny has a tied head
        cfg, tp = _tiny(arch)
        dp = init_drafter_params(cfg, jax.random.key(0), target_params=tp)
        np.testing.assert_allclose(dp["final_norm"], factor * tp["final_norm"], rtol=1e-6)
        assert "embed" not in dp and "lm_head" not in dp and dp["wq_x"].shape == (64, 4, 16)


# --- inference == training ---------------------------------------------------------------------------------

def test_target_last_kv_matches_plain_prefill():
    """The anchor-offset target forward (empty cache + Tree(depth=positions, causal mask)) equals a plain
    prefill when the positions are 0..T-1."""
    cfg, tp = _tiny()
    B, T = 2, 12
    tokens = jax.random.randint(jax.random.key(5), (B, T), 0, cfg.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    k, v = target_last_kv(tp, cfg, tokens, pos)
    _, cache, _ = forward(tp, cfg, tokens, kv_cache.init(cfg, batch=B, capacity=T, dtype=jnp.float32))
    np.testing.assert_allclose(k, cache.k[-1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v, cache.v[-1], rtol=1e-5, atol=1e-5)


def test_target_last_kv_at_anchor_positions_matches_tree_forward():
    """At anchor-offset positions the causal prefill with explicit positions (the XLA path and the Pallas flash
    kernel, interpreted) equals the tree-verification path given depth = positions and a causal mask."""
    from jspec.attention import AttnImpl
    from jspec.model import Tree
    cfg, tp = _tiny(head_dim=64)
    B, T = 2, 24
    tokens = jax.random.randint(jax.random.key(6), (B, T), 0, cfg.vocab_size)
    pos = jnp.stack([anchor_positions(T, 3, 200), anchor_positions(T, 0, 57)]).astype(jnp.int32)
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    logits, cache, _ = forward(tp, cfg, tokens, kv_cache.init(cfg, batch=B, capacity=T, dtype=jnp.float32),
                               tree=Tree(depth=pos, mask=causal))
    for impl in (AttnImpl(backend="xla"), AttnImpl(backend="pallas", interpret=True)):
        k, v, lg = target_last_kv(tp, cfg, tokens, pos, impl=impl, with_logits=True)
        np.testing.assert_allclose(k, cache.k[-1], rtol=1e-4, atol=1e-4)     # f32 rounding over the layers
        np.testing.assert_allclose(v, cache.v[-1], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(lg, logits, rtol=1e-3, atol=1e-3)


# --- training, resume, export ------------------------------------------------------------------------------

class _ByteTokenizer:
    """ASCII bytes mod V: enough of a tokenizer for the data path on a tiny model."""

    def __init__(self, vocab):
        self.vocab = vocab

    def encode(self, text, add_special_tokens=False):
        return [3 + b % (self.vocab - 3) for b in text.encode("utf-8")]


def _tiny_model(seed=0):
    cfg = tiny_config("llama", dtype="float32", max_position=512)
    tp = runtime_params(cfg, seed, scale=0.3)
    return Model(params=tp, cfg=cfg, tokenizer=_ByteTokenizer(cfg.vocab_size), path="tiny")


# One set of static settings for every training test, so the jitted step compiles once per session.
_TRAIN = dict(steps=16, batch=4, seq_len=32, lr=3e-3, warmup=2, window=8, log_every=1, progress=False, ckpt_every=0)


def test_lr_schedule_warmup_then_cosine():
    lr = [lr_at(s, lr=1.0, warmup=4, steps=14) for s in range(15)]
    np.testing.assert_allclose(lr[:4], [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(lr[4], 1.0)                                   # cosine starts at the peak
    np.testing.assert_allclose(lr[9], 0.1 + 0.9 * 0.5, rtol=1e-12)          # halfway: the mean
    np.testing.assert_allclose(lr[14], 0.1)                                  # ends at 10% of the peak
    assert all(a >= b for a, b in zip(lr[4:], lr[5:]))


def test_training_reduces_loss(tmp_path):
    m = _tiny_model()
    rng = np.random.default_rng(0)
    motifs = rng.integers(3, m.cfg.vocab_size, size=(6, 12))   # repeated motifs: learnable by copying
    stream = motifs[rng.integers(0, 6, size=400)].reshape(-1)
    s = train_drafter(model=m, tokens=stream, out=str(tmp_path / "run"), seed=0, **_TRAIN)
    recs = [json.loads(line) for line in open(s["log"])]
    losses = [r["loss"] for r in recs]
    assert len(losses) == 16 and s["finished"]
    assert np.mean(losses[-5:]) < losses[0] - 0.5, losses
    assert os.path.isfile(s["plot"]) and os.path.getsize(s["plot"]) > 1000


def test_distill_loss_is_soft_cross_entropy_against_the_target():
    cfg, tp = _tiny()
    B, T = 2, 12
    rng = np.random.default_rng(5)
    dp = init_drafter_params(cfg, jax.random.key(1), target_params=tp, scale=0.3)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, size=(B, T)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    tk, tv, tl = target_last_kv(tp, cfg, tokens, pos, with_logits=True)
    cross = noisy_cross_len(B, T, 2)
    q = np.asarray(drafter_forward_train(dp, tp, cfg, tokens, pos, tk, tv, cross, window=4), np.float64)[:, :-1]
    p = np.asarray(tl, np.float64)[:, :-1]
    logq = q - np.log(np.exp(q - q.max(-1, keepdims=True)).sum(-1, keepdims=True)) - q.max(-1, keepdims=True)
    logp = p - np.log(np.exp(p - p.max(-1, keepdims=True)).sum(-1, keepdims=True)) - p.max(-1, keepdims=True)
    want_soft = -np.mean(np.sum(np.exp(logp) * logq, -1))
    want_kl = np.mean(np.sum(np.exp(logp) * (logp - logq), -1))
    want_ce = -np.mean(np.take_along_axis(logq, np.asarray(tokens)[:, 1:, None], -1))
    loss, aux = drafter_loss(dp, tp, cfg, tokens, pos, tk, tv, cross, window=4, target_logits=tl)
    np.testing.assert_allclose(float(loss), want_soft, rtol=1e-5)
    np.testing.assert_allclose(float(aux["kl"]), want_kl, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(aux["ce"]), want_ce, rtol=1e-5)
    np.testing.assert_allclose(float(aux["agree"]), np.mean(q.argmax(-1) == p.argmax(-1)))
    # the text objective is the hard-label cross-entropy of the same logits
    ce_loss, ce_aux = drafter_loss(dp, tp, cfg, tokens, pos, tk, tv, cross, window=4)
    np.testing.assert_allclose(float(ce_loss), want_ce, rtol=1e-5)
    assert "agree" not in ce_aux
    # the target's own logits as the drafter's: KL 0, full agreement
    tl_same = jnp.concatenate([jnp.asarray(q, jnp.float32), jnp.zeros((B, 1, q.shape[-1]))], axis=1)
    _, same = drafter_loss(dp, tp, cfg, tokens, pos, tk, tv, cross, window=4, target_logits=tl_same)
    assert abs(float(same["kl"])) < 1e-5 and float(same["agree"]) == 1.0


def test_distill_training_raises_agreement_and_exports_snapshots(tmp_path):
    m = _tiny_model()
    rng = np.random.default_rng(1)
    stream = rng.integers(3, m.cfg.vocab_size, size=(6, 12))[rng.integers(0, 6, size=400)].reshape(-1)
    kw = dict(model=m, tokens=stream, seed=0, objective="distill", eval_every=4, n_eval_chunks=2,
              **{**_TRAIN, "steps": 12})
    s = train_drafter(out=str(tmp_path / "run"), export_every=4, **kw)
    recs = [json.loads(line) for line in open(s["log"])]
    ev = [r for r in recs if "eval_agree" in r]
    assert [r["step"] for r in ev] == [4, 8, 12]
    assert ev[-1]["eval_kl"] < ev[0]["eval_kl"] and ev[-1]["eval_agree"] >= ev[0]["eval_agree"], ev
    train = [r for r in recs if "kl" in r]
    assert len(train) == 12 and np.mean([r["kl"] for r in train[-3:]]) < train[0]["kl"], train
    snaps = sorted(os.listdir(tmp_path / "run" / "drafters"))
    assert snaps == ["step_000004", "step_000008"]   # the last step is the run's own drafter/
    # a snapshot is the run's state at that step: equal to a run stopped there
    part = train_drafter(out=str(tmp_path / "part"), stop_at=8, **kw)
    a = load_drafter(str(tmp_path / "run" / "drafters" / "step_000008"), dtype="float32")
    b = load_drafter(part["drafter"], dtype="float32")
    assert a.meta["step"] == 8 and a.meta["objective"] == "distill"
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    with pytest.raises(ValueError, match="objective"):
        train_drafter(out=str(tmp_path / "bad"), **{**kw, "objective": "kl"})


def test_resume_continues_identically(tmp_path):
    data = tmp_path / "text"
    data.mkdir()
    (data / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    (data / "b.py").write_text("def f(x):\n    return x * 2 + 1\n" * 60)
    m = _tiny_model()
    kw = dict(model=m, data_dir=str(data), seed=3, eval_every=4, n_eval_chunks=2, **_TRAIN)
    full = train_drafter(out=str(tmp_path / "full"), **kw)
    part = train_drafter(out=str(tmp_path / "part"), stop_at=7, **kw)
    assert part["step"] == 7 and not part["finished"]
    with pytest.raises(FileExistsError):
        train_drafter(out=str(tmp_path / "part"), **kw)
    resumed = train_drafter(out=str(tmp_path / "part"), resume=True, **kw)
    assert resumed["step"] == 16 and resumed["finished"]

    def log(p):
        return [json.loads(line) for line in open(p)]

    a, b = log(full["log"]), log(resumed["log"])
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in ("loss", "eval_loss", "grad_norm", "lag"):
            if key in ra:
                assert ra[key] == rb[key], (ra, rb)
    pa, pb = load_drafter(full["drafter"], dtype="float32"), load_drafter(resumed["drafter"], dtype="float32")
    for k in pa.params:
        np.testing.assert_array_equal(pa.params[k], pb.params[k])
    with pytest.raises(ValueError, match="settings differ"):
        train_drafter(out=str(tmp_path / "part"), resume=True, **{**kw, "seed": 4})


def test_bf16_export_roundtrip(tmp_path):
    cfg = preset("smollm2-135m")
    dp = init_drafter_params(cfg, jax.random.key(0), scale=0.05)
    dp["final_norm"] = dp["final_norm"] * 1.5
    path = save_drafter(str(tmp_path / "d"), dp, cfg, window=256, meta={"note": "x"})
    d = load_drafter(path)
    assert d.cfg == cfg and d.window == 256 and d.meta == {"note": "x"}
    assert set(d.params) == set(dp)
    for k in dp:
        assert d.params[k].dtype == jnp.bfloat16 and d.params[k].shape == dp[k].shape
        np.testing.assert_array_equal(np.asarray(d.params[k]), np.asarray(dp[k].astype(jnp.bfloat16)))
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
    n = sum(x.size for x in jax.tree.leaves(dp))
    assert 4_000_000 < n < 5_000_000 and size < 3 * n          # one block: ~4.3M params, ~9 MB in bf16


# --- tuned draft shapes (tuned.json) ------------------------------------------------------------------------

def test_tuned_shapes_by_batch(tmp_path):
    cfg = preset("smollm2-135m")
    path = save_drafter(str(tmp_path / "d"), init_drafter_params(cfg, jax.random.key(0), scale=0.05), cfg,
                        window=256)
    assert load_drafter(path).shapes == () and load_drafter(path).widths_for(16) is None
    write_shape(path, 16, (2, 4, 4, 4), tau=2.7)
    write_shape(path, 1, [2, 2, 2, 2, 2], source="b1.json")
    write_shape(path, 16, (3, 3))                                    # the same batch again: replaced
    d = load_drafter(path)
    assert d.shapes == ((1, (2, 2, 2, 2, 2)), (16, (3, 3)))
    assert [d.widths_for(b) for b in (1, 8, 15, 16, 64)] == [(2, 2, 2, 2, 2)] * 3 + [(3, 3)] * 2
    doc = json.loads((tmp_path / "d" / "tuned.json").read_text())
    assert [e["batch"] for e in doc["by_batch"]] == [1, 16] and doc["by_batch"][0]["source"] == "b1.json"
    assert "tau" not in doc["by_batch"][1]                           # provenance belongs to its entry
    only16 = d._replace(shapes=((16, (3, 3)),))
    assert only16.widths_for(1) == (3, 3)                            # below every tuned batch: the smallest's
    before = (tmp_path / "d" / "tuned.json").read_text()
    for bad in ((0, (2, 2)), (4, ()), (4, (2, 0))):
        with pytest.raises(ValueError, match=">= 1"):
            write_shape(path, *bad)
    with pytest.raises(FileNotFoundError, match="not a drafter directory"):
        write_shape(str(tmp_path / "nowhere"), 4, (2, 2))
    assert (tmp_path / "d" / "tuned.json").read_text() == before     # a refused write leaves the file alone
    assert [f for f in os.listdir(path) if f.startswith(".tuned")] == []
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(os.path.join(path, "tuned.json")).st_mode & 0o777 == 0o666 & ~mask
    (tmp_path / "d" / "tuned.json").write_text('{"format": "jspec-drafter-shapes", "by_batch": [{"batch": 2}]}')
    with pytest.raises(ValueError, match="bad entry"):
        load_drafter(path)
    with pytest.raises(ValueError, match="bad entry"):               # nor merged into
        write_shape(path, 4, (2, 2))
    (tmp_path / "d" / "tuned.json").write_text('{"by_batch": []}')
    with pytest.raises(ValueError, match="not a jspec drafter shapes file"):
        load_drafter(path)
    save_drafter(path, d.params, cfg, window=256)                    # new weights: the old tuning goes
    assert load_drafter(path).shapes == ()


def test_bundled_drafter_shapes_are_the_tuned_results():
    """checkpoints/drafters/smollm2-135m/tuned.json holds, per batch, the shape each committed H200 tune run
    chose (bench/tuned_shapes.py wrote it from them)."""
    from jspec.speculative.config import draft_widths

    assert draft_widths({"mode": "chain", "gamma": 3, "tree_widths": [4, 16]}) == [1, 1, 1]
    assert draft_widths({"mode": "tree", "gamma": 4, "tree_widths": [2, 4]}) == [2, 4]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    drafter = os.path.join(root, "checkpoints", "drafters", "smollm2-135m")
    doc = json.load(open(os.path.join(drafter, "tuned.json")))
    assert read_shapes(drafter) and len(doc["by_batch"]) == len(read_shapes(drafter))
    for entry in doc["by_batch"]:
        res = json.load(open(os.path.join(root, entry["source"])))
        assert (res["method"], res["batch"], entry["tree_widths"]) == ("longspec", entry["batch"], draft_widths(res))
        assert entry["tokens_per_s"] == round(res["tokens_per_s"], 1)
        assert res["tokens_per_s"] == max(m["tokens_per_s"] for m in res["measurements"])


def test_bundled_drafters_ship_in_the_wheel():
    """pyproject maps the top-level checkpoints/ folder to the package jspec.bundled, whose package-data globs
    cover every file of checkpoints/drafters, so a wheel install (not only an editable one) finds the bundled
    drafter (setuptools expands them like glob(recursive=True)); its explicit package list names every package
    on disk (a new subpackage missing from it would be missing from the wheel)."""
    import glob
    import tomllib

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        st = tomllib.load(f)["tool"]["setuptools"]
    on_disk = {os.path.relpath(r, root).replace(os.sep, ".") for top in ("jspec", "pallas_kernels")
               for r, _, fs in os.walk(os.path.join(root, top)) if "__init__.py" in fs}
    want = on_disk | {"jspec.bundled"}
    assert set(st["packages"]) == want, sorted(set(st["packages"]) ^ want)
    assert st["package-dir"] == {"jspec.bundled": "checkpoints"}
    patterns = st["package-data"]["jspec.bundled"]
    pkg = os.path.join(root, "checkpoints")
    covered = {p for pat in patterns for p in glob.glob(pat, root_dir=pkg, recursive=True)
               if os.path.isfile(os.path.join(pkg, p))}
    files = {os.path.relpath(os.path.join(r, f), pkg)
             for r, _, fs in os.walk(os.path.join(pkg, "drafters")) for f in fs}
    assert files and "drafters/smollm2-135m/tuned.json" in files and files <= covered, sorted(files - covered)[:5]
