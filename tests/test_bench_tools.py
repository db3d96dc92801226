"""bench/hlo_fusions.py: reading what XLA fused from a real optimized-HLO dump (CPU, a few seconds); bench/common.py's
profiler-trace tables on a hand-built trace."""
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
