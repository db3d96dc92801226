"""Merge bench/longspec.py runs of one commit, drafter and prompt set into one JSON.

    PYTHONPATH=. python bench/merge_longspec.py --out bench/results/longspec_h200.json RUN.json [RUN.json ...]
        [--shape 8000x16] [--hf-json bench/results/hf_static_h200.json] [--train-summary S.json [S.json ...]]

Records are concatenated (a config measured in two runs keeps the first file's record), the summary is
rebuilt by longspec.py's own `_summary` at --shape, Hugging Face's static-cache figures are merged from an
earlier hf_decode.py result on the same prompts (bench/spec_hf.py's `merge`), and drafter_train_minutes is
the summed wall time of the given train_drafter.py summaries (a run resumed across calls has one per call),
else the first run's own figure (longspec.py reads it from the drafter's summary.json).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import write_json  # noqa: E402
from bench.longspec import _summary  # noqa: E402
from bench.spec_hf import merge as merge_hf  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="bench/longspec.py JSON files, in order of precedence")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="8000x16", help="LxB of the summary's headline numbers")
    ap.add_argument("--hf-json", default="", help="hf_decode.py rows for the same prompts")
    ap.add_argument("--train-summary", nargs="*", default=[], help="train_drafter.py summary.json file(s)")
    a = ap.parse_args()
    docs = [json.load(open(p)) for p in a.runs]
    drafters = {d["summary"].get("drafter") for d in docs}
    if len(drafters) > 1:
        raise SystemExit(f"error: the runs used different drafters: {sorted(map(str, drafters))}")
    records, seen = [], set()
    for path, d in zip(a.runs, docs):
        for r in d["records"]:
            key = (r["label"], r["L"], r["B"], r["T"], tuple(r.get("widths") or ()), r["group"])
            if key not in seen:
                seen.add(key)
                records.append({**r, "run": os.path.basename(path)})
    L, B = (int(x) for x in a.shape.lower().split("x"))
    summary = _summary(records, (L, B), docs[0]["summary"]["widths"])
    summary.update(drafter=docs[0]["summary"].get("drafter"), merged_from=[os.path.basename(p) for p in a.runs],
                   wall_s=round(sum(d["summary"].get("wall_s", 0.0) for d in docs), 1))
    if a.train_summary:
        train = [json.load(open(p)) for p in a.train_summary]
        summary["drafter_train_minutes"] = round(sum(t["wall_s"] for t in train) / 60, 1)
        summary["drafter_train_tokens"] = max(t["tokens"] for t in train)
    elif "drafter_train_minutes" in docs[0]["summary"]:   # the runs' own (read from the drafter's summary.json)
        summary["drafter_train_minutes"] = docs[0]["summary"]["drafter_train_minutes"]
    doc = {"records": records, "summary": summary}
    if a.hf_json:
        merge_hf(doc, json.load(open(a.hf_json)), 64, a.hf_json)
    write_json(a.out, doc["records"], doc["summary"])


if __name__ == "__main__":
    main()
