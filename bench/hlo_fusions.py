"""Which model code became the fusions a profile names? Reads XLA's optimized-HLO dump and, for each named
fusion, records what it computes.

    XLA_FLAGS="$XLA_FLAGS --xla_dump_to=/tmp/dump --xla_dump_hlo_as_text" PYTHONPATH=. python bench/profile_train.py \
        --out $OUT/prof.json
    python bench/hlo_fusions.py /tmp/dump --rounds $OUT/prof.json --out $OUT/fusions.json
    python bench/hlo_fusions.py /tmp/dump --names loop_pad_fusion_29,fusion_3 --out $OUT/fusions.json

A profiler trace names a kernel after its fusion instruction (`loop_pad_fusion_29` for `%loop_pad_fusion.29`),
which says little about what it computes. This reads the optimized HLO (`*after_optimizations.txt`) of the
module holding most of the asked names (the decode loop, not the prefill) and, for each name, records the
instruction line, the opcodes of the computation it calls and the jax ops they came from, so a profile's
"other fusion" time can be attributed to the model code that made it. Names come from --names or from the
`top_kernels` of a benchmark record (any JSON of `{"records": [...]}` whose records carry `top_kernels`, e.g.
bench/profile_train.py's; `bench.common.trace_table` makes such tables for any jitted call).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


def computations(text: str) -> dict[str, list[str]]:
    """{computation name: its instruction lines} of one HLO module's text."""
    comps, name = {}, None
    for line in text.splitlines():
        if name is None:
            m = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(|\{)", line)
            if m and line.rstrip().endswith("{"):
                name = m.group(1)
                comps[name] = []
        elif line.strip() == "}":
            name = None
        else:
            comps[name].append(line.strip())
    return comps


def opcode(rhs: str) -> str:
    """The opcode of an instruction's right-hand side (`bf16[2,3]{1,0} add(%a, %b)` -> add)."""
    m = re.search(r"\s([a-z][\w\-]*)\(", " " + rhs)
    return m.group(1) if m else "?"


def describe(dump_dir: str, names: list[str]) -> dict:
    best = None
    for path in glob.glob(os.path.join(dump_dir, "*after_optimizations.txt")):
        with open(path) as f:
            text = f.read()
        comps = computations(text)
        instrs = {}
        for lines in comps.values():
            for line in lines:
                m = _INSTR.match(line)
                if m:
                    instrs[m.group(1)] = m.group(2)
        found = {}
        for trace_name in names:   # a trace spells `fusion.29` as `fusion_29`; names without a number stay
            for cand in (re.sub(r"_(\d+)$", r".\1", trace_name), trace_name):
                if cand in instrs:
                    found[trace_name] = cand
                    break
        if best is None or len(found) > len(best[2]):
            best = (path, comps, found, instrs)
    if best is None:
        raise SystemExit(f"error: no *after_optimizations.txt under {dump_dir!r} (was --xla_dump_to set?)")
    path, comps, found, instrs = best
    out = {"module": os.path.basename(path), "fusions": {}}
    for trace_name in names:
        if trace_name not in found:
            out["fusions"][trace_name] = None
            continue
        rhs = instrs[found[trace_name]]
        called = re.search(r"calls=%?([\w.\-]+)", rhs)
        body = comps.get(called.group(1), []) if called else []
        ops = collections.Counter(opcode(_INSTR.match(ln).group(2)) for ln in body if _INSTR.match(ln))
        for skip in ("parameter", "constant"):
            ops.pop(skip, None)
        # the jax ops it came from, without the enclosing jit/while path (e.g. "jit(silu)/exp")
        srcs = sorted({m.group(1).split("eval_jaxpr/")[-1] for ln in body
                       for m in [re.search(r'op_name="([^"]+)"', ln)] if m})
        out["fusions"][trace_name] = {"instruction": rhs[:400], "ops": dict(ops.most_common()), "op_names": srcs}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump_dir")
    ap.add_argument("--names", default="", help="comma-separated kernel names as a trace shows them")
    ap.add_argument("--rounds", help="a benchmark JSON whose records have top_kernels: take their fusions")
    ap.add_argument("--method", default=None)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    names = [n for n in a.names.split(",") if n]
    if a.rounds:
        if not os.path.isfile(a.rounds):
            raise SystemExit(f"error: no round table at {a.rounds!r} (did the profiling run fail?)")
        with open(a.rounds) as f:
            recs = json.load(f)["records"]
        for r in recs:
            if a.method in (None, r.get("method")):
                names += [k for k, _, _ in r.get("top_kernels", []) if "fusion" in k and k not in names]
    if not names:
        raise SystemExit("error: no kernel names (give --names or --rounds with top_kernels)")
    res = describe(a.dump_dir, names)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    for n, d in res["fusions"].items():
        print(f"{n:32s} " + ("not found" if d is None else " ".join(f"{k}x{v}" for k, v in d["ops"].items())[:150]))


if __name__ == "__main__":
    main()
