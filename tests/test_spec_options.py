"""SpecConfig's options objects: shared knobs on SpecConfig, one options object per method (issue 28 part 4).

Each options class checks its own values; a knob of another method is an InputError naming that method; the
flat spelling (keywords, config files, `describe()`) builds the same SpecConfig; config files written before the
options objects (every method's knobs, flat) still load.
"""
import dataclasses
import json

import pytest

import jspec
from jspec.errors import InputError
from jspec.speculative import (LongSpecOptions, QuestOptions, SpecConfig, StreamingOptions, VegasOptions,
                               Verify)
from jspec.speculative.config import KNOBS, SHARED, read_config

# A vegas config as the flat SpecConfig (before the options objects) wrote it: every method's knobs.
OLD_VEGAS = {"method": "vegas", "gamma": 3, "budget": 64, "sink": 4, "page_size": 16, "ratio": 0.05,
             "min_tokens": 16, "max_tokens": None, "score_mode": "weights", "collect": "c2q", "mode": "tree",
             "tree_widths": [4, 16, 16, 16, 16], "window": 512, "topk": "select", "select_page": 8, "lookup": 0,
             "verify": {"kind": "dense", "budget": 512, "sink": 4, "window": 64, "m": None, "page": None,
                        "refresh": 0, "decay": 0.0, "signals": "hybrid", "target_heads": None,
                        "draft_heads": None, "dense_layers": [], "profile": None},
             "tau": 2.5, "tokens_per_s": 100.0, "measurements": []}
OLD_LONGSPEC = {**OLD_VEGAS, "method": "longspec", "mode": "chain", "gamma": 5, "window": 16, "select_page": 1,
                "ratio": None, "min_tokens": 256}

SPECS = [SpecConfig("ar"),
         SpecConfig("streaming", gamma=3, budget=32, sink=2, ratio=0.1, min_tokens=8),
         SpecConfig("quest", budget=32, page_size=4, lookup=2),
         SpecConfig("vegas", budget=64, select_page=8, collect="all", score_mode="logits", topk="sort"),
         SpecConfig("vegas", verify=Verify("dustin", budget=128, target_heads=((1, 2),))),
         SpecConfig("longspec", tree_widths=(2, 4, 3), window=8, lookup=5),
         SpecConfig("longspec", mode="chain", gamma=3, window=8)]


@pytest.mark.parametrize("cls, kw, match", [
    (StreamingOptions, dict(sink=-1), "sink=-1 must be >= 0"),
    (QuestOptions, dict(page_size=0), "page_size=0 must be >= 1"),
    (VegasOptions, dict(select_page=0), "select_page=0 must be >= 1"),
    (VegasOptions, dict(score_mode="probs"), "score_mode"),
    (VegasOptions, dict(collect="some"), "collect"),
    (VegasOptions, dict(topk="heap"), "topk"),
    (LongSpecOptions, dict(mode="forest"), "mode='forest'"),
    (LongSpecOptions, dict(tree_widths=()), "tree_widths"),
    (LongSpecOptions, dict(tree_widths=(2, 0)), "tree_widths"),
])
def test_each_options_class_rejects_bad_values(cls, kw, match):
    with pytest.raises(InputError, match=match):
        cls(**kw)


@pytest.mark.parametrize("method, kw, match", [
    (dict(method="streaming", options=StreamingOptions(sink=8)), {}, "budget=4 must be >= sink=8"),
    (dict(method="quest", options=QuestOptions(page_size=8)), {}, "at least one page"),
    (dict(method="vegas", options=VegasOptions(select_page=3)), {}, "multiple of select_page=3"),
    (dict(method="longspec", options=LongSpecOptions(window=3)), {}, "window=3"),
])
def test_options_checked_against_the_shared_knobs(method, kw, match):
    with pytest.raises(InputError, match=match):
        SpecConfig(**method, budget=4, **kw)


@pytest.mark.parametrize("method, knob, owner", [
    ("vegas", dict(sink=2), "streaming"),
    ("streaming", dict(select_page=8), "vegas"),
    ("quest", dict(tree_widths=(2, 2)), "longspec"),
    ("longspec", dict(page_size=4), "quest"),
    ("ar", dict(score_mode="logits"), "vegas"),
])
def test_a_knob_of_another_method_is_rejected(method, knob, owner):
    (name,) = knob
    with pytest.raises(InputError, match=f"{name} is a {owner} option; method '{method}' takes"):
        SpecConfig(method, **knob)
    if method != "ar":   # jspec.generate's keywords ("ar" rejects every speculative knob)
        with pytest.raises(InputError, match=f"{name} is a {owner} option"):
            jspec.api.spec_config(method, None, **knob)


@pytest.mark.parametrize("kw", [dict(budget=64), dict(ratio=0.1), dict(min_tokens=16, max_tokens=128)])
def test_a_draft_budget_for_longspec_is_rejected_not_ignored(kw):
    """LongSpec drafts with its trained drafter: a sparse-draft budget given to it would be silently ignored."""
    with pytest.raises(InputError, match=r"only apply to the sparse drafts of streaming, quest and vegas"):
        jspec.api.spec_config("longspec", **kw)
    assert jspec.api.spec_config("vegas", **kw).method == "vegas"   # the self-speculative methods take them
    # a config file's shared knobs (e.g. another method's tuned budget, or an old longspec file) are defaults
    assert jspec.api.spec_config("longspec", {**OLD_VEGAS}).method == "longspec"


def test_an_options_object_of_another_method_is_rejected():
    with pytest.raises(InputError, match="method 'quest' takes QuestOptions, got VegasOptions"):
        SpecConfig("quest", options=VegasOptions())
    with pytest.raises(InputError, match="method 'ar' takes no options"):
        SpecConfig("ar", options=StreamingOptions())


def test_flat_keywords_build_the_options_object():
    assert SpecConfig("vegas", budget=64, select_page=8) == SpecConfig("vegas", budget=64,
                                                                      options=VegasOptions(select_page=8))
    assert SpecConfig("vegas").options == VegasOptions() and SpecConfig("ar").options is None
    spec = SpecConfig("longspec", tree_widths=[2, 2], window=8)        # a list: stored as a tuple (hashable)
    assert spec.options == LongSpecOptions(tree_widths=(2, 2), window=8) and hash(spec) == hash(
        SpecConfig("longspec", options=LongSpecOptions(tree_widths=(2, 2), window=8)))
    # dataclasses.replace takes the flat spelling too; a new method starts from its own defaults
    assert dataclasses.replace(spec, mode="chain").options == LongSpecOptions(mode="chain", tree_widths=(2, 2),
                                                                              window=8)
    assert dataclasses.replace(spec, method="quest", options=None).options == QuestOptions()
    assert set(KNOBS) >= {"gamma", "budget", "sink", "page_size", "select_page", "tree_widths", "verify"}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.method)
def test_describe_round_trips(spec):
    flat = spec.describe()
    assert SpecConfig(**flat) == spec
    assert set(flat) <= set(KNOBS) and "options" not in flat
    own = set() if spec.options is None else set(dataclasses.asdict(spec.options))
    assert set(flat) == set(SHARED) | own   # the shared knobs and the method's own, no other method's
    if spec.method != "ar":        # through a JSON file
        assert SpecConfig(**read_config(json.loads(json.dumps(flat)))) == spec
        assert jspec.api.spec_config(None, json.loads(json.dumps(flat))) == spec


def test_old_flat_json_configs_load(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(OLD_VEGAS))
    want = SpecConfig("vegas", gamma=3, budget=64, ratio=0.05, min_tokens=16, select_page=8)
    assert SpecConfig(**read_config(str(path))) == want
    assert jspec.api.spec_config(None, str(path)) == want
    assert SpecConfig(**read_config(OLD_LONGSPEC)) == SpecConfig("longspec", mode="chain", gamma=5, budget=64,
                                                              window=16)
    # another method through an old file: the file's shared knobs, that method's defaults
    assert jspec.api.spec_config("streaming", str(path)) == SpecConfig("streaming", gamma=3, budget=64, ratio=0.05,
                                                                       min_tokens=16)
    # another method's knob away from its default never applied: a clear error, naming the file
    path.write_text(json.dumps({**OLD_VEGAS, "page_size": 4}))
    with pytest.raises(InputError, match=r"old.json: \"page_size\" is a quest option; this config's method is "
                                         r"'vegas'"):
        read_config(str(path))
