"""Peers for `jspec bench`: Hugging Face transformers on the same prompts, in a process of its own.

    python -m jspec.peers --peer hf|hf-compile --prompts P.json --model-dir CKPT --new 256 --out R.json

`hf`: greedy `generate` with a static cache, torch.compile off (eager PyTorch, SDPA attention).
`hf-compile`: the same with the decode steps under `torch.compile(mode="reduce-overhead", fullgraph=True)` (CUDA
graphs; transformers' own compile of a static-cache generate, the prefill stays eager).
Prompts: {"LxB": [[token ids], ...]}; ragged rows are left-padded with an attention mask. A shape with more rows
than B (`jspec bench --serial` at B=1) runs them B at a time, one batch after another (`batches_of`), and reports
them as one record: every batch's new tokens over the summed decode time. The weights are the
checkpoint's source (config.json "source": an HF folder, or a GGUF file that transformers dequantises and
that is saved once as bf16 beside the checkpoint). Tokens/s counts, as jspec does, the new tokens after the
first over the decode time (a full generate minus a one-token generate on the same prompts).
Needs torch and transformers, and a GPU to mean anything; jspec itself needs neither torch nor this module.
"""
from __future__ import annotations

import argparse
import json
import os
import time


def _hf_dir(model_dir: str, torch, AutoModelForCausalLM) -> str:
    meta = json.load(open(os.path.join(model_dir, "config.json")))
    kind, _, src = str(meta.get("source") or "").partition(":")
    if kind == "hf" and os.path.isdir(src):
        return src
    if kind != "gguf" or not os.path.isfile(src):
        raise SystemExit(f"error: the checkpoint at {model_dir} records no readable source ({meta.get('source')!r}); "
                         f"the peers need its Hugging Face folder or GGUF file")
    out = model_dir.rstrip("/") + "-hf-bf16"
    if not os.path.isfile(os.path.join(out, "config.json")):
        m = AutoModelForCausalLM.from_pretrained(os.path.dirname(src), gguf_file=os.path.basename(src),
                                                 dtype=torch.bfloat16)
        m.hf_quantizer = None
        if hasattr(m.config, "quantization_config"):
            del m.config.quantization_config
        m.save_pretrained(out + ".part")
        os.replace(out + ".part", out)   # never a half-written folder under the final name
    return out


def batches_of(rows: list, B: int) -> list:
    """The batches a shape's rows run as: all at once when there are B of them, else B at a time in order."""
    if len(rows) <= B:
        return [rows]
    return [rows[i:i + B] for i in range(0, len(rows), B)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", choices=["hf", "hf-compile"], required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--stop-tokens", default="", help="comma-separated ids; empty: decode every row to --new")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(_hf_dir(a.model_dir, torch, AutoModelForCausalLM),
                                                 dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    compiled = a.peer == "hf-compile"
    if compiled:   # transformers compiles the decode steps (not the prefill) of a static-cache generate
        from transformers import CompileConfig
        model.generation_config.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
    stops = [int(x) for x in a.stop_tokens.split(",") if x.strip()]
    pad = stops[0] if stops else 0
    shapes = json.load(open(a.prompts))
    records = []

    def gen(rows, n):
        """(new tokens per row, seconds) of one greedy generate of n tokens over `rows`."""
        T = max(len(r) for r in rows)
        ids = torch.full((len(rows), T), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), T), dtype=torch.long)
        for i, r in enumerate(rows):           # left padding: every row's last prompt token at column T - 1
            ids[i, T - len(r):] = torch.tensor(r)
            mask[i, T - len(r):] = 1
        ids, mask = ids.cuda(), mask.cuda()
        kw = dict(attention_mask=mask, do_sample=False, cache_implementation="static", pad_token_id=pad,
                  disable_compile=not compiled)
        kw.update(dict(eos_token_id=stops) if stops else dict(min_new_tokens=min(n, a.new), eos_token_id=None))
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, **kw)
        torch.cuda.synchronize()
        return out[:, T:].tolist(), time.perf_counter() - t

    for key, rows in shapes.items():
        L, B = (int(x) for x in key.split("x"))
        batches = batches_of(rows, B)
        rec = dict(peer=a.peer, L=L, B=B, torch=torch.__version__, transformers=transformers.__version__,
                   device=torch.cuda.get_device_name(0), compiled="decode steps, reduce-overhead" if compiled else "no")
        if len(batches) > 1:
            rec["serial"] = len(rows)
        try:
            gen(batches[0], a.new)            # warm-up (compilation and CUDA graphs for hf-compile)
            gen(batches[0], 1)
            new, total, prefill = [], 0.0, 0.0
            for rows_b in batches:             # each batch timed alone: a full generate, then a one-token one
                got, t_all = gen(rows_b, a.new)
                _, t_one = gen(rows_b, 1)
                new, total, prefill = new + got, total + t_all, prefill + t_one
            counts = []
            for r in new:                     # tokens up to and including the first stop token
                n = next((j + 1 for j, t in enumerate(r) if t in stops), len(r)) if stops else len(r)
                counts.append(n)
            decode = max(total - prefill, 1e-9)
            rec.update(tokens_per_s=round(sum(max(n - 1, 0) for n in counts) / decode, 1),
                       decode_s=round(decode, 4), prefill_s=round(prefill, 4),
                       new_tokens_mean=round(sum(counts) / len(counts), 1), tokens=[r[:n] for r, n in zip(new, counts)])
        except Exception as e:   # e.g. out of memory at a large shape: recorded, the other shapes still run
            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            torch.cuda.empty_cache()
        print(json.dumps({k: v for k, v in rec.items() if k != "tokens"}), flush=True)
        records.append(rec)
    with open(a.out, "w") as f:
        json.dump(records, f)


if __name__ == "__main__":
    main()
