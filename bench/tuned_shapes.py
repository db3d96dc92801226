"""Which draft shape should a drafter use at each batch size? Writes a drafter's tuned.json (the shape
`jspec.generate` drafts per batch size) from `jspec tune --method longspec` result files, e.g. the committed runs
the bundled drafter's file was written from:

    python bench/tuned_shapes.py checkpoints/drafters/smollm2-135m bench/results/tune_longspec_mixed_B*_h200.json

Each file's chosen shape is recorded at the batch it was measured at, with its measurements and the file's
name (`jspec tune --save-shape` does the same for one run on the machine it ran on).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jspec.drafter import write_shape  # noqa: E402
from jspec.speculative.config import draft_widths  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("drafter", help="the drafter directory")
    ap.add_argument("results", nargs="+", help="tune result JSONs (method longspec)")
    ap.add_argument("--note", default=None, help="recorded with each entry (e.g. which weights were tuned)")
    a = ap.parse_args()
    for path in a.results:
        with open(path) as f:
            res = json.load(f)
        if res.get("method") != "longspec":
            raise SystemExit(f"error: {path} is not a longspec tune result (method {res.get('method')!r})")
        widths = draft_widths(res)
        try:
            out = write_shape(a.drafter, res["batch"], widths, tau=round(res["tau"], 3),
                              tokens_per_s=round(res["tokens_per_s"], 1),
                              speedup_vs_ar=round(res["speedup_vs_ar"], 3) if res.get("speedup_vs_ar") else None,
                              prompt_tokens=res["prompt_tokens"], max_new_tokens=res["max_new_tokens"],
                              device=res["device"], source=os.path.relpath(path),
                              **({"note": a.note} if a.note else {}))
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: {e}") from None
        print(f"batch {res['batch']}: {','.join(map(str, widths))} -> {out}")


if __name__ == "__main__":
    main()
