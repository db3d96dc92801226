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

`static_launches` does the same for one compiled program without a dump, from its own optimized HLO
(`compiled.as_text()`): every launch, its group and the jspec source lines it came from (bench/profile_step.py).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import linecache
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


# --- launches of a compiled program ---------------------------------------------------------------------------
# The same reading, for one compiled program's own optimized HLO (`jax.jit(f).lower(...).compile().as_text()`,
# any backend, no dump): every instruction that launches a kernel, its group, the jspec source lines XLA's
# metadata names for its ops, and a label for launches that exist only because of how the program is written.

GROUPS = ("gemm", "attention", "fusion", "data movement", "reduce/sort/top-k", "other")

# Pallas kernel names (pallas_kernels/*.py `name=`) by group; dense_* are the fused dense layers (dense_rows).
PALLAS = {"flash_scores": "attention", "score_weights": "attention", "sparse_attention": "attention",
          "tree_attention": "attention", "topk_select": "reduce/sort/top-k", "dense_": "gemm"}
_GEMM_NAMES = ("gemm", "nvjet", "xmma", "cutlass", "cublas", "gemv", "matmul")
# Ops that launch nothing (static count), and ops that only move or re-type data (a launch made of these
# computes nothing: it exists because of the program's layout).
_NO_LAUNCH = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "opt-barrier", "after-all",
              "add-dependency", "partition-id", "replica-id"}
_MOVE = {"copy", "transpose", "reshape", "slice", "concatenate", "pad", "broadcast", "dynamic-slice", "gather",
         "iota", "reverse", "bitcast", "parameter", "constant", "tuple", "get-tuple-element"}


def _frames(text: str) -> dict:
    """{stack_frame_id: (file, function, line)} of the innermost frame, from the module's stack-frame tables."""
    def table(name):
        m = re.search(rf"^{name}\n((?:\d+ .*\n?)*)", text, re.M)
        return dict(re.findall(r"^(\d+) (.*)$", m.group(1), re.M)) if m else {}
    files, funcs, locs, frames = (table(n) for n in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"))
    out = {}
    for fid, body in frames.items():
        loc = locs.get(re.search(r"file_location_id=(\d+)", body).group(1), "")
        f, fn, ln = (re.search(rf"{k}=(\d+)", loc) for k in ("file_name_id", "function_name_id", "line"))
        if f and fn and ln:
            out[fid] = (files.get(f.group(1), "?").strip('"'), funcs.get(fn.group(1), "?").strip('"'), int(ln.group(1)))
    return out


def _origin(frame):
    """`model.py:43 rms_norm` for a frame of jspec's own code, else None (jax's or the caller's)."""
    path, fn, line = frame
    if "/jspec/" not in path and "/pallas_kernels/" not in path:
        return None
    return f"{os.path.basename(path)}:{line} {fn}"


def _label(ops: set, origins: list, code: list) -> str:
    """What a launch that is neither a GEMM nor an attention kernel does, from its ops, the jspec functions and
    source lines they came from: the names issue 31 asks for (layout copies, casts, separate norm / RoPE / cache
    append / residual fusions, ...)."""
    funcs = {o.split(" ", 1)[1] for o in origins} - {"forward.<locals>.<lambda>"}   # the lambda: w[i] per layer
    files = {o.split(":", 1)[0] for o in origins}
    if any("random." in c for c in code):   # (its loop's copies included)
        return "PRNG key split"
    if ops <= _MOVE | {"convert"}:
        if "convert" in ops:
            return "cast"
        if "concatenate" in ops:
            return "concatenate"
        return "layout copy/transpose" if ops & {"copy", "transpose"} else "pad/slice/broadcast"
    if "kv_cache.py" in files:
        return "cache append" + (" (scatter)" if ops & {"scatter", "dynamic-update-slice"} else " (indices)")
    if ops & {"scatter", "dynamic-update-slice"}:
        return "scatter/DUS"
    if "rms_norm" in funcs:   # alone, or with the residual add before it (XLA fuses the two on GPU)
        rest = funcs - {"rms_norm"}
        return "RMSNorm" + (" + residual add" if rest == {"forward"} and "add" in ops else
                            "".join(f" + {f}" for f in sorted(rest)))
    if "rope" in funcs:
        return "RoPE" + (" + " + ", ".join(sorted(funcs - {"rope"})) if funcs - {"rope"} else "")
    if "logistic" in ops or "_gate_up" in funcs:
        return "SiLU*mul"
    if files & {"attention.py", "flash_scores.py", "sparse_attention.py", "tree_attention.py"}:
        return "attention glue"   # around the kernels (pads, slices, the split combine) or the XLA path
    if funcs == {"forward"} and "add" in ops and not ops & {"reduce", "gather", "dot"}:
        return "residual add"
    if "gather" in ops:
        return "gather"
    return "other: " + ", ".join(sorted(funcs)[:2]) if funcs else "other (no jspec source)"


def static_launches(text: str) -> list[dict]:
    """Every launch-like instruction of a compiled module's optimized HLO text:
    {name, op, group, label, count (trip-count multiplied), origins [jspec source lines], ops {opcode: n}}."""
    comps = computations(text)
    frames = _frames(text)
    entry = re.search(r"^ENTRY\s+%?([\w.\-]+)", text, re.M).group(1)

    def sources(lines):
        ids = (re.search(r"stack_frame_id=(\d+)", ln) for ln in lines)
        return [frames[m.group(1)] for m in ids if m and m.group(1) in frames and _origin(frames[m.group(1)])]

    def walk(comp, mult, depth=0) -> list:
        got = []
        for line in comps.get(comp, []) if depth <= 8 else []:
            m = _INSTR.match(line)
            if not m:
                continue
            name, rhs = m.groups()
            op = opcode(rhs)
            if op in _NO_LAUNCH or op.endswith("-done") or op.endswith("-update"):
                continue
            if op == "while":   # body and condition run once per trip
                trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', rhs)
                n = int(trip.group(1)) if trip else 1
                for key in ("body", "condition"):
                    c = re.search(rf"{key}=%?([\w.\-]+)", rhs)
                    got += walk(c.group(1), mult * n, depth + 1) if c else []
                continue
            if op == "call":    # GPU command buffers are calls
                c = re.search(r"to_apply=%?([\w.\-]+)", rhs)
                got += walk(c.group(1), mult, depth + 1) if c else []
                continue
            if op == "conditional":   # one branch runs: count the one with most launches
                names = re.findall(r"(?:branch_computations=\{|true_computation=|false_computation=|, )%([\w.\-]+)",
                                   rhs)
                branches = [walk(c, mult, depth + 1) for c in names if c in comps]
                got += max(branches, key=lambda b: sum(x["count"] for x in b), default=[])
                continue
            got.append(_launch(name, op, rhs, line, mult))
        return got

    def _launch(name, op, rhs, line, mult):
        called = re.search(r"calls=%?([\w.\-]+)", rhs)
        body = comps.get(called.group(1), []) if called else []
        ops = collections.Counter(opcode(m.group(2)) for ln in body
                                  for m in [_INSTR.match(ln)] if m) if body else collections.Counter({op: 1})
        for skip in ("parameter", "constant", "bitcast", "tuple", "get-tuple-element"):
            ops.pop(skip, None)
        frames_ = list(dict.fromkeys(sources(body + [line])))
        origins = [_origin(f) for f in frames_]
        code = [linecache.getline(f[0], f[2]).strip()[:90] for f in frames_[:3]]
        # a custom call may sit inside a fusion (e.g. cuBLAS behind an address-computation fusion on GPU)
        call = rhs if op.startswith("custom-call") else next((ln for ln in body if " custom-call(" in ln), "")
        target = re.search(r'custom_call_target="([^"]+)"', call)
        target = target.group(1) if target else ""
        pname = re.search(r'"name":\s*"([^"]+)"', call)   # a Pallas kernel's name, in its backend config ...
        opname = re.search(r'op_name="([^"]*)"', call)      # ... or in the jax op path (jit(flash_scores_kernel))
        group = _static_group(op, set(ops), target, (pname.group(1) if pname else "") + " " +
                              (opname.group(1) if opname else ""))
        label = group if group in ("gemm", "attention") else _label(set(ops) or {op}, origins, code)
        return dict(name=name, op=op, count=mult, group=group, label=label, origins=origins[:4], code=code[:1],
                    ops=dict(ops.most_common(8)), target=target or None)

    return walk(entry, 1)


def _static_group(op, ops, target, names) -> str:
    """The group of a launch: a custom call by its target or Pallas kernel name, a fusion by what it fuses."""
    if op.startswith("custom-call") or "custom-call" in ops:
        for k, g in PALLAS.items():
            if k in names:
                return g
        low = target.lower()
        if any(s in low for s in _GEMM_NAMES):
            return "gemm"
        return "reduce/sort/top-k" if "topk" in low or "sort" in low else "other"
    if ops & {"dot", "convolution"}:
        return "gemm"
    if ops & {"sort", "topk"} or op in ("sort", "topk", "reduce", "reduce-window"):
        return "reduce/sort/top-k"
    if ops & {"scatter", "dynamic-update-slice"} or ops <= _MOVE | {"convert"}:
        return "data movement"
    return "fusion" if op == "fusion" else "other"


def trace_names(launches) -> dict:
    """{name as a profiler trace spells it (`loop_add_fusion_3` for `loop_add_fusion.3`): launch}."""
    return {re.sub(r"[.\-]", "_", x["name"]): x for x in launches}


def summarize_static(launches, per_layer_div) -> dict:
    """Counts by group, by label (the program-structure launches) and by origin."""
    def tally(key):
        c = collections.Counter()
        for x in launches:
            c[key(x)] += x["count"]
        return c
    total = sum(x["count"] for x in launches)
    by_group = tally(lambda x: x["group"])
    glue = collections.Counter()
    for x in launches:
        if x["group"] not in ("gemm", "attention", "reduce/sort/top-k"):
            glue[x["label"]] += x["count"]
    by_origin = tally(lambda x: (" + ".join(x["origins"][:2]) + (f"  | {x['code'][0]}" if x["code"] else ""))
                      if x["origins"] else f"({x['op']}, no jspec source)")
    pl = (lambda n: round(n / per_layer_div, 2)) if per_layer_div else (lambda n: None)
    return dict(launches=total, per_layer=pl(total),
                by_group={g: [by_group[g], pl(by_group[g])] for g in GROUPS if by_group[g]},
                written_in={k: [v, pl(v)] for k, v in glue.most_common()},
                by_origin=[[k, v, pl(v)] for k, v in by_origin.most_common(30)])


def kernel_group(name: str, static: dict) -> tuple[str, dict]:
    """(group, matched launch or None) of a profiler trace's kernel: the group of its HLO instruction when
    `static` ({trace-spelled name: launch}, see `trace_names`) has it, else guessed from the kernel name (cuBLAS
    and Pallas kernels are named after themselves, not after an instruction)."""
    hit = static.get(re.sub(r"[.\-]", "_", name))
    if hit:
        return hit["group"], hit
    low = name.lower()
    for k, g in PALLAS.items():
        if low.startswith(k):
            return g, None
    if any(s in low for s in _GEMM_NAMES):
        return "gemm", None
    if any(s in low for s in ("memcpy", "memset", "copy", "transpose", "concatenate", "dynamic_update_slice",
                              "scatter", "gather")):
        return "data movement", None
    if any(s in low for s in ("sort", "topk", "top_k")):
        return "reduce/sort/top-k", None
    return ("fusion" if "fusion" in low else "other"), None


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
