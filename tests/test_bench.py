"""`jspec bench` (the canonical benchmark) and the provenance every result file carries."""
import json
import subprocess

import pytest

from jspec import bench, provenance


# ---------------------------------------------------------------------------------------------- provenance

def _repo(tmp_path):
    root = tmp_path / "repo"
    (root / "jspec").mkdir(parents=True)
    (root / "jspec" / "a.py").write_text("x = 1\n")
    (root / "bench" / "results").mkdir(parents=True)
    (root / "bench" / "results" / "r.json").write_text("{}")
    (root / "pyproject.toml").write_text("[project]\n")
    git = lambda *a: subprocess.run(["git", "-C", str(root), *a], check=True, capture_output=True)
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c")
    return root


def test_provenance_ties_the_tree_to_its_commit(tmp_path):
    root = _repo(tmp_path)
    clean = provenance.source_state(root, env={})
    assert clean["verified"] and not clean["dirty"] and len(clean["commit"]) == 40
    assert clean["tree_hash"] == provenance.commit_hash("HEAD", root)
    (root / "bench" / "results" / "r.json").write_text('{"new": 1}')   # results are not source
    assert not provenance.source_state(root, env={})["dirty"]
    (root / "jspec" / "a.py").write_text("x = 2\n")
    dirty = provenance.source_state(root, env={})
    assert dirty["dirty"] and dirty["tree_hash"] != clean["tree_hash"]
    with pytest.raises(provenance.ProvenanceError, match="differ from commit"):
        provenance.record(root=root, env={})
    assert provenance.record(root=root, env={}, allow_dirty=True)["dirty"] is True


def test_provenance_without_git_checks_the_commit_passed_in(tmp_path):
    root = _repo(tmp_path)
    tok = provenance.token(root)
    sha, want = tok.split(":")
    subprocess.run(["rm", "-rf", str(root / ".git")], check=True)
    assert provenance.source_state(root, env={})["verified"] is False       # nothing to tie it to
    with pytest.raises(provenance.ProvenanceError, match="no commit"):
        provenance.record(root=root, env={})
    ok = provenance.source_state(root, env={"JSPEC_COMMIT": tok})
    assert ok == dict(commit=sha, verified=True, dirty=False, tree_hash=want)
    (root / "jspec" / "a.py").write_text("x = 3\n")
    assert provenance.source_state(root, env={"JSPEC_COMMIT": tok})["dirty"] is True
    with pytest.raises(provenance.ProvenanceError, match="sha>:<source hash"):
        provenance.source_state(root, env={"JSPEC_COMMIT": sha})


# ---------------------------------------------------------------------------------------------- pieces

def test_method_specs_parse_and_refuse_bad_ones():
    m = bench.MethodSpec.parse("vegas+lookup8:select_page=8,budget=256")
    assert (m.method, dict(m.knobs)) == ("vegas", {"lookup": 8, "select_page": 8, "budget": 256})
    assert dict(bench.MethodSpec.parse("longspec:tree_widths=2-4-4").knobs) == {"tree_widths": (2, 4, 4)}
    got = bench.split_methods("ar,vegas:select_page=8,budget=256,longspec+lookup4,quest")
    assert [(m.method, dict(m.knobs)) for m in got] == [("ar", {}), ("vegas", {"select_page": 8, "budget": 256}),
                                                        ("longspec", {"lookup": 4}), ("quest", {})]
    for bad, msg in [("nope", "unknown method"), ("vegas:frob=1", "unknown knob"), ("vegas:gamma", "key=value"),
                     ("ar:gamma=2", "no knobs"), ("vegas+lookupx", "positive N"), ("ar+lookup4", "no knobs"),
                     ("ar:loop=decode", r"'ar' \(plain decoding\) takes no knobs"),   # the old loop's A/B: gone
                     ("vegas:loop=decode", "unknown knob"), ("streaming:select_page=8", "is a vegas option")]:
        with pytest.raises(bench.BenchError, match=msg):
            bench.MethodSpec.parse(bad)


def test_differences_and_distinct_share():
    ref = [[1, 2, 3], [4, 5, 6], [7, 8]]
    got = [[1, 2, 3], [4, 9, 6], [7, 8, 0]]
    assert bench.differences(ref, got) == [dict(row=1, position=1, ar_token=5, token=9),
                                           dict(row=2, position=2, ar_token=None, token=0)]
    assert bench.distinct_share([[1, 1, 1, 1], [1, 2, 3, 4]]) == pytest.approx((0.25 + 1.0) / 2)


class _Chars:
    """A tokenizer whose decode inverts encode (one id per character), without a chat template."""
    eos_token_id = None

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def test_long_tasks_are_ragged_mixed_and_within_length():
    tok = _Chars()
    texts = bench._Texts(tok, *bench.text_sources(None))
    L, B = 2000, 8
    rows = bench.long_tasks(tok, texts, L, B)
    lens = [len(p.tokens) for p in rows]
    assert all(0.9 * L - 16 <= n <= L for n in lens) and len(set(lens)) > B // 2
    assert [p.kind for p in rows] == list(bench.KINDS) * 2
    ask = [tok.decode(p.tokens[-200:]) for p in rows if p.kind == "summary"]
    assert all(a.endswith(bench.SUMMARY + "\nAnswer:") for a in ask)   # no chat template: a plain suffix
    questions = [tok.decode(p.tokens[-200:]) for p in rows if p.kind == "question"]
    assert all("?" in q for q in questions)
    assert bench.long_tasks(tok, texts, L, B)[3].tokens == rows[3].tokens    # the same prompts every call
    fixed = bench.continuations(texts, 500, 4)
    assert [len(p.tokens) for p in fixed] == [500] * 4 and fixed[0].tokens != fixed[2].tokens
    # --serial at B=1: that many prompts, the same kinds in turn, each L tokens (a chat prompt may lose a few when
    # its text is re-tokenised; all stay in one 64-token padding bucket, so one compilation)
    serial = bench.make_prompts(tok, "long-tasks", L, 1, texts, serial=6)
    assert all(L - 16 <= len(p.tokens) <= L for p in serial)
    assert [p.kind for p in serial] == list(bench.KINDS) + ["summary", "continue-code"]
    assert len(bench.make_prompts(tok, "long-tasks", L, 1, texts)) == 1
    assert len(bench.make_prompts(tok, "long-tasks", L, 4, texts, serial=6)) == 4   # other B: unchanged


def test_serial_output_sums_the_runs_as_rows_of_one():
    """Prompts decoded one after another read as rows of one run: figures worked out by hand."""
    from jspec.api import Output, Stats
    a = Output(texts=["a"], tokens=[[1, 2, 3, 4, 5]], stats=Stats(
        method="vegas", batch=1, prompt_tokens=[40], new_tokens=[5], prefill_s=0.1, decode_s=0.5, tokens_per_s=8.0,
        tau=1.25, accept_hist=[3, 1, 0], rounds=[4], tau_per_sequence=[1.25], knobs={"gamma": 2}))
    b = Output(texts=["b"], tokens=[[7, 8, 9]], stats=Stats(
        method="vegas", batch=1, prompt_tokens=[40], new_tokens=[3], prefill_s=0.2, decode_s=0.25, tokens_per_s=8.0,
        tau=2.0, accept_hist=[0, 1, 0], rounds=[1], tau_per_sequence=[2.0], knobs={"gamma": 2}))
    out = bench.serial_output([a, b])
    s = out.stats
    assert out.tokens == [[1, 2, 3, 4, 5], [7, 8, 9]] and out.texts == ["a", "b"]
    assert s.new_tokens == [5, 3] and s.prompt_tokens == [40, 40] and s.rounds == [4, 1]
    assert s.decode_s == pytest.approx(0.75) and s.prefill_s == pytest.approx(0.3)
    assert s.tokens_per_s == pytest.approx((4 + 2) / 0.75)      # new tokens after each row's first
    assert s.accept_hist == [3, 2, 0] and s.tau == pytest.approx((3 * 1 + 2 * 2) / 5)
    assert s.tau_per_sequence == [1.25, 2.0] and s.batch == 1 and s.lossless
    ar = Output(texts=["c"], tokens=[[1, 2]], stats=Stats(method="ar", batch=1, prompt_tokens=[9], new_tokens=[2],
                                                          prefill_s=0.1, decode_s=0.1, tokens_per_s=10.0))
    s = bench.serial_output([ar, ar]).stats
    assert s.tau == 1.0 and s.accept_hist is None and s.rounds is None and s.tokens_per_s == pytest.approx(2 / 0.2)


def test_peers_run_extra_rows_a_batch_at_a_time():
    from jspec.peers import batches_of
    rows = [[1], [2, 2], [3], [4]]
    assert batches_of(rows, 4) == [rows] and batches_of(rows[:2], 4) == [rows[:2]]
    assert batches_of(rows, 1) == [[[1]], [[2, 2]], [[3]], [[4]]]
    assert batches_of(rows, 2) == [[[1], [2, 2]], [[3], [4]]]


def test_bad_requests_are_errors_before_any_work(capsys):
    for argv, msg in [(["--methods", "vegas:frob=1"], "unknown knob"), (["--batches", "0"], "positive"),
                      (["--lengths", "x"], "integers"), (["--workload", "nowhere"], "unknown workload"),
                      (["--peers", "vllm"], "unknown peer"), (["--new-tokens", "0"], ">= 1"),
                      (["--reps", "0"], ">= 1"), (["--serial", "0"], "--serial must be >= 1"),
                      (["--replot", "/nonexistent.json"], "cannot read")]:
        assert bench.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and msg in err


def test_bad_knob_values_are_errors_before_any_work():
    """Values only a whole configuration can judge (a verification budget below sink + window, a knob out of
    range) fail when the methods are checked against the model, before ar or any method has run."""
    from conftest import tiny_config
    cfg = tiny_config("llama")
    bench.check_methods(bench.split_methods("ar,vegas:select_page=8,vegas:verify=dustin,verify_budget=512"), cfg)
    for text, msg in [("vegas:verify=dustin,verify_budget=64", "sink + window"), ("streaming:gamma=0", "gamma"),
                      ("vegas:verify=dustin,verify_dense_layers=5-6", "outside the model's 2 layers")]:
        with pytest.raises(bench.BenchError) as e:
            bench.check_methods(bench.split_methods(text), cfg)
        assert str(e.value).startswith(f"method {text!r}") and msg in str(e.value), str(e.value)


# ---------------------------------------------------------------------------------------------- whole runs

@pytest.mark.slow
def test_bench_check_lossless_on_the_real_model(smollm2_ckpt, tmp_path, capsys):
    """The benchmark end to end in float32: every lossless method's rows equal ar's, records and plot written."""
    out = tmp_path / "b.json"
    rc = bench.main(["--model", smollm2_ckpt, "--methods", "vegas+lookup2:budget=64,longspec", "--lengths", "160",
                     "--batches", "3", "--new-tokens", "6", "--check-lossless", "--allow-dirty", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    doc = json.loads(out.read_text())
    assert {r["method"] for r in doc["records"]} == {"ar", "vegas+lookup2:budget=64", "longspec"}
    for r in doc["records"]:
        assert r["differences"] == [] and r["rows_identical_to_ar"] == 1.0 and r["B"] == 3
        assert r["timed"] is False and r["warmup_s"] == 0.0     # a check runs each method once
        assert 0 < r["distinct_token_share"] <= 1 and r["tokens_per_s"] > 0
    assert doc["settings"]["dtype"] == "float32" and doc["summary"]["lossless"]["longspec"] == 1.0
    for k in ("commit", "dirty", "tree_hash", "command", "device", "jax", "xla_flags", "matmul_precision"):
        assert k in doc["provenance"]
    assert doc["provenance"]["matmul_precision"] == "highest"
    assert (tmp_path / "b.png").stat().st_size > 0 and "every row identical to ar" in printed


def test_exact_flags_are_checked_before_any_work(capsys):
    for argv, msg in [(["--exact-cost"], "give --exact too"), (["--exact", "--check-lossless"], "one of them")]:
        assert bench.main(argv) == 2
        assert msg in capsys.readouterr().err


def test_exact_summary_on_a_tiny_model():
    """`--exact` end to end on a tiny bf16 model (Pallas kernels in interpret mode): every method, ar included,
    runs in exact mode, each method's rows equal ar's, and with the cost run the summary gives each method's
    (default - exact) / default tokens/s and their maximum."""
    import jax

    import jspec
    from conftest import CharTokenizer
    from jspec import layers, model
    from jspec.attention import AttnImpl
    from jspec.config import ModelConfig
    cfg = ModelConfig(arch="llama", vocab_size=96, d_model=96, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=64,
                      ffn_dim=96, rope_theta=10000.0, dtype="bfloat16", max_position=512, eos_token_ids=())
    params = model.init_params(cfg, jax.random.key(4), scale=0.3)
    m = jspec.Model(params=params, cfg=cfg, tokenizer=CharTokenizer(), path="tiny")
    exact = AttnImpl(backend="pallas", interpret=True, exact=True)
    assert layers.exact_supported(params, cfg, exact)
    methods = bench.split_methods("vegas+lookup2:gamma=6,budget=16,min_tokens=8")
    records = bench.bench(m, methods=methods, lengths=[40], batches=[2], workload="continue", new=6, reps=1,
                          ignore_eos=True, impl=exact, cost_impl=AttnImpl(backend="pallas", interpret=True),
                          log=lambda *_: None)
    assert [r["method"] for r in records] == ["ar", "vegas+lookup2:gamma=6,budget=16,min_tokens=8"]
    for r in records:
        # both rates are rounded to 0.1 tok/s in the record and the fraction (to 4 places) comes from the raw
        # ones: they agree within 0.1 / d (+ the fraction's rounding); a slow, busy CPU makes d small
        d = r["default_tokens_per_s"]
        assert r["exact"] and d > 0 and abs(r["exact_cost_frac"] - (d - r["tokens_per_s"]) / d) < 0.1 / d + 1e-4
    assert records[0]["rounds_max"] == 5 and 1 <= records[1]["rounds_max"] <= 5   # 6 new: 5 after the prefill's
    s = bench.exact_summary(records)
    assert s["exact_rows_identical_frac_min"] == 1.0 and s["exact_methods"] == [records[1]["method"]]
    assert s["exact_cost_frac_max"] == max(r["exact_cost_frac"] for r in records)
    assert set(s["exact_cost_frac"]) == {"ar", records[1]["method"]}
    # The summary's minimum is over methods and shapes, ar excluded; no cost run: no cost figures.
    fake = [dict(method="ar", rows_identical_to_ar=1.0), dict(method="a", rows_identical_to_ar=0.5),
            dict(method="a", rows_identical_to_ar=1.0), dict(method="b", rows_identical_to_ar=0.75)]
    assert bench.exact_summary(fake) == {"exact_rows_identical_frac_min": 0.5, "exact_methods": ["a", "b"],
                                         "exact_cost_frac_max": None, "exact_cost_frac": {}}


def test_serial_b1_on_a_tiny_model():
    """`--serial` end to end: B=1 runs three prompts of exactly L tokens one at a time as one record per method;
    each row equals its prompt decoded alone through `jspec.generate`, and the rounds of all three share the
    summed decode time."""
    import jax

    import jspec
    from conftest import CharTokenizer
    from jspec import model
    from jspec.attention import AttnImpl
    from jspec.config import ModelConfig
    cfg = ModelConfig(arch="llama", vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                      ffn_dim=96, rope_theta=10000.0, dtype="float32", max_position=512, eos_token_ids=())
    m = jspec.Model(params=model.init_params(cfg, jax.random.key(5), scale=0.3), cfg=cfg, tokenizer=CharTokenizer(),
                    path="tiny")
    impl = AttnImpl(backend="xla")
    texts = bench._Texts(m.tokenizer, *bench.text_sources(None))
    prompts = [p.tokens for p in bench.make_prompts(m.tokenizer, "continue", 40, 1, texts, serial=3)]
    records = bench.bench(m, methods=bench.split_methods("vegas:gamma=3,budget=16"), lengths=[40], batches=[1],
                          workload="continue", new=6, reps=1, ignore_eos=True, impl=impl, serial=3,
                          log=lambda *_: None)
    assert [r["method"] for r in records] == ["ar", "vegas:gamma=3,budget=16"]
    for r in records:
        assert r["B"] == 1 and r["serial"] == 3 and len(r["kinds"]) == 3 and r["new_tokens_mean"] == 6
        assert r["prompt_tokens_min"] == r["prompt_tokens_max"] == 40
        assert r["rows_identical_to_ar"] == 1.0           # f32: vegas is ar's output, row by row
    ar = records[0]
    # 3 prompts x 5 rounds in the summed decode time (decode_s is rounded to 0.1 ms in the record)
    assert ar["rounds_max"] == 5 and ar["round_ms"] == pytest.approx(1000 * ar["decode_s"] / 15, abs=5e-3)
    # the rows themselves: each prompt alone through the public entry equals the serial run's row
    out, _ = bench.run_method(m, bench.MethodSpec.parse("ar"), prompts, new=6, ignore_eos=True, reps=0, impl=impl,
                              serial=True)
    alone = [jspec.generate(m, [p], max_new_tokens=6, ignore_eos=True, impl=impl).tokens[0] for p in prompts]
    assert out.tokens == alone and len({tuple(t) for t in alone}) > 1


# ------------------------------------------------------------------------------------------------ --merge

def _result(tmp_path, name, B, *, commit="c" * 40, exact=True, methods=("ar", "vegas"), complete=True, L=64,
            serial=None):
    """A result file as `jspec bench --exact --exact-cost` writes it, with made-up figures for one shape."""
    recs = []
    for i, m in enumerate(methods):
        tps = 100.0 * (i + 1) * B
        recs.append(dict(method=m, base_method=m, lookup=0, L=L, B=B, tokens_per_s=tps, speedup_vs_ar=float(i + 1),
                         tau=1.0 + i, rows_identical_to_ar=1.0 if i == 0 else 0.5 + B / 128, lossless=True,
                         distinct_token_share=0.2, default_tokens_per_s=tps * 1.25,
                         exact_cost_frac=round(0.2 + 0.01 * B, 4)))
    doc = dict(provenance=dict(commit=commit, tree_hash="t", dirty=False, device="gpu:X", jax="0.11.2",
                               xla_flags="", matmul_precision="default", command=f"bench --batches {B}"),
               settings=dict(methods=list(methods), lengths=[64], batches=[B], workload="long-tasks", exact=True,
                             exact_cost=True, check_lossless=False, new_tokens=8) if exact else
               dict(methods=list(methods), lengths=[64], batches=[B], workload="long-tasks", exact=False,
                    exact_cost=False, check_lossless=False, new_tokens=8),
               complete=complete, wall_s=10.0 + B, records=recs, peers=[], summary={})
    if serial is not None:
        doc["settings"]["serial"] = serial
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path), recs


def test_merge_keeps_each_shape_from_its_own_call(tmp_path, capsys):
    a, ra = _result(tmp_path, "b16.json", 16)
    b, rb = _result(tmp_path, "b64.json", 64)
    out = str(tmp_path / "both.json")
    assert bench.main(["--merge", a, b, "--out", out]) == 0
    assert "from 2 runs" in capsys.readouterr().out
    doc = json.load(open(out))
    assert [(r["B"], r["method"], r["run"]) for r in doc["records"]] == [(16, "ar", 0), (16, "vegas", 0),
                                                                         (64, "ar", 1), (64, "vegas", 1)]
    assert [r["tokens_per_s"] for r in doc["records"]] == [r["tokens_per_s"] for r in ra + rb]
    assert doc["settings"]["batches"] == [16, 64] and doc["complete"] is True and doc["wall_s"] == 26 + 74
    assert [(r["file"], r["shapes"]) for r in doc["provenance"]["runs"]] == [("b16.json", ["L64_B16"]),
                                                                              ("b64.json", ["L64_B64"])]
    s = doc["summary"]
    assert s["L64_B16"]["speedup_vs_ar"] == {"vegas": 2.0} and s["L64_B64"]["ar_tokens_per_s"] == 6400.0
    # the exact summary over both calls: the least identical share (B=16's 0.625) and the largest cost (B=64's)
    assert s["exact_rows_identical_frac_min"] == 0.5 + 16 / 128
    assert s["exact_cost_frac"] == {"ar": 0.84, "vegas": 0.84} and s["exact_cost_frac_max"] == 0.84


def test_merge_refuses_what_would_mix_runs(tmp_path, capsys):
    a, _ = _result(tmp_path, "a.json", 16)
    cases = [
        ([a, _result(tmp_path, "same_shape.json", 16)[0]], "must come from one call"),
        ([a, _result(tmp_path, "other_commit.json", 64, commit="d" * 40)[0]], "another source"),
        ([a, _result(tmp_path, "other_settings.json", 64, exact=False)[0]], "other settings"),
        ([a, _result(tmp_path, "no_ar.json", 64, methods=("vegas",))[0]], "no ar record"),
        ([a], "at least two"),
        ([a, str(tmp_path / "missing.json")], "cannot read"),
    ]
    for paths, msg in cases:
        out = tmp_path / "out.json"
        assert bench.main(["--merge", *paths, "--out", str(out)]) == 2
        assert msg in capsys.readouterr().err
        assert not out.exists()
    # --serial shapes only B=1: files without B=1 may differ in it; B=1 shapes run with different counts may not
    b16, b64 = _result(tmp_path, "s16.json", 16, serial=8)[0], _result(tmp_path, "s64.json", 64, serial=1)[0]
    b1 = _result(tmp_path, "s1.json", 1, serial=8)[0]
    assert bench.main(["--merge", b1, b16, b64, "--out", str(tmp_path / "s.json")]) == 0
    assert json.load(open(tmp_path / "s.json"))["settings"]["serial"] == 8
    other = _result(tmp_path, "s1_4.json", 1, serial=4, L=128)[0]
    assert bench.main(["--merge", b1, other, "--out", str(tmp_path / "s2.json")]) == 2
    assert "different --serial" in capsys.readouterr().err and not (tmp_path / "s2.json").exists()
    # a call cut by its time limit stays marked incomplete in the merge
    c, _ = _result(tmp_path, "cut.json", 64, complete=False)
    assert bench.main(["--merge", a, c, "--out", str(tmp_path / "m.json")]) == 0
    assert json.load(open(tmp_path / "m.json"))["complete"] is False
