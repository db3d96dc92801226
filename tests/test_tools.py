"""tools/cuda_programs.py: lowering jspec.generate's engine calls for CUDA on the CPU finds a change inside a
Pallas kernel that leaves the XLA program alone (the kind a CPU lowering cannot see), and reports none when
nothing changed. Two small lowerings of SmolLM2's shapes per run (CPU, ~30 s)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "cuda_programs.py")
ARGS = ["--method", "vegas", "--batch", "2", "--length", "300", "--new-tokens", "16"]
# The same lowering with one constant inside the attention kernels changed (log2(e), which scales their logits).
MUTATED = f"""
import sys, runpy
sys.path.insert(0, {ROOT!r})
import pallas_kernels._common as C
C.LOG2E = C.LOG2E * (1 + 2 ** -10)
sys.argv = [{TOOL!r}] + sys.argv[1:]
runpy.run_path({TOOL!r}, run_name="__main__")
"""


def _run(args, program=None):
    cmd = [sys.executable, "-c", program] if program else [sys.executable, TOOL]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(cmd + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_kernel_change_is_found_and_no_change_is_equal(tmp_path):
    a, b, c = (str(tmp_path / n) for n in "abc")
    for out, program in ((a, None), (b, None), (c, MUTATED)):
        r = _run(ARGS + ["--out", out], program)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "run: xla" in r.stdout and "flash_scores_" in r.stdout, r.stdout
    same = _run(["--compare", a, b])
    assert same.returncode == 0 and "all equal" in same.stdout, same.stdout
    changed = _run(["--compare", a, c])
    assert changed.returncode == 1, changed.stdout
    assert "run: XLA program equal" in changed.stdout, changed.stdout
    assert "kernel flash_scores_" in changed.stdout and "differs from flash_scores_" in changed.stdout, changed.stdout
