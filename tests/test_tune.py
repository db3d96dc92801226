"""Vegas' three-stage tuning (jspec/offline/tune.py) and `jspec generate --config`.

- the search rules on a fake measuring function: stage 1 stops at the first ratio whose next step does not
  raise tau by plateau_tol (and never measures past it), stage 2 keeps the fastest gamma at that ratio,
  stage 3 the fastest ratio around it, each config measured once; stage 4 (vegas' page size) the fastest
  page size at that ratio and gamma, single slots on a tie;
- `tune` end to end on a tiny random model (2 ratios x 2 gammas, a few new tokens): the JSON it writes holds
  the chosen values, which are consistent with its own measurements, and rebuilds the same SpecConfig;
- `generate --config FILE` / `jspec.generate(config=...)`: the loaded SpecConfig equals the tuned one, flags
  override the file, output stays lossless, bad files fail with one clear line.
"""
import contextlib
import dataclasses
import io
import json
import math

import jax
import pytest

import jspec
from conftest import CharTokenizer
from jspec import cli, model
from jspec.config import ModelConfig
from jspec.speculative import LongSpecOptions, SpecConfig
from jspec.speculative.config import KNOBS
from jspec.offline.tune import pick_page, read_config, search, tune

RATIOS = [0.01, 0.02, 0.05, 0.1, 0.2]
GAMMAS = [2, 3, 4, 6]


def make_spec(r, g, page=1):
    return SpecConfig("vegas", gamma=g, budget=64, ratio=r, min_tokens=1, select_page=page)


class Fake:
    """measure(spec) from tables: tau by ratio (gamma-independent) and tokens/s by (ratio, gamma)."""

    def __init__(self, tau, tps):
        self.tau, self.tps, self.calls = tau, tps, []

    def __call__(self, spec):
        self.calls.append((spec.ratio, spec.gamma))
        return self.tau(spec.ratio), self.tps(spec.ratio, spec.gamma)


def stage(res, n):
    return [(m["ratio"], m["gamma"]) for m in res["measurements"] if m["stage"] == n]


def test_stage1_stops_at_the_plateau():
    taus = {0.01: 1.5, 0.02: 2.0, 0.05: 2.4, 0.1: 2.41, 0.2: 3.5}   # 0.05 -> 0.1 gains 0.4% < 2%
    f = Fake(lambda r: taus.get(r, 2.2), lambda r, g: 100.0)
    res = search(f, make_spec, ratios=RATIOS, gammas=GAMMAS, gamma0=4, plateau_tol=0.02)
    assert res["stage1_ratio"] == 0.05
    assert stage(res, 1) == [(0.01, 4), (0.02, 4), (0.05, 4), (0.1, 4)]
    assert 0.2 not in {r for r, _ in f.calls}          # nothing is measured past the plateau
    assert len(f.calls) == len(set(f.calls))           # each config measured once (memoised)
    # A looser tolerance: 0.02 -> 0.05 (+20%) is a plateau too.
    res = search(Fake(lambda r: taus.get(r, 1.9), lambda r, g: 1.0), make_spec, ratios=RATIOS, gammas=GAMMAS, gamma0=4,
                 plateau_tol=0.25)
    assert res["stage1_ratio"] == 0.02


def test_stage1_when_tau_never_rises_or_always_rises():
    flat = search(Fake(lambda r: 2.0, lambda r, g: 1.0), make_spec, ratios=RATIOS, gammas=GAMMAS, gamma0=2)
    assert flat["stage1_ratio"] == 0.01 and stage(flat, 1) == [(0.01, 2), (0.02, 2)]
    falling = search(Fake(lambda r: 3.0 - r, lambda r, g: 1.0), make_spec, ratios=RATIOS, gammas=GAMMAS, gamma0=2)
    assert falling["stage1_ratio"] == 0.01
    rising = search(Fake(lambda r: 1.0 + 10 * r, lambda r, g: 1.0), make_spec, ratios=RATIOS[::-1], gammas=GAMMAS,
                    gamma0=2)
    assert rising["stage1_ratio"] == 0.2 and [r for r, _ in stage(rising, 1)] == RATIOS   # ascending order


def test_stage2_picks_the_fastest_gamma_and_stage3_refines_the_ratio():
    taus = {0.01: 1.5, 0.02: 2.0, 0.05: 2.4, 0.1: 2.41, 0.2: 2.42}

    def tps(r, g):   # gamma 3 is fastest everywhere; at gamma 3 a ratio just below 0.05 is fastest
        return 1000.0 - 50 * (g - 3) ** 2 - 1e4 * abs(r - 0.03)

    f = Fake(lambda r: taus.get(r, 2.2), tps)
    res = search(f, make_spec, ratios=RATIOS, gammas=GAMMAS, gamma0=4, plateau_tol=0.02)
    assert res["stage1_ratio"] == 0.05
    assert sorted(g for _, g in stage(res, 2)) == [2, 3, 6]          # gamma 4 at 0.05 was measured in stage 1
    assert res["gamma"] == 3
    # Stage 3 at gamma 3: the grid neighbours of 0.05 and the geometric midpoints towards them.
    assert {r for r, _ in stage(res, 3)} == {0.02, 0.0316, 0.0707, 0.1}
    assert all(g == 3 for _, g in stage(res, 3))
    assert res["ratio"] == 0.0316                                     # the fastest, closest to 0.03
    assert len(f.calls) == len(set(f.calls))


def test_precompile_sees_each_stage_before_it_is_measured():
    taus = {0.01: 1.5, 0.02: 2.0, 0.05: 2.4, 0.1: 2.41, 0.2: 2.5}
    f = Fake(lambda r: taus.get(r, 2.2), lambda r, g: 100.0 - g)
    batches = []

    def precompile(specs):
        assert all((s.ratio, s.gamma) not in f.calls for s in specs)    # never a config already measured
        batches.append([(s.ratio, s.gamma) for s in specs])

    res = search(f, make_spec, ratios=RATIOS, gammas=GAMMAS, gamma0=4, plateau_tol=0.02, precompile=precompile,
                 lookahead=2)
    # Stage 1 two ratios at a time (up to the plateau at 0.05: 0.1 shows it), stage 2 the gammas not yet
    # measured at 0.05, stage 3 the ratios around 0.05 at gamma 2.
    assert batches[0] == [(0.01, 4), (0.02, 4)] and batches[1] == [(0.05, 4), (0.1, 4)]
    assert batches[2] == [(0.05, 2), (0.05, 3), (0.05, 6)] and res["gamma"] == 2
    assert sorted(batches[3]) == sorted([(0.0316, 2), (0.02, 2), (0.0707, 2), (0.1, 2)])
    assert len(batches) == 4 and (0.2, 4) not in f.calls
    assert all(c in sum(batches, []) for c in f.calls)                 # everything measured was announced


def test_search_default_gamma0_and_bad_grids():
    res = search(Fake(lambda r: 2.0, lambda r, g: 1.0), make_spec, ratios=[0.1, 0.2], gammas=[8, 2, 4])
    assert stage(res, 1)[0] == (0.1, 4)                              # the median candidate
    with pytest.raises(jspec.InputError, match="at least one"):
        search(Fake(lambda r: 2.0, lambda r, g: 1.0), make_spec, ratios=[], gammas=[2])


def test_stage4_keeps_the_fastest_page_size_single_slots_on_a_tie():
    speed = {1: 100.0, 8: 130.0, 16: 120.0}
    calls, announced = [], []

    def measure(spec):
        calls.append((spec.ratio, spec.gamma, spec.options.select_page))
        return 2.0, speed[spec.options.select_page] if spec.gamma == 3 else 1.0

    found = search(measure, make_spec, ratios=[0.1, 0.2], gammas=[2, 3], plateau_tol=0.5)
    assert found["gamma"] == 3 and "select_page" not in found
    n = len(calls)
    res = pick_page(measure, make_spec, found, [16, 1, 8], precompile=lambda specs: announced.extend(
        (s.ratio, s.gamma, s.options.select_page) for s in specs))
    assert res["select_page"] == 8 and (res["ratio"], res["gamma"]) == (found["ratio"], found["gamma"])
    new = res["measurements"][n:]
    assert [(m["stage"], m["select_page"]) for m in new] == [(4, 8), (4, 16)]   # single slots: already measured
    assert calls[n:] == [(found["ratio"], 3, 8), (found["ratio"], 3, 16)] and announced == calls[n:]
    assert res["measurements"][:n] == found["measurements"]
    # A tie keeps single slots; (1,) measures nothing; without 1 the fastest page wins even if slower.
    speed[8] = speed[16] = 100.0
    assert pick_page(measure, make_spec, found, [1, 8, 16])["select_page"] == 1
    n = len(calls)
    assert pick_page(measure, make_spec, found, [1])["select_page"] == 1 and len(calls) == n
    speed[16] = 50.0
    assert pick_page(measure, make_spec, found, [16])["select_page"] == 16
    with pytest.raises(jspec.InputError, match="page sizes"):
        pick_page(measure, make_spec, found, [0, 16])


# ----------------------------------------------------------------------------------- tune on a tiny model

def tiny_model():
    cfg = ModelConfig(arch="llama", vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                      ffn_dim=96, rope_theta=10000.0, dtype="float32", max_position=256, eos_token_ids=())
    params = model.init_params(cfg, jax.random.key(1), scale=0.3)
    return jspec.Model(params=params, cfg=cfg, tokenizer=CharTokenizer(), path="tiny")


TUNE_ARGS = dict(prompt_tokens=40, batch=2, max_new_tokens=6, ratios=[0.1, 0.5], gammas=[1, 2], reps=1)


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


@pytest.fixture(scope="module")
def tuned(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("tune") / "tune.json"
    lines = []
    res = tune(tiny, **TUNE_ARGS, progress=False, log=lines.append, out=str(path))
    return res, path, lines


def test_tune_writes_a_consistent_config(tuned):
    res, path, lines = tuned
    on_disk = json.loads(path.read_text())
    assert on_disk == json.loads(json.dumps(res))
    assert res["method"] == "vegas" and res["gamma"] in TUNE_ARGS["gammas"]
    ms = res["measurements"]
    assert 0.1 <= res["ratio"] <= 0.5 and res["ratio"] in {m["ratio"] for m in ms}
    assert {m["stage"] for m in ms} <= {1, 2, 3, 4}
    assert len(ms) == len({(m["ratio"], m["gamma"], m["select_page"]) for m in ms})
    assert all(m["tau"] >= 1.0 and m["tokens_per_s"] > 0 for m in ms)
    # The choice agrees with the measurements: with two candidate ratios, stage 3 measures both and their
    # geometric midpoint at the chosen gamma and keeps the fastest; that gamma is the fastest at the
    # stage-1 ratio.
    at_g = [m for m in ms if m["gamma"] == res["gamma"]]
    assert {m["ratio"] for m in at_g} == {0.1, 0.224, 0.5}
    assert res["tokens_per_s"] == max(m["tokens_per_s"] for m in at_g)
    at_r1 = [m for m in ms if m["ratio"] == res["stage1_ratio"]]
    assert {m["gamma"] for m in at_r1} == set(TUNE_ARGS["gammas"])
    assert max(at_r1, key=lambda m: m["tokens_per_s"])["gamma"] == res["gamma"]
    # Static width covers ratio * (prompt + new tokens); min_tokens keeps the smallest ratio unclamped.
    context = TUNE_ARGS["prompt_tokens"] + TUNE_ARGS["max_new_tokens"]
    assert res["budget"] >= res["ratio"] * context and res["budget"] % 8 == 0
    # Stage 4 (default pages 1, 8, 16): pages of 8 and 16 measured at the chosen ratio and gamma, the fastest
    # kept (single slots on a tie), and every measured budget holds whole pages.
    paged = [m for m in ms if m["stage"] == 4]
    assert [(m["ratio"], m["gamma"], m["select_page"]) for m in paged] == [(res["ratio"], res["gamma"], p)
                                                                           for p in (8, 16)]
    single = next(m for m in ms if (m["ratio"], m["gamma"], m["select_page"]) == (res["ratio"], res["gamma"], 1))
    cands = [(single["tokens_per_s"], 1)] + [(m["tokens_per_s"], m["select_page"]) for m in paged]
    assert res["select_page"] == max(cands, key=lambda c: c[0])[1]
    assert res["pages"] == [1, 8, 16] and all(m["budget"] % math.lcm(8, m["select_page"]) == 0 for m in ms)
    assert any("pages of 8 " in ln for ln in lines) and any("pages of 16" in ln for ln in lines)
    assert res["min_tokens"] <= 0.1 * TUNE_ARGS["prompt_tokens"]
    assert (res["prompt_tokens"], res["batch"], res["model"]) == (40, 2, "tiny")
    assert res["device"].startswith("cpu") and res["jax"] == jax.__version__
    # ar timed on the same prompts, and the chosen config's ratio to it
    assert res["ar_tokens_per_s"] > 0 and res["speedup_vs_ar"] == pytest.approx(res["tokens_per_s"] /
                                                                               res["ar_tokens_per_s"])
    assert lines[0].startswith("ar (plain greedy decoding") and f"{res['speedup_vs_ar']:.2f}x ar" in lines[-1]
    # One progress line per measured config, with its numbers.
    per_config = [ln for ln in lines if ln.startswith("stage")]
    assert len(per_config) == len(ms)
    assert f"tau {ms[0]['tau']:6.3f}" in per_config[0] and "tok/s" in per_config[0]


def test_tuned_config_round_trips(tuned):
    res, path, _ = tuned
    want = SpecConfig(method="vegas", gamma=res["gamma"], budget=res["budget"], ratio=res["ratio"],
                      min_tokens=res["min_tokens"], select_page=res["select_page"])
    assert jspec.api.spec_config(None, str(path)) == want
    assert jspec.api.spec_config(None, res) == want
    assert SpecConfig(**read_config(str(path))) == want
    # Explicit knobs override the file's; the method too.
    assert jspec.api.spec_config(None, str(path), gamma=7, min_tokens=2) == \
        dataclasses.replace(want, gamma=7, min_tokens=2)
    assert jspec.api.spec_config("streaming", str(path)).method == "streaming"
    assert jspec.api.spec_config("ar", str(path)) is None


def test_cli_generate_with_config_is_lossless(tuned, tiny, monkeypatch, capsys):
    res, path, _ = tuned
    monkeypatch.setattr(jspec, "load", lambda name: tiny)
    # The shapes tune measured at (2 prompts padded to 64, 6 new tokens): the decode loop compiles once.
    argv = ["generate", "--prompt", "tune me", "--batch", "2", "--max-new-tokens", "6", "--json"]
    assert cli.main(argv + ["--config", str(path)]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    knobs = got["stats"]["knobs"]
    assert got["stats"]["method"] == "vegas"
    assert {k: knobs[k] for k in ("gamma", "budget", "ratio", "min_tokens")} == \
        {k: res[k] for k in ("gamma", "budget", "ratio", "min_tokens")}
    assert cli.main(argv + ["--method", "ar"]) == 0
    ar = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["tokens"] == ar["tokens"] and len(ar["tokens"][0]) == 6


def test_cli_flags_override_the_config(tuned, tiny, monkeypatch):
    res, path, _ = tuned
    seen = []

    fields = set(KNOBS)   # the flat knob spellings generate takes

    def fake_generate(m, prompts, *, method, config, **kw):   # the config generate will run
        seen.append((method, jspec.api.spec_config(method, config, **{k: v for k, v in kw.items() if k in fields})))
        return jspec.Output(texts=[""], tokens=[[1]], stats=jspec.Stats(
            method=method, batch=1, prompt_tokens=[1], new_tokens=[1], prefill_s=0.0, decode_s=0.0,
            tokens_per_s=0.0))

    monkeypatch.setattr(jspec, "load", lambda name: tiny)
    monkeypatch.setattr(jspec, "generate", fake_generate)
    want = SpecConfig(method="vegas", gamma=res["gamma"], budget=res["budget"], ratio=res["ratio"],
                      min_tokens=res["min_tokens"], select_page=res["select_page"])
    base = ["generate", "--prompt", "x", "--config", str(path)]
    assert cli.main(base) == 0
    assert seen[-1] == ("vegas", want)
    assert cli.main(base + ["--gamma", "3", "--budget", "32", "--score-mode", "logits"]) == 0
    assert seen[-1] == ("vegas", dataclasses.replace(want, gamma=3, budget=32, score_mode="logits"))
    assert cli.main(base + ["--method", "streaming"]) == 0
    assert seen[-1] == ("streaming", dataclasses.replace(want, method="streaming", options=None))
    assert cli.main(base + ["--method", "ar"]) == 0
    assert seen[-1] == ("ar", None)


def test_cli_tune_writes_the_file(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(jspec, "load", lambda name: tiny)
    out = tmp_path / "sub" / "t.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = cli.main(["tune", "--prompt-tokens", "40", "--batch", "2", "--max-new-tokens", "6", "--ratios",
                       "0.1,0.5", "--gammas", "1,2", "--reps", "1", "--jobs", "2", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["gamma"] in (1, 2) and 0.1 <= res["ratio"] <= 0.5
    assert "stage 1: ratio 0.1" in buf.getvalue() and "chosen:" in buf.getvalue()


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"gamma": 3}', 'names no "method"'),
    ('{"method": "medusa", "gamma": 3}', "unknown speculative method 'medusa'"),
    ('{"method": "vegas", "gamma": "4"}', '"gamma" must be an integer'),
    ('{"method": "vegas", "gamma": 0}', "gamma=0 must be >= 1"),
    ('{"method": "vegas", "ratio": 1.5}', "ratio=1.5 must be in"),
])
def test_bad_config_files_give_one_clear_line(tmp_path, monkeypatch, capsys, content, message):
    path = tmp_path / "cfg.json"
    if content is not None:
        path.write_text(content)
    # No model is needed to reject a bad config: it is read before the weights are.
    monkeypatch.setattr(jspec, "load", lambda name: pytest.fail("loaded the model before checking the config"))
    rc = cli.main(["generate", "--config", str(path), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(jspec.InputError, match="config"):
        read_config(str(path))


def test_tune_rejects_bad_arguments(tiny, tmp_path, capsys):
    with pytest.raises(jspec.InputError, match="unknown speculative method"):
        tune(tiny, method="medusa", progress=False)
    with pytest.raises(jspec.InputError, match="ratio 2.0 must be in"):
        tune(tiny, ratios=[0.1, 2.0], progress=False)
    with pytest.raises(jspec.InputError, match="exceed the model's context"):
        tune(tiny, prompts=[[5] * 250], max_new_tokens=10, progress=False)
    assert cli.main(["tune", "--ratios", "0.1,abc"]) == 2
    assert "--ratios must be a comma-separated list of float" in capsys.readouterr().err
    assert cli.main(["tune", "--method", "streaming", "--pages", "1,16"]) == 2
    assert "--pages applies to --method vegas only" in capsys.readouterr().err
    with pytest.raises(jspec.InputError, match="page sizes"):
        tune(tiny, pages=[0, 16], progress=False)


def test_dir_prompts_take_turns_over_the_files(tmp_path):
    from jspec.data import dir_prompts
    tok = CharTokenizer()
    import random
    rnd = random.Random(0)   # aperiodic text: slices at different offsets differ
    (tmp_path / "a_code.py").write_text("".join(rnd.choice("abcdefghijklm") for _ in range(500)))
    (tmp_path / "b_prose.txt").write_text("".join(rnd.choice("0123456") for _ in range(300)))
    (tmp_path / "ignored.bin").write_text("not a text file")
    src = [tok.encode((tmp_path / n).read_text()) for n in ("a_code.py", "b_prose.txt")]
    rows = dir_prompts(str(tmp_path), tok, 100, 5)
    assert [len(r) for r in rows] == [100] * 5
    for i, r in enumerate(rows):
        t = src[i % 2]
        assert any(t[s:s + 100] == r for s in range(len(t) - 99)), i     # a contiguous slice of its own file
    assert rows[0] != rows[2] != rows[4] and rows[0] != rows[4] and rows[1] != rows[3]
    assert dir_prompts(str(tmp_path), tok, 100, 1) == rows[:1]              # one row: the first file only
    with pytest.raises(ValueError, match=r"shorter than 400 tokens .*b_prose.txt \(300\)"):
        dir_prompts(str(tmp_path), tok, 400, 2)
    with pytest.raises(FileNotFoundError, match="no text files"):
        dir_prompts(str(tmp_path / "missing"), tok, 10, 2)


def test_cli_tune_prompt_dir_reaches_tune(tiny, tmp_path, monkeypatch, capsys):
    from jspec.data import dir_prompts
    from jspec.offline import tune as tune_mod
    (tmp_path / "a.py").write_text("def f(x):\n    return x + 1\n" * 20)
    (tmp_path / "b.txt").write_text("It was a truth universally acknowledged. " * 20)
    seen = {}
    monkeypatch.setattr(jspec, "load", lambda name: tiny)
    monkeypatch.setattr(tune_mod, "tune", lambda m, **kw: seen.update(kw) or {"method": kw["method"]})
    assert cli.main(["tune", "--prompt-dir", str(tmp_path), "--prompt-tokens", "40", "--batch", "4"]) == 0
    assert seen["prompts"] == dir_prompts(str(tmp_path), tiny.tokenizer, 40, 4) and seen["batch"] == 4
    assert cli.main(["tune", "--prompt-dir", str(tmp_path), "--prompt-file", str(tmp_path / "a.py")]) == 2
    assert "not both" in capsys.readouterr().err
    assert cli.main(["tune", "--prompt-dir", str(tmp_path), "--prompt-tokens", "5000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "shorter than 5000 tokens" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------ LongSpec draft shapes

def test_tune_longspec_keeps_the_fastest_shape_and_stays_lossless(tiny, tmp_path, capsys):
    from jspec.drafter import Drafter, init_drafter_params

    drafter = Drafter(params=init_drafter_params(tiny.cfg, jax.random.key(3), target_params=tiny.params),
                      cfg=tiny.cfg, window=16, meta={})
    path, lines = tmp_path / "ls.json", []
    trees = [(1, 1, 1), (2, 2, 2)]
    res = tune(tiny, method="longspec", trees=trees, drafter=drafter, prompt_tokens=40, batch=2, max_new_tokens=6,
               reps=1, progress=False, log=lines.append, out=str(path))
    ms = res["measurements"]
    assert [m["tree_widths"] for m in ms] == [[1, 1, 1], [2, 2, 2]] and [m["mode"] for m in ms] == ["chain", "tree"]
    assert all(m["tau"] >= 1.0 and m["tokens_per_s"] > 0 for m in ms)
    best = max(ms, key=lambda m: m["tokens_per_s"])
    assert res["tokens_per_s"] == best["tokens_per_s"] and res["mode"] == best["mode"] and res["gamma"] == 3
    if best["mode"] == "tree":
        assert list(res["tree_widths"]) == [2, 2, 2]
    assert json.loads(path.read_text()) == json.loads(json.dumps(res))
    assert sum(ln.startswith(("chain", "tree ")) for ln in lines) == 2 and lines[-1].startswith("chosen:")
    assert lines[0].startswith("ar (plain") and res["speedup_vs_ar"] == pytest.approx(res["tokens_per_s"] /
                                                                                      res["ar_tokens_per_s"])
    spec = SpecConfig(**read_config(str(path)))
    assert (spec.method, spec.options.mode, spec.gamma, spec.options.window) == ("longspec", res["mode"], 3, 16)
    # the tuned config decodes exactly what plain greedy decoding does
    prompts = ["tune the tree", "and its batch"]
    out = jspec.generate(tiny, prompts, config=str(path), drafter=drafter, max_new_tokens=6, ignore_eos=True)
    ar = jspec.generate(tiny, prompts, method="ar", max_new_tokens=6, ignore_eos=True)
    assert out.tokens == ar.tokens
    with pytest.raises(jspec.InputError, match="non-empty list of integers >= 1"):
        tune(tiny, method="longspec", trees=[(2, 0)], drafter=drafter, progress=False)
    assert cli.main(["tune", "--method", "longspec", "--trees", "1,x"]) == 2
    assert "--trees must be a comma-separated list of int" in capsys.readouterr().err


def test_the_chosen_line_says_when_plain_decoding_is_faster():
    from jspec.offline.tune import _ar_note, _vs_ar

    assert _vs_ar(80.0, 100.0) == {"ar_tokens_per_s": 100.0, "speedup_vs_ar": 0.8} and _vs_ar(80.0, None) == {}
    assert "0.80x ar" in _ar_note({"speedup_vs_ar": 0.8}) and "plain decoding is faster" in _ar_note({"speedup_vs_ar": 0.8})
    assert _ar_note({"speedup_vs_ar": 1.25}) == " (1.25x ar)" and _ar_note({}) == ""


def test_generate_drafts_the_drafters_tuned_shape(tiny, tmp_path, monkeypatch, capsys):
    """A longspec run that names no shape drafts the one the drafter was tuned with for its batch size (slots
    when serving); named widths / mode win; `tune --save-shape` records the chosen shape; output stays
    plain greedy's."""
    from jspec.drafter import init_drafter_params, load_drafter, save_drafter, write_shape

    d = str(tmp_path / "drafter")
    save_drafter(d, init_drafter_params(tiny.cfg, jax.random.key(3), target_params=tiny.params), tiny.cfg,
                 window=16, dtype="float32")
    write_shape(d, 1, (2, 2))
    write_shape(d, 2, (1, 1, 1))                                     # all ones: a chain of 3

    def run(prompts, **kw):
        out = jspec.generate(tiny, prompts, method="longspec", drafter=d, max_new_tokens=6, ignore_eos=True, **kw)
        k = out.stats.knobs
        return out, (k["mode"], tuple(k["tree_widths"]) if k["mode"] == "tree" else k["gamma"])

    one, two = ["tune the tree"], ["tune the tree", "and its batch"]
    ar = jspec.generate(tiny, two, method="ar", max_new_tokens=6, ignore_eos=True)
    out, shape = run(one)
    assert shape == ("tree", (2, 2)) and out.tokens == ar.tokens[:1]
    out, shape = run(two)
    assert shape == ("chain", 3) and out.tokens == ar.tokens
    assert run(two, slots=1)[1] == ("tree", (2, 2))                  # one slot: batch 1's shape
    assert run(two, tree_widths=(3,))[1] == ("tree", (3,))
    assert run(one, mode="chain")[1] == ("chain", 4)
    assert run(one, gamma=2)[1] == ("tree", LongSpecOptions.tree_widths)  # a named gamma: no tuned shape
    # The CLI passes flags through as given: no --widths means the tuned shape.
    monkeypatch.setattr(jspec, "load", lambda name: tiny)
    argv = ["generate", "--method", "longspec", "--drafter", d, "--prompt", "hi", "--max-new-tokens", "4", "--json"]
    for extra, want in (([], [2, 2]), (["--widths", "3,1"], [3, 1])):
        assert cli.main(argv + extra) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stats"]["knobs"]["tree_widths"] == want
    # tune --save-shape: the chosen shape becomes the drafter's at that batch size.
    rc = cli.main(["tune", "--method", "longspec", "--drafter", d, "--trees", "2,1", "--batch", "2",
                   "--prompt-tokens", "40", "--max-new-tokens", "4", "--reps", "1", "--jobs", "1",
                   "--out", str(tmp_path / "t.json"), "--save-shape"])
    assert rc == 0 and "saved draft widths 2,1 for batch 2" in capsys.readouterr().out
    assert load_drafter(d).shapes == ((1, (2, 2)), (2, (2, 1)))
    assert cli.main(["tune", "--method", "vegas", "--save-shape"]) == 2
    assert "--save-shape applies to --method longspec only" in capsys.readouterr().err
