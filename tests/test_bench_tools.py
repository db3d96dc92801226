"""bench/hlo_fusions.py: reading what XLA fused from a real optimized-HLO dump (CPU, a few seconds); bench/common.py's
profiler-trace tables on a hand-built trace; bench/profile_step.py end to end on a tiny model (CPU, ~30 s)."""
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import common, hlo_fusions  # noqa: E402

PROGRAM = """
import jax, jax.numpy as jnp
# three fusions of one kind, so XLA numbers them (name.1, name.2) as it does in the model's loops
f = jax.jit(lambda x, y: (jnp.sin(x) * y, jnp.exp(x).sum(axis=0), jnp.cos(x[:3]) * y, jnp.cos(x[:5]) * y))
jax.block_until_ready(f(jnp.ones((64, 64)), 3.0))
"""


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    d = tmp_path_factory.mktemp("dump")
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={d} --xla_dump_hlo_as_text", "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, "-c", PROGRAM], check=True, env=env, timeout=120)
    return str(d)


def _fusions(dump):
    """(fusion instruction name, its line) of the dumped module that computes the lambda."""
    for path in glob.glob(os.path.join(dump, "*after_optimizations.txt")):
        text = open(path).read()
        if "sine" in text:
            return re.findall(r"%([\w.\-]+) = \S+ fusion\(.*", text), text
    raise AssertionError("no module with the lambda's sine")


def test_describe_finds_each_fusion_and_its_ops(dump):
    names, text = _fusions(dump)
    assert any("." in n for n in names), f"no numbered fusion name to map ({names})"
    trace_names = [n.replace(".", "_") for n in names]          # as a profiler trace spells them
    res = hlo_fusions.describe(dump, trace_names + ["no_such_fusion_7"])
    assert res["fusions"]["no_such_fusion_7"] is None
    ops = {}
    for n in trace_names:
        d = res["fusions"][n]
        assert d is not None, n
        assert d["instruction"].split(" ")[-1] != "", d
        ops.update(d["ops"])
        assert all(k not in ("parameter", "constant") for k in d["ops"])
    # the lambda's sine, multiply and exponential each sit in some fusion, and the op counts match the text
    for op in ("sine", "multiply", "exponential"):
        assert ops.get(op, 0) >= 1, (op, ops)
        assert len(re.findall(rf" {op}\(", text)) >= ops[op]


def test_describe_without_dump_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no \\*after_optimizations.txt"):
        hlo_fusions.describe(str(tmp_path), ["x"])


def test_kernel_table_sums_device_events_per_call(tmp_path):
    """Device-side complete events ('X') are summed per name and divided by the call count; host events and
    other phases are left out; kinds come from the first matching pattern."""
    import gzip
    import json
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
              {"ph": "X", "pid": 1, "name": "flash_scores_kernel", "dur": 30.0},
              {"ph": "X", "pid": 1, "name": "flash_scores_kernel", "dur": 10.0},
              {"ph": "X", "pid": 1, "name": "loop_pad_fusion_3", "dur": 4.0},
              {"ph": "X", "pid": 2, "name": "flash_scores_kernel", "dur": 999.0},
              {"ph": "i", "pid": 1, "name": "marker"}]
    d = tmp_path / "plugins" / "profile" / "run"
    d.mkdir(parents=True)
    with gzip.open(d / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    tab = common.kernel_table(common.read_trace(str(tmp_path)), 2)
    assert tab == {"flash_scores_kernel": [20.0, 1.0], "loop_pad_fusion_3": [2.0, 0.5]}
    assert common.read_trace(str(tmp_path / "plugins" / "none")) is None
    assert [common.kind(n) for n in ("flash_scores_kernel", "nvjet_tst_64x8", "loop_pad_fusion_3", "memset32")] == \
        ["flash_scores", "gemm", "other fusion", "memcpy"]


def _write_trace(root, events):
    import gzip
    import json
    d = root / "plugins" / "profile" / "run"
    d.mkdir(parents=True)
    with gzip.open(d / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    return common.read_trace(str(root))


def test_device_calls_split_per_call_and_skip_derived_lines(tmp_path):
    """Two calls of three kernels, 3 ms apart: split at the widest gap; XProf's derived "XLA Ops" line on the same
    device is not read (it would count each kernel twice); per-call median device time and span; kernel groups
    from the static launches when the name matches an HLO instruction, else from the kernel's own name."""
    from bench import profile_step
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7(Compute)"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 9, "args": {"name": "XLA Ops"}}]
    kernels = []
    for t0 in (0.0, 3000.0):
        for j, (name, dur) in enumerate((("nvjet_tst_64x8", 10.0), ("loop_add_fusion_3", 2.0),
                                         ("flash_scores", 20.0))):
            kernels.append({"ph": "X", "pid": 1, "tid": 7, "name": name, "ts": t0 + 15.0 * j, "dur": dur})
            kernels.append({"ph": "X", "pid": 1, "tid": 9, "name": "add.3", "ts": t0 + 15.0 * j, "dur": dur})
    calls, threads = common.device_calls(_write_trace(tmp_path, meta + kernels), 2)
    assert threads == ["Stream #7(Compute)"]
    assert [[k[0] for k in c] for c in calls] == [["nvjet_tst_64x8", "loop_add_fusion_3", "flash_scores"]] * 2
    static = {"loop_add_fusion_3": {"group": "fusion", "label": "residual add", "origins": ["model.py:231 forward"]}}
    rec = profile_step.trace_record(calls, static, per_layer_div=3, top=5)
    assert rec["kernels_per_call"] == 3 and rec["kernels_per_layer"] == 1.0
    assert rec["device_ms"] == 0.032 and rec["span_ms"] == 0.05
    assert {g: v["count"] for g, v in rec["by_group"].items()} == {"gemm": 1, "fusion": 1, "attention": 1}
    assert rec["top_kernels"][0]["name"] == "flash_scores"
    assert [k["label"] for k in rec["top_kernels"] if k["name"] == "loop_add_fusion_3"] == ["residual add"]


def test_profile_step_tiny_on_cpu(tmp_path, monkeypatch):
    """The whole tool on a 2-layer random model: every step kind gets a record with a wall time and a static
    launch count read from its compiled program, with origins in jspec's source; a vegas round (gamma sparse
    forwards + a verification + selection) launches more than one plain step."""
    import json
    from bench import profile_step
    monkeypatch.setenv("JSPEC_ALLOW_DIRTY", "1")
    out = tmp_path / "profile_step.json"
    res = profile_step.profile(out=str(out), tiny=True, L=192, batches=(2,), reps=1, trace_calls=0)
    doc = json.loads(out.read_text())
    assert doc["provenance"] and doc["complete"] and doc["summary"] == res["summary"]
    recs = {r["kind"]: r for r in doc["records"]}
    assert set(recs) == set(profile_step.KINDS)
    for kind, r in recs.items():
        assert "error" not in r, (kind, r.get("error"))
        assert r["wall_ms"] > 0 and r["static"]["launches"] > 0, kind
        assert sum(n for n, _ in r["static"]["by_group"].values()) == r["static"]["launches"], kind
    plain, vround = recs["plain_step"]["static"], recs["vegas_round"]["static"]
    assert vround["launches"] > plain["launches"]
    assert plain["by_group"]["gemm"][0] >= 4 * 2          # qkv, wo, gate/up, down per layer (+ the head)
    assert plain["written_in"]["cache append (scatter)"][0] == 2 * 2   # k and v per layer: a real property
    assert any(o.startswith("model.py:") for o, _, _ in plain["by_origin"])
    s = doc["summary"]
    assert s["static_launches_vegas_round_B2"] == vround["launches"] and s["plain_step_ms_B2"] > 0


# ------------------------------------------------------------------------------------------ step_overhead

def _bench_doc(B, ar_tps, best, peers_tps, L=7936):
    rec = lambda m, tps: dict(method=m, L=L, B=B, prompt_tokens_mean=7900.0, new_tokens_mean=200.0, tokens_per_s=tps)
    return {"provenance": {"commit": "c" * 40, "device": "gpu:NVIDIA H200"},
            "records": [rec("ar", ar_tps), rec("vegas", ar_tps * best)],
            "summary": {f"L{L}_B{B}": {"best": "vegas", "best_speedup_vs_ar": best, "best_without_lookup": "vegas",
                                       "best_without_lookup_speedup_vs_ar": best, "ar_distinct_token_share": 0.2}},
            "peers": [dict(peer="hf-compile", L=L, B=B, tokens_per_s=t) for t in peers_tps]}


def test_step_overhead_summary_against_hand_computed_figures():
    from bench import step_overhead as so
    W, KV = 1_000_000, 100       # weight bytes, KV bytes per token: a step at B rows reads W + B * 8000 * KV
    docs = {"b1.json": _bench_doc(1, 4000.0, 1.1, [500.0]), "b16.json": _bench_doc(16, 9000.0, 1.5, [10000.0]),
            "b64.json": _bench_doc(64, 20000.0, 2.5, [5000.0])}
    prof = {"provenance": {"commit": "d" * 40}, "summary": {"kernels_per_plain_step_B1": 130.0,
                                                           "kernels_per_plain_step_B64": 100.0,
                                                           "draft_step_device_ms_B64": 0.7}}
    records, s = so.summarize(docs, prof, "prof.json", W, KV)
    floor = {B: B * common.HBM_BYTES_PER_S / (W + B * 8000 * KV) for B in (1, 16, 64)}   # context 7900 + 200 / 2
    assert [r["B"] for r in records] == [1, 16, 64]
    for r, B, tps in zip(records, (1, 16, 64), (4000.0, 9000.0, 20000.0)):
        assert r["floor_tokens_per_s"] == pytest.approx(floor[B], rel=1e-6)
        assert r["ar_roofline_frac"] == pytest.approx(tps / floor[B], abs=1e-4)
    t = s["targets"]
    assert s["ar_tok_s_L8000_B1"] == 4000.0 and t["ar_tok_s_B1"]["met"]
    assert t["ar_tok_s_B1"]["condition"].endswith("200.0 new tokens per row on average, one prompt")
    assert t["ar_roofline_frac_B1"]["met"] == (4000.0 / floor[1] >= 0.30)
    assert s["kernels_per_plain_step"] == 130.0 and not t["kernels_per_plain_step"]["met"]   # the most over B
    assert s["draft_step_ms_L8000_B64"] == 0.7 and t["draft_step_ms_B64"]["met"]
    # ar against the compiled peer: 8x, 0.9x, 4x -> not ahead at every B
    assert s["ar_speedup_vs_torch_compile_by_B"] == {1: 8.0, 16: 0.9, 64: 4.0}
    assert s["ar_speedup_vs_torch_compile_L8000_B16"] == 0.9 and not t["ar_ahead_of_torch_compile"]["met"]
    assert s["best_lossless_speedup_vs_ar_L8000_B64"] == 2.5 and t["best_lossless_speedup_B64"]["met"]
    # a B=1 run of several prompts one at a time (`jspec bench --serial 8`) says so beside the B=1 target
    docs["b1.json"]["records"][0]["serial"] = 8
    _, s8 = so.summarize(docs, prof, "prof.json", W, KV)
    assert s8["targets"]["ar_tok_s_B1"]["condition"].endswith("8 prompts decoded one at a time (--serial)")
    # a shape in two files would mix runs in its ratios: refused
    with pytest.raises(SystemExit, match="in both"):
        so.summarize({**docs, "again.json": _bench_doc(16, 1.0, 1.0, [])}, prof, "prof.json", W, KV)
