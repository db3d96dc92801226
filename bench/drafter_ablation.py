"""LongSpec drafter ablations in one process (one compiled step): the full recipe against training without
anchor-offset positions and without noisy cross-attention, each for the same --steps on the same data.

    PYTHONPATH=. python bench/drafter_ablation.py --data DIR --out $OUT/ablation --steps 150

Writes <out>/<arm>/ (a normal train-drafter run each: loss.jsonl, drafter/ in bf16) and <out>/ablation.json:
{"records": [{"arm", "anchor_offset", "noisy_xattn", "step", "loss", ...}], "summary": {...}} plus
ablation.png (train loss vs step per arm). The tau part of the noisy-attention ablation is measured from the
exported drafters with bench/longspec.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import base_record, write_json  # noqa: E402

ARMS = {"full": dict(anchor_offset=True, noisy_xattn=True),
        "no_anchor_offset": dict(anchor_offset=False, noisy_xattn=True),
        "no_noisy_xattn": dict(anchor_offset=True, noisy_xattn=False)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default=None)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--quick", action="store_true", help="CPU smoke test")
    a = ap.parse_args()

    import jax
    from jspec.api import load
    from jspec.drafter.train import train_drafter

    model = load(a.model, dtype="float32" if jax.default_backend() == "cpu" else None)
    kw = dict(model=model, data_dir=a.data, batch=a.batch, seq_len=a.seq_len, lr=a.lr, warmup=a.warmup,
              steps=a.steps, log_every=5, eval_every=a.steps, ckpt_every=0, overwrite=True,
              token_cache=os.path.join(a.out, "_tokens"))
    if a.quick:
        kw.update(batch=2, seq_len=128, window=32, steps=4, warmup=1, log_every=1, eval_every=2, n_eval_chunks=2,
                  stdlib_modules=("inspect",))
    records, finals = [], {}
    for arm in a.arms.split(","):
        t0 = time.perf_counter()
        s = train_drafter(out=os.path.join(a.out, arm), **ARMS[arm], **kw)
        recs = [json.loads(x) for x in open(s["log"]) if x.strip()]
        for r in recs:
            records.append(dict(arm=arm, **ARMS[arm], **r))
        ev = [r for r in recs if "eval_loss" in r]
        finals[arm] = dict(loss=s["loss"], eval_loss=ev[-1]["eval_loss"] if ev else None,
                           eval_acc=ev[-1]["eval_acc"] if ev else None, wall_s=time.perf_counter() - t0)
        print(f"{arm}: {finals[arm]}", flush=True)
    summary = base_record(bench="drafter_ablation", steps=kw["steps"], batch=kw["batch"], seq_len=kw["seq_len"],
                          lr=a.lr, arms=finals)
    write_json(os.path.join(a.out, "ablation.json"), records, summary)
    _plot(records, os.path.join(a.out, "ablation.png"))


def _plot(records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm in dict.fromkeys(r["arm"] for r in records):
        pts = [(r["step"], r["loss"]) for r in records if r["arm"] == arm and "loss" in r]
        if pts:
            ax.plot(*zip(*pts), label=arm, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("train cross-entropy")
    ax.set_title("LongSpec drafter ablations (same steps, data, seed)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
