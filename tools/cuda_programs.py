"""What `jspec.generate` would run on an H100, seen from a CPU machine: did a change alter the GPU programs?

A refactor that claims "lowered programs unchanged" must compare what runs on the GPU, Pallas kernels
included. Lowered on the CPU, the kernels' dispatcher falls back to the XLA path, and lowered for CUDA each
kernel is an opaque bytecode blob inside a custom call. This tool lowers for CUDA against a pretend sm_90
device (no GPU needed), takes each Pallas kernel's Triton IR out as text and hashes it, and hashes the XLA
programs with the blobs left out (the kernels are compared by their own hashes). It drives the public path: `jspec.generate` on random prompts of the given
shape and abstract SmolLM2 weights, stopping at the engine's two jitted calls (`speculative.init`, the prefill
and first selection; `speculative.run_donating`, the rounds).

Run it from the root of each tree to compare (it imports the jspec it finds there), then compare:

    python tools/cuda_programs.py --method vegas:select_page=8 --batch 64 --out /tmp/after
    (cd /path/to/other/tree && python /path/to/tools/cuda_programs.py ... --out /tmp/before)
    python tools/cuda_programs.py --compare /tmp/before /tmp/after

A tree from before the engine ran "ar" has no such calls for "ar"; the tool then says so and records only
what it reached. PTX compilation and
XLA's GPU passes are not run: equal outputs here mean equal inputs to the same compiler.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import sys
import types
from unittest import mock

_IR = re.compile(r'ir = "(?:[^"\\]|\\.)*"')


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def lower(method: str, batch: int, length: int, new_tokens: int, out: str) -> dict:
    """Lower the engine's calls for `method`; write <out>/<call>.mlir, <out>/kernels/*.ttir, <out>/summary.json."""
    sys.path.insert(0, os.getcwd())
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.pallas.triton import lowering as triton_lowering
    from jax._src.pallas.triton import pallas_call_registration as registration

    import jspec
    import pallas_kernels._common as C
    from jspec import api, speculative
    from jspec import model as M
    from jspec.config import preset

    kernels: list[tuple[str, str]] = []
    lower_module = triton_lowering.lower_jaxpr_to_triton_module

    def recording(*a, **k):
        res = lower_module(*a, **k)
        op = res.module.operation
        kernels.append((op.attributes["sym_name"].value if "sym_name" in op.attributes else "kernel",
                        op.get_asm(enable_debug_info=False)))
        return res

    cfg = preset("smollm2-135m")
    params = jax.eval_shape(lambda k: M.init_params(cfg, k, dtype=jnp.bfloat16), jax.random.key(0))
    params = jax.eval_shape(lambda p: M.fuse_projections(p, cfg), params)
    rng = np.random.default_rng(0)
    lengths = rng.integers(max(1, length - 600), length + 1, size=batch)
    lengths[0] = length
    prompts = [rng.integers(3, cfg.vocab_size, size=int(n)).tolist() for n in lengths]
    tokenizer = types.SimpleNamespace(eos_token_id=cfg.eos_token_ids[0] if cfg.eos_token_ids else 0,
                                      decode=lambda t, **k: "")
    model = api.Model(params=params, cfg=cfg, tokenizer=tokenizer, path="/tree/smollm2-135m")
    os.makedirs(os.path.join(out, "kernels"), exist_ok=True)
    summary = {"jspec": os.path.dirname(jspec.__file__), "method": method, "batch": batch, "length": length,
               "programs": {}}

    def export(name, fn, args, kwargs):
        kernels.clear()
        arrays = (jax.Array, np.ndarray, jax.ShapeDtypeStruct)
        avals = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, arrays) else x,
                             (args, kwargs))
        exported = jax.export.export(fn, platforms=("cuda",), disabled_checks=[
            jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(*avals[0], **avals[1])
        with mlir.make_ir_context() as ctx:   # printed again without locations (moved source lines do not count)
            module = ir.Module.parse(exported.mlir_module(), context=ctx)
            text = _IR.sub("ir = <kernel>", module.operation.get_asm(enable_debug_info=False))
        names = []
        for kname, ktext in kernels:   # each distinct kernel once (the lowering caches repeats)
            names.append(f"{kname}_{_sha(ktext)}")
            with open(os.path.join(out, "kernels", names[-1] + ".ttir"), "w") as f:
                f.write(ktext)
        with open(os.path.join(out, name + ".mlir"), "w") as f:
            f.write(text)
        summary["programs"][name] = {"xla": _sha(text), "kernels": sorted(names)}
        return exported

    class _Done(Exception):
        pass

    real_init, real_run = speculative.init, speculative.run_donating

    def fake_init(*a, **k):
        e = export("init", real_init, a, k)
        return jax.tree.unflatten(e.out_tree, [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in e.out_avals])

    def fake_run(*a, **k):
        export("run", real_run, a, k)
        raise _Done

    from jspec.bench import MethodSpec   # the benchmark's own spelling of a method and its knobs
    spec = MethodSpec.parse(method)
    patches = [mock.patch.object(C, "check_platform", lambda interpret: None),
               mock.patch.object(registration.gpu_info_lib, "get_gpu_info",
                                 lambda: types.SimpleNamespace(compute_capability="9.0")),
               mock.patch.object(triton_lowering, "lower_jaxpr_to_triton_module", recording),
               mock.patch.object(speculative, "init", fake_init),
               mock.patch.object(speculative, "run_donating", fake_run),
               mock.patch.object(jax, "block_until_ready", lambda x: x)]
    for p in patches:
        p.start()
    try:
        api.generate(model, prompts, method=spec.method, max_new_tokens=new_tokens, **dict(spec.knobs))
        summary["note"] = "generate returned without reaching speculative.run_donating"
    except _Done:
        pass
    except Exception as e:   # e.g. a tree whose "ar" runs another loop, which abstract weights cannot run
        summary["note"] = f"generate did not reach the engine's calls: {type(e).__name__}: {e}"[:400]
    finally:
        for p in reversed(patches):
            p.stop()
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def compare(a: str, b: str) -> int:
    """Print which programs and kernels differ between two --out folders; 0 when all are equal."""
    sa, sb = (json.load(open(os.path.join(d, "summary.json"))) for d in (a, b))
    differ = 0
    for name in sorted(set(sa["programs"]) | set(sb["programs"])):
        pa, pb = sa["programs"].get(name), sb["programs"].get(name)
        if pa is None or pb is None:
            print(f"{name}: only in {a if pb is None else b}")
            differ = 1
            continue
        same = pa["xla"] == pb["xla"]
        print(f"{name}: XLA program {'equal' if same else 'DIFFERS'}; "
              f"kernels {len(pa['kernels'])} / {len(pb['kernels'])}")
        differ |= not same
        ka, kb = set(pa["kernels"]), set(pb["kernels"])
        for x in sorted(ka - kb):
            twin = next((y for y in sorted(kb - ka) if y.rsplit("_", 1)[0] == x.rsplit("_", 1)[0]), None)
            print(f"  kernel {x} differs" + (f" from {twin}:" if twin else " (no counterpart)"))
            differ = 1
            if twin:
                la = open(os.path.join(a, "kernels", x + ".ttir")).read().splitlines()
                lb = open(os.path.join(b, "kernels", twin + ".ttir")).read().splitlines()
                diff = list(difflib.unified_diff(la, lb, lineterm="", n=1))
                print("\n".join("    " + d for d in diff[:60]) + ("\n    ..." if len(diff) > 60 else ""))
    print("all equal" if not differ else "differences found")
    return differ


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="vegas:select_page=8", help="a jspec bench method spec")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=7936, help="longest prompt (others up to 600 shorter)")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--out", default="cuda-programs")
    ap.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"), help="compare two --out folders")
    a = ap.parse_args(argv)
    if a.compare:
        return compare(*a.compare)
    s = lower(a.method, a.batch, a.length, a.new_tokens, a.out)
    for name, p in s["programs"].items():
        print(f"{name}: xla {p['xla']}, kernels {', '.join(p['kernels'])}")
    if "note" in s:
        print(s["note"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
