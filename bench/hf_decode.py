"""Hugging Face transformers greedy decoding with a static cache on the same prompts (run by decode.py in a
separate process so torch and JAX don't fight over GPU memory). Loads our converted checkpoint's source
GGUF through transformers, as ../shared/anchors/hf_baseline.py does, and times decode minus prefill."""
from __future__ import annotations

import argparse
import glob
import json
import os
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def load(model_dir):
    cache = os.path.dirname(model_dir.rstrip("/"))
    hf_dir = os.path.join(cache, "hf-bf16")
    if not os.path.exists(os.path.join(hf_dir, "config.json")):
        gguf = sorted(glob.glob(os.path.join(cache, "*.gguf")))[0]
        m = AutoModelForCausalLM.from_pretrained(cache, gguf_file=os.path.basename(gguf), dtype=torch.bfloat16)
        m.hf_quantizer = None
        if hasattr(m.config, "quantization_config"):
            del m.config.quantization_config
        m.save_pretrained(hf_dir)
    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    model = load(a.model_dir)
    prompts = np.load(a.prompts)
    res = []
    # Keys "L" (one prompt set per length, every --batches size taken from its first rows) or "L_B" (the exact
    # [B, L] prompts of one shape, as bench/spec_hf.py writes them).
    shapes = []
    for key in sorted(prompts.files, key=lambda k: tuple(int(x) for x in k.split("_"))):
        shapes += [(key, B) for B in ([prompts[key].shape[0]] if "_" in key else
                                       [int(x) for x in a.batches.split(",")])]
    warm = False
    for key, B in shapes:
        L = key.split("_")[0]
        ids = torch.from_numpy(prompts[key][:B].astype(np.int64)).cuda()
        kw = dict(max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False, cache_implementation="static",
                  pad_token_id=0, attention_mask=torch.ones_like(ids))
        try:
            with torch.no_grad():
                model.generate(ids, **{**kw, "max_new_tokens": 8, "min_new_tokens": 8})
                if not warm:   # the first full-length generate pays one-off set-up (47 s once on the H200)
                    model.generate(ids, **kw)
                    warm = True
                torch.cuda.synchronize(); t = time.perf_counter()
                model.generate(ids, **kw)
                torch.cuda.synchronize(); dt = time.perf_counter() - t
                t = time.perf_counter()
                model.generate(ids, **{**kw, "max_new_tokens": 1, "min_new_tokens": 1})
                torch.cuda.synchronize(); pf = time.perf_counter() - t
            r = dict(L=int(L), B=B, tokens_per_s=round(B * (a.new - 1) / (dt - pf), 1), total_s=round(dt, 3),
                     prefill_s=round(pf, 3))
        except Exception as e:
            r = dict(L=int(L), B=B, error=repr(e)[:300])
            torch.cuda.empty_cache()
        print("hf", json.dumps(r), flush=True)
        res.append(r)
        json.dump(res, open(a.out, "w"))   # after every shape: a caller's timeout keeps what finished


if __name__ == "__main__":
    main()
