"""`jspec bench`: the canonical benchmark. Methods x batch sizes x context lengths through `jspec.generate`,
the path users call, on one set of prompts per shape shared by every method; warm-up excluded.

    jspec bench --methods ar,vegas,longspec+lookup8 --batches 1,16,64 --lengths 7936 --out bench.json
    python -m jspec.bench --check-lossless --batches 64    # float32: lists every row that differs from ar
    jspec bench --merge b16.json b64.json --out both.json     # one file from several calls, each shape from one

Workloads (`--workload`):
  long-tasks  (default) what long-context users send: chat-template summaries and questions over long
              documents, and raw prose and code continuations, with ragged lengths between 0.9 L and L;
              stop tokens honoured. Texts come from `--texts DIR` (*.py files are code, other text files
              prose), else the running Python's standard library (code) and its pydoc topics (prose).
  continue    raw windows of exactly L tokens, alternating code and prose.
  DIR         a folder of your own prompts: each text file is one prompt, used as written (`--chat` wraps it).

Each record: method, knobs, L, B, prompt lengths, new tokens, tokens/s (new tokens after the first / decode
time), tau, speedup over `ar` in the same run, the share of rows whose tokens equal `ar`'s, the share of
distinct tokens in the output (a model that loops flatters prompt lookup), the batch's rounds (`rounds_max`: it
loops until its slowest row is done; ar: one per token after the prefill's) and the time of one (`round_ms`), and
`lossless` (False under a sparse
verification, `verify=...`; such a record also carries `fidelity` against the same drafter verified densely
when the run has it: mean tokens to the first divergence and the share of identical rows).

`--exact` runs every method, `ar` (the reference) included, in bf16 exact mode (`AttnImpl(exact=True)`) and adds
to the summary the least share of rows identical to ar over the other methods (1.0 is the claim:
docs/methods.md, "Lossless"); `--exact-cost` also times each method in the default mode in the same call and
records exact mode's cost, (default tokens/s - exact tokens/s) / default tokens/s, per method and its maximum.

`--serial N` (B=1 shapes): N prompts decoded one after another, each alone in its batch, as one record (tokens/s
over all of them, tau from their summed acceptance counts, identity and distinct tokens over the N rows). Every
such prompt has L tokens (a chat prompt may have a few fewer), so one compilation serves them all; the peers run
them alike. One prompt at B=1 measures one answer, which may end after a few tokens.

`--peers hf,hf-compile` times Hugging Face transformers on the same prompts in a separate process first
(`jspec.peers`; needs torch). The file carries its provenance (`jspec.provenance`): a run from a tree that
differs from its commit is refused unless `--allow-dirty`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Optional

DEFAULT_METHODS = ("ar", "streaming", "vegas:select_page=8", "longspec", "vegas+lookup8:select_page=8",
                   "longspec+lookup8")
KINDS = ("summary", "continue-code", "question", "continue-prose")
SUMMARY = "Summarize the document above in a few paragraphs, covering each of its main parts."
STOP_WORDS = {"The", "This", "That", "There", "These", "Those", "They", "Then", "Their", "When", "What", "Which",
              "With", "Where", "While", "From", "Here", "Have", "Your", "Some", "Such", "Each", "Note", "Also",
              "Only", "Even", "Most", "Every", "After", "Before", "Since", "Once", "Both", "Many", "More",
              "None", "True", "False", "Self", "Return", "Returns", "Raises", "Example", "Otherwise"}


class BenchError(ValueError):
    """A benchmark request that cannot run as asked."""


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """One benchmarked configuration, written `method[+lookupN][:knob=value,...]`,
    e.g. `vegas+lookup8:select_page=8`, or with a sparse (lossy) verification
    `vegas:select_page=8,verify=dustin,verify_budget=512` (knobs as `jspec.generate`'s keywords); `ar` takes
    no knobs."""
    label: str
    method: str
    knobs: tuple

    @classmethod
    def parse(cls, text: str) -> "MethodSpec":
        head, _, rest = text.strip().partition(":")
        method, _, lk = head.partition("+lookup")
        knobs = {}
        if lk:
            if not lk.isdigit() or int(lk) < 1:
                raise BenchError(f"method {text!r}: '+lookupN' needs a positive N")
            knobs["lookup"] = int(lk)
        for kv in filter(None, rest.split(",")):
            k, eq, v = kv.partition("=")
            if not eq:
                raise BenchError(f"method {text!r}: knob {kv!r} is not key=value")
            knobs[k.strip()] = _value(v.strip())
        from jspec.speculative.config import KNOBS, METHODS, Verify, knob_owner
        # The verification axis: verify=<kind>, profile=<file> and verify_<field> (jspec.generate's keywords).
        verify = {"verify", "profile"} | {f"verify_{f.name}" for f in dataclasses.fields(Verify)} - {"verify_kind"}
        fields = (set(KNOBS) - {"method"}) | verify
        if method not in ("ar",) + METHODS:
            raise BenchError(f"unknown method {method!r} in {text!r}; available: ar, {', '.join(METHODS)}")
        if method == "ar" and knobs:
            raise BenchError(f"method {text!r}: 'ar' (plain decoding) takes no knobs")
        bad = sorted(set(knobs) - fields)
        if bad:
            raise BenchError(f"method {text!r}: unknown knob(s) {bad}; SpecConfig has {sorted(fields)}")
        foreign = sorted(k for k in knobs if knob_owner(k) not in (None, method))
        if foreign:
            raise BenchError(f"method {text!r}: {', '.join(f'{k} is a {knob_owner(k)} option' for k in foreign)}")
        return cls(label=text.strip(), method=method, knobs=tuple(sorted(knobs.items())))


def check_methods(methods: list, model_cfg) -> None:
    """BenchError unless every method's knobs make a valid configuration for this model (values, the
    verification's budget and heads, a profile's model), the checks `jspec.generate` would make after the
    earlier methods had run."""
    from jspec import api
    from jspec.errors import InputError
    from jspec.speculative import sparse_verify
    for m in methods:
        try:
            spec = api.spec_config(m.method, None, model_cfg=model_cfg, **dict(m.knobs))
            if spec is not None:
                sparse_verify.check(spec, model_cfg)
        except InputError as e:
            raise BenchError(f"method {m.label!r}: {e}") from None


def split_methods(text: str) -> list["MethodSpec"]:
    """"ar,vegas:select_page=8,budget=256,longspec" -> three MethodSpecs: a comma-separated piece with `=` and
    no method name continues the previous method's knobs."""
    pieces = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" in part and ":" not in part and pieces:
            pieces[-1] += "," + part
        else:
            pieces.append(part)
    return [MethodSpec.parse(p) for p in pieces]


def _value(v: str):
    if re.fullmatch(r"-?\d+", v):
        return int(v)
    if re.fullmatch(r"\d+(-\d+)+", v):        # tree widths: 4-16-16-16
        return tuple(int(x) for x in v.split("-"))
    try:
        return float(v)
    except ValueError:
        return v


# ------------------------------------------------------------------------------------------------ prompts

@dataclasses.dataclass
class Prompt:
    kind: str
    source: str
    tokens: list


def text_sources(texts_dir: Optional[str] = None) -> tuple[list, list]:
    """([(name, code text)], [(name, prose text)]). Files of `texts_dir` (*.py code, others prose; each cut to
    400K characters), completed from the running Python: its stdlib modules for code, pydoc topics for prose."""
    from jspec import data
    code, prose = [], []
    if texts_dir is not None:
        for p in data._text_files(texts_dir, (".txt", ".py", ".md", ".rst")):
            text = p.read_text(encoding="utf-8", errors="replace")[:400_000]
            (code if p.suffix == ".py" else prose).append((p.name, text))
    if not code:
        for m in data.DEFAULT_STDLIB_MODULES + ("functools", "pathlib", "subprocess"):
            try:
                code.append((f"{m}.py", data.stdlib_text(m)))
            except FileNotFoundError:
                pass
    if not prose:
        from pydoc_data.topics import topics
        prose.append(("pydoc topics", "\n\n".join(topics[k] for k in sorted(topics))))
    return code, prose


class _Texts:
    """Token streams of the sources, encoded once."""

    def __init__(self, tok, code, prose):
        self.tok = tok
        self.streams = {"code": [(n, tok.encode(t, add_special_tokens=False)) for n, t in code],
                        "prose": [(n, tok.encode(t, add_special_tokens=False)) for n, t in prose]}

    def window(self, kind: str, i: int, n: int) -> tuple[str, list]:
        """n tokens of a `kind` source for row i: rows take turns over the files, at offsets spread by i."""
        files = self.streams[kind]
        name, ids = files[i % len(files)]
        if len(ids) < n:
            raise BenchError(f"{name} has {len(ids)} tokens, fewer than the {n} a prompt needs; give longer texts "
                             f"(--texts) or a shorter --lengths")
        start = (i * 7919 + (i // len(files)) * 104729) % (len(ids) - n + 1)
        return name, ids[start:start + n]


def _question(kind: str, text: str, i: int) -> str:
    if kind == "code":
        names = sorted(set(re.findall(r"^\s*(?:def|class)\s+([A-Za-z_]\w{2,})", text, re.M)))
        if names:
            return (f"In the code above, what does `{names[(i * 31) % len(names)]}` do? Explain how it works and "
                    f"where it is used.")
        return "What does the code above do? Explain its main functions."
    words = Counter(w for w in re.findall(r"\b([A-Z][a-z]{3,})\b", text) if w not in STOP_WORDS)
    lower = set(re.findall(r"\b([a-z]{4,})\b", text))
    names = [w for w, _ in words.most_common(12) if w.lower() not in lower]
    if names:
        return (f"Who or what is {names[i % len(names)]} in the text above, and what part does it play? Answer in "
                f"detail.")
    return "What is the text above about? Answer in detail."


def _chat(tok, body: str) -> list:
    """`body` as one chat turn (`jspec.api.chat_tokens`); a tokenizer without a chat template gets a plain
    "Answer:" suffix instead."""
    from jspec.api import chat_tokens
    if getattr(tok, "chat_template", None):
        return chat_tokens(tok, body)
    return tok.encode(body + "\nAnswer:", add_special_tokens=False)


def long_tasks(tok, texts: _Texts, L: int, B: int, ragged: bool = True) -> list[Prompt]:
    """B prompts of ragged lengths in [0.9 L, L] (ragged=False: L tokens each, a chat prompt a few fewer where
    re-tokenising its text shifts the count): summaries, questions, code and prose continuations in turn."""
    rows = []
    for i in range(B):
        n = L - (i * 2654435761) % max(1, L // 10) if ragged else L
        kind = KINDS[i % len(KINDS)]
        if kind.startswith("continue"):
            src, ids = texts.window(kind.split("-")[1], i, n)
            rows.append(Prompt(kind, src, list(ids)))
            continue
        doc_kind = ("prose", "code")[(i // len(KINDS) + (kind == "question")) % 2]
        src, ids = texts.window(doc_kind, i, n)
        doc = tok.decode(ids)
        ask = SUMMARY if kind == "summary" else _question(doc_kind, doc, i)
        overhead = len(_chat(tok, "\n\n" + ask))
        keep = n - overhead - 4
        for _ in range(4):   # re-tokenising decoded text can shift the count: trim until it fits
            prompt = _chat(tok, tok.decode(ids[:keep]) + "\n\n" + ask)
            if len(prompt) <= n:
                break
            keep -= len(prompt) - n + 2
        rows.append(Prompt(kind, src, prompt))
    return rows


def continuations(texts: _Texts, L: int, B: int) -> list[Prompt]:
    """B raw windows of exactly L tokens, code and prose in turn."""
    out = []
    for i in range(B):
        kind = ("code", "prose")[i % 2]
        src, ids = texts.window(kind, i, L)
        out.append(Prompt(f"continue-{kind}", src, list(ids)))
    return out


def folder_prompts(tok, path: str, L: int, B: int, chat: bool) -> list[Prompt]:
    """The text files of `path`, one prompt each (cut to their last L tokens), rows taking turns over them."""
    from jspec import data
    files = data._text_files(path, (".txt", ".py", ".md", ".rst", ".json"))
    out = []
    for i in range(B):
        p = files[i % len(files)]
        text = p.read_text(encoding="utf-8", errors="replace")
        ids = _chat(tok, text) if chat else tok.encode(text, add_special_tokens=False)
        out.append(Prompt("chat" if chat else "raw", p.name, list(ids[-L:])))
    return out


def make_prompts(tok, workload: str, L: int, B: int, texts: Optional[_Texts], chat: bool = False,
                 serial: int = 1) -> list[Prompt]:
    """The prompts of one (L, B) shape: B rows, or at B=1 with serial > 1 that many rows of ~L tokens
    (`--serial`: decoded one at a time)."""
    one_by_one = B == 1 and serial > 1
    B = serial if one_by_one else B
    if workload == "long-tasks":
        return long_tasks(tok, texts, L, B, ragged=not one_by_one)
    if workload == "continue":
        return continuations(texts, L, B)
    if os.path.isdir(workload):
        return folder_prompts(tok, workload, L, B, chat)
    raise BenchError(f"unknown workload {workload!r}: long-tasks, continue, or a folder of prompt files")


# ------------------------------------------------------------------------------------------------ running

def distinct_share(rows: list) -> float:
    """Mean over rows of distinct tokens / tokens in the output (1.0: no token repeats)."""
    shares = [len(set(t)) / len(t) for t in rows if t]
    return round(sum(shares) / len(shares), 4) if shares else 0.0


def differences(ref: list, got: list) -> list[dict]:
    """Every row where `got` differs from `ref`: its first differing position and the two tokens there."""
    out = []
    for r, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            pos = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append(dict(row=r, position=pos, ar_token=a[pos] if pos < len(a) else None,
                            token=b[pos] if pos < len(b) else None))
    return out


def dense_twin(spec: MethodSpec, methods: list) -> Optional[MethodSpec]:
    """The method in `methods` that drafts like `spec` but verifies densely (same method and non-verify knobs)."""
    def drafting(m):
        return m.method, tuple((k, v) for k, v in m.knobs if k not in ("verify", "profile")
                               and not k.startswith("verify_"))
    return next((m for m in methods if m is not spec and drafting(m) == drafting(spec)
                 and dict(m.knobs).get("verify", "dense") == "dense" and "profile" not in dict(m.knobs)), None)


def fidelity(spec: MethodSpec, methods: list, outputs: dict) -> Optional[dict]:
    """A lossy method's free-running fidelity against its dense twin's output (`dense_twin`, run earlier in the
    same shape): mean tokens until the first divergence over rows, and the share of identical rows."""
    twin = dense_twin(spec, methods)
    if twin is None or twin.label not in outputs:
        return None
    ref, got = outputs[twin.label], outputs[spec.label]
    firsts = [next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
              for a, b in zip(ref, got)]
    return dict(reference=twin.label, tokens_to_first_divergence_mean=round(sum(firsts) / len(firsts), 2),
                rows_identical=round(sum(a == b for a, b in zip(ref, got)) / len(ref), 4))


def serial_output(outs: list):
    """One `jspec.Output` for prompts decoded one after another (`--serial`), as if they were rows of one run:
    rows in order, times summed, tokens/s = every row's new tokens after its first over the summed decode time
    (as `jspec.generate` counts a batch), tau from the summed acceptance histograms, rounds per row."""
    import numpy as np

    from jspec.api import Output, Stats
    from jspec.speculative.engine import _mean_emitted
    st = [o.stats for o in outs]
    cat = lambda field: None if getattr(st[0], field) is None else sum((getattr(s, field) for s in st), [])
    decode = sum(s.decode_s for s in st)
    rows = sum((o.tokens for o in outs), [])
    stats = Stats(method=st[0].method, batch=1, prompt_tokens=cat("prompt_tokens"), new_tokens=cat("new_tokens"),
                  prefill_s=sum(s.prefill_s for s in st), decode_s=decode,
                  tokens_per_s=sum(max(len(t) - 1, 0) for t in rows) / max(decode, 1e-9), rounds=cat("rounds"),
                  tau_per_sequence=cat("tau_per_sequence"), knobs=st[0].knobs, lossless=all(s.lossless for s in st))
    if st[0].accept_hist is not None:
        hist = np.sum([s.accept_hist for s in st], axis=0)
        stats.accept_hist = hist.tolist()
        stats.tau = float(_mean_emitted(hist))
    return Output(texts=sum((o.texts for o in outs), []), tokens=rows, stats=stats)


def run_method(model, spec: MethodSpec, prompts: list, *, new: int, ignore_eos: bool, reps: int, impl,
               temperature: float = 0.0, seed: int = 0, serial: bool = False):
    """Warm-up call (compilation), then `reps` timed calls of `jspec.generate`; the fastest is kept.
    reps=0: one call, no warm-up (its time includes compilation: for checks that only need the tokens).
    serial: each prompt alone, one after another (`serial_output`); the warm-up runs one prompt of each length."""
    import jspec
    kw = dict(method=spec.method, max_new_tokens=new, ignore_eos=ignore_eos, impl=impl, temperature=temperature,
              seed=seed, **dict(spec.knobs))

    def call(rows):
        if not serial:
            return jspec.generate(model, rows, **kw)
        return serial_output([jspec.generate(model, [p], **kw) for p in rows])

    if reps == 0:
        return call(prompts), 0.0
    t = time.perf_counter()
    call(list({len(p): p for p in prompts}.values()) if serial else prompts)
    warm_s = time.perf_counter() - t
    best = None
    for _ in range(reps):
        out = call(prompts)
        if best is None or out.stats.decode_s < best.stats.decode_s:
            best = out
    return best, warm_s


def bench(model, *, methods: list, lengths: list, batches: list, workload: str = "long-tasks", new: int = 256,
          texts_dir: Optional[str] = None, ignore_eos: bool = False, reps: int = 1, chat: bool = False,
          lossless_check: bool = False, impl=None, cost_impl=None, serial: int = 1, log=print,
          on_record=None) -> list[dict]:
    """Every method on every (L, B) shape, one prompt set per shape; records as the module docstring says.
    serial > 1: B=1 shapes decode that many prompts one after another (`--serial`).
    `on_record(records)` is called after each method (the CLI rewrites its JSON: a killed run keeps its rows).
    cost_impl: also time each method with this impl (the default mode, against an exact-mode `impl`) and record
    default_tokens_per_s and exact_cost_frac = (default - exact) / default tokens/s."""
    from jspec.attention import AttnImpl
    impl = AttnImpl() if impl is None else impl
    tok = model.tokenizer
    texts = _Texts(tok, *text_sources(texts_dir)) if workload in ("long-tasks", "continue") else None
    # ar first: the reference for every speedup and identity of its shape
    ar = MethodSpec.parse("ar")
    methods = [ar] + [m for m in methods if m != ar]
    records = []
    for L in lengths:
        for B in batches:
            prompts = make_prompts(tok, workload, L, B, texts, chat, serial)
            one_by_one = len(prompts) > B
            ids = [p.tokens for p in prompts]
            lens = [len(t) for t in ids]
            log(f"L={L} B={B}: prompt tokens {min(lens)}-{max(lens)} ({Counter(p.kind for p in prompts)})")
            ref, outputs = None, {}
            for spec in methods:
                # The lossless check needs tokens, not times: one call per method, compilation included.
                out, warm_s = run_method(model, spec, ids, new=new, ignore_eos=ignore_eos,
                                         reps=0 if lossless_check else reps, impl=impl, serial=one_by_one)
                s, toks = out.stats, out.tokens
                if spec.method == "ar" and ref is None:
                    ref = dict(tokens=toks, tps=s.tokens_per_s)
                diffs = differences(ref["tokens"], toks)
                rows = len(toks)
                rec = dict(method=spec.label, base_method=spec.method, knobs=s.knobs or dict(spec.knobs),
                           lookup=int(dict(spec.knobs).get("lookup", 0)), L=L, B=B,
                           workload=workload, prompt_tokens_min=min(lens), prompt_tokens_max=max(lens),
                           prompt_tokens_mean=round(sum(lens) / len(lens), 1),
                           new_tokens_mean=round(sum(s.new_tokens) / rows, 1), tokens_per_s=round(s.tokens_per_s, 1),
                           decode_s=round(s.decode_s, 4), prefill_s=round(s.prefill_s, 4), warmup_s=round(warm_s, 1),
                           tau=round(s.tau, 3), speedup_vs_ar=round(s.tokens_per_s / ref["tps"], 3),
                           rows_identical_to_ar=round(1 - len(diffs) / rows, 4), lossless=s.lossless,
                           distinct_token_share=distinct_share(toks), kinds=[p.kind for p in prompts])
                # The batch loops until its slowest row is done: its rounds (ar: one per token after the
                # prefill's) and the time of one, which compares workloads whose rows differ in tau or length.
                # Serial prompts ran one after another: the rounds of all of them took the summed decode time.
                per_row = s.rounds if s.rounds else [max(n - 1, 0) for n in s.new_tokens]
                rounds = sum(per_row) if one_by_one else max(per_row)
                rec.update(rounds_max=int(max(per_row)), round_ms=round(1000 * s.decode_s / max(rounds, 1), 3))
                if one_by_one:
                    rec["serial"] = rows   # prompts decoded one at a time, each alone in its batch
                outputs[spec.label] = toks
                if not s.lossless:   # against the same drafter verified densely, when this run has it
                    rec["fidelity"] = fidelity(spec, methods, outputs)
                if lossless_check:
                    rec.update(differences=diffs, timed=False)   # tokens/s includes compilation here
                if impl.exact:   # where a row leaves exact ar's output says which step broke the guarantee
                    rec.update(exact=True, differences=diffs)
                if cost_impl is not None:   # the same method and prompts in the default mode, timed alike
                    base, _ = run_method(model, spec, ids, new=new, ignore_eos=ignore_eos, reps=reps, impl=cost_impl,
                                         serial=one_by_one)
                    d = base.stats.tokens_per_s
                    rec.update(default_tokens_per_s=round(d, 1), exact_cost_frac=round((d - s.tokens_per_s) / d, 4))
                records.append(rec)
                if on_record is not None:
                    on_record(records)
                cost = f"  exact costs {rec['exact_cost_frac']:.1%}" if "exact_cost_frac" in rec else ""
                log(f"  {spec.label:<28} {rec['tokens_per_s']:>10.1f} tok/s  {rec['speedup_vs_ar']:>5.2f}x ar  "
                    f"tau {rec['tau']:<5} identical {rec['rows_identical_to_ar']:.2f}  distinct "
                    f"{rec['distinct_token_share']:.2f}  (warm-up {warm_s:.0f} s){cost}"
                    + ("" if s.lossless else f"  LOSSY, fidelity vs dense {rec['fidelity']}"))
            for rec, spec in zip(records[len(records) - len(methods):], methods):   # a dense twin run later
                if not rec["lossless"] and rec.get("fidelity") is None:
                    rec["fidelity"] = fidelity(spec, methods, outputs)
            if on_record is not None:
                on_record(records)
    return records


def exact_summary(records: list) -> dict:
    """`--exact`'s summary: the least share of rows identical to (exact) ar over every other method and shape,
    the methods it covers, and with `--exact-cost` exact mode's cost per method (its largest over the shapes)
    and the largest over the methods, ar included; None where not measured."""
    others = [r for r in records if r.get("base_method", r["method"]) != "ar" and r.get("lossless", True)]
    costs = {}
    for r in records:
        if "exact_cost_frac" in r:
            costs[r["method"]] = max(costs.get(r["method"], r["exact_cost_frac"]), r["exact_cost_frac"])
    return {"exact_rows_identical_frac_min": min((r["rows_identical_to_ar"] for r in others), default=None),
            "exact_methods": list(dict.fromkeys(r["method"] for r in others)),
            "exact_cost_frac_max": max(costs.values()) if costs else None,
            "exact_cost_frac": costs}


def document_summary(records: list, peers: list, settings: dict) -> dict:
    """A result file's summary: `summarize`, plus `--check-lossless`'s and `--exact`'s own figures."""
    summary = summarize(records, peers)
    if settings.get("check_lossless"):
        done = {r["method"] for r in records}
        summary["lossless"] = {m: min(r["rows_identical_to_ar"] for r in records if r["method"] == m)
                               for m in settings["methods"] if m in done
                               if all(r["lossless"] for r in records if r["method"] == m)}
        rows = [settings.get("serial", 1) if b == 1 else b for b in settings["batches"]]
        summary["rows_checked_per_method"] = sum(rows) * len(settings["lengths"])
    if settings.get("exact"):
        summary.update(exact_summary(records))
    return summary


def _read_result(path: str) -> dict:
    """A result JSON of `jspec bench` (anything without records is refused with a one-line error)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise BenchError(f"cannot read {path!r}: {e}") from None
    if not isinstance(doc, dict) or "records" not in doc:
        raise BenchError(f"{path!r} is not a jspec bench result")
    return doc


def _write_json(doc: dict, path: str):
    with open(path + ".part", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".part", path)   # never a half-written result file


def merge(paths: list, out: str) -> dict:
    """One result file from the files of several calls (e.g. B=16 and B=64 on a lent GPU whose calls are
    time-limited), so each shape keeps every figure of the one call that ran it: every ratio in a shape (x ar,
    exact mode's cost) still divides two numbers of one run. Refused unless the files come from the same
    source (commit and tree hash) and device with the same settings (shapes aside), every shape is in
    exactly one file, and each shape has its ar record. `provenance.runs` lists each call; each record says
    which (`run`)."""
    docs = [_read_result(p) for p in paths]
    for p, d in zip(paths, docs):
        if not {"provenance", "settings"} <= set(d):
            raise BenchError(f"{p!r} is not a jspec bench result")
    if len(docs) < 2:
        raise BenchError("--merge needs at least two result files")
    first = docs[0]
    source = lambda d: tuple(d["provenance"].get(k) for k in ("commit", "tree_hash", "dirty", "device", "jax",
                                                                "xla_flags", "matmul_precision"))
    # --serial shapes only B=1's prompts (its records say how many ran): it may differ for files without B=1
    same = lambda d: {k: v for k, v in d["settings"].items() if k not in ("lengths", "batches", "methods", "serial")}
    serials = {d["settings"].get("serial", 1) for d in docs if any(r["B"] == 1 for r in d["records"])}
    if len(serials) > 1:
        raise BenchError(f"the B=1 shapes were run with different --serial ({sorted(serials)})")
    shapes, records, peers, runs = {}, [], [], []
    for i, (p, d) in enumerate(zip(paths, docs)):
        if source(d) != source(first):
            raise BenchError(f"{p!r} comes from another source or device than {paths[0]!r}: "
                             f"{source(d)} against {source(first)}")
        if same(d) != same(first):
            raise BenchError(f"{p!r} was run with other settings than {paths[0]!r}")
        for r in d["records"]:
            shape = (r["L"], r["B"])
            if shapes.setdefault(shape, p) != p:
                raise BenchError(f"L={shape[0]} B={shape[1]} is in both {shapes[shape]!r} and {p!r}: a shape must "
                                 f"come from one call")
            records.append(dict(r, run=i))
        for shape in {(r["L"], r["B"]) for r in d["records"]}:
            if not any(r["method"] == "ar" and (r["L"], r["B"]) == shape for r in d["records"]):
                raise BenchError(f"{p!r} has no ar record at L={shape[0]} B={shape[1]}")
        peers += [dict(q, run=i) for q in d.get("peers", [])]
        runs.append(dict(file=os.path.basename(p), command=d["provenance"].get("command"),
                         complete=d.get("complete"), wall_s=d.get("wall_s"),
                         shapes=sorted({f"L{r['L']}_B{r['B']}" for r in d["records"]})))
    settings = dict(first["settings"], lengths=sorted({L for L, _ in shapes}), batches=sorted({B for _, B in shapes}),
                    methods=list(dict.fromkeys(m for d in docs for m in d["settings"]["methods"])))
    if "serial" in first["settings"] or serials:
        settings["serial"] = serials.pop() if serials else 1
    doc = dict(provenance=dict(first["provenance"], runs=runs), settings=settings,
               complete=all(d.get("complete") for d in docs), wall_s=round(sum(d.get("wall_s") or 0 for d in docs), 1),
               records=records, peers=peers, summary=document_summary(records, peers, settings))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    _write_json(doc, out)
    return doc


def summarize(records: list, peers: list) -> dict:
    """Per shape: ar's tokens/s, each method's speedup, the best lossless method, and ar against each peer."""
    out = {}
    for (L, B) in sorted({(r["L"], r["B"]) for r in records}):
        rows = [r for r in records if (r["L"], r["B"]) == (L, B)]
        ar = next(r for r in rows if r["method"] == "ar")
        spec = [r for r in rows if r.get("base_method", r["method"]) != "ar"]
        exact = [r for r in spec if r.get("lossless", True)]
        lossy = [r for r in spec if not r.get("lossless", True)]
        best = max(exact, key=lambda r: r["tokens_per_s"], default=None)
        best_plain = max((r for r in exact if not r["lookup"]), key=lambda r: r["tokens_per_s"], default=None)
        best_lossy = max(lossy, key=lambda r: r["tokens_per_s"], default=None)
        shape = {"ar_tokens_per_s": ar["tokens_per_s"],
                 "speedup_vs_ar": {r["method"]: r["speedup_vs_ar"] for r in rows if r["method"] != "ar"},
                 "best": best and best["method"], "best_speedup_vs_ar": best and best["speedup_vs_ar"],
                 "best_without_lookup": best_plain and best_plain["method"],
                 "best_without_lookup_speedup_vs_ar": best_plain and best_plain["speedup_vs_ar"],
                 "ar_distinct_token_share": ar["distinct_token_share"]}
        if best_lossy is not None:   # sparse verification: lossy, never "best" above
            shape.update(best_lossy=best_lossy["method"], best_lossy_speedup_vs_ar=best_lossy["speedup_vs_ar"])
        for p in peers:
            if (p.get("L"), p.get("B")) == (L, B) and p.get("tokens_per_s"):
                shape[f"ar_speedup_vs_{p['peer']}"] = round(ar["tokens_per_s"] / p["tokens_per_s"], 3)
        out[f"L{L}_B{B}"] = shape
    return out


def plot(records: list, peers: list, path: str) -> Optional[str]:
    """Bars of tokens/s per method (peers grey) for each shape, labelled with the speedup over ar."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    shapes = sorted({(r["L"], r["B"]) for r in records})
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.8 * len(shapes), 4.2), squeeze=False)
    for ax, (L, B) in zip(axes[0], shapes):
        rows = [r for r in records if (r["L"], r["B"]) == (L, B)]
        ps = [p for p in peers if (p.get("L"), p.get("B")) == (L, B) and p.get("tokens_per_s")]
        names = [p["peer"] for p in ps] + [r["method"] for r in rows]
        vals = [p["tokens_per_s"] for p in ps] + [r["tokens_per_s"] for r in rows]
        colors = ["0.6"] * len(ps) + ["C0" if r["method"] == "ar" else "C1" if r.get("lossless", True) else "C3"
                                      for r in rows]
        bars = ax.bar(range(len(vals)), vals, color=colors)
        ar = next(r["tokens_per_s"] for r in rows if r["method"] == "ar")
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, v, f"{v / ar:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(vals)), names, rotation=45, ha="right", fontsize=7)
        ax.set_title(f"L={L}, B={B}", fontsize=9)
        ax.set_ylabel("new tokens/s")
    fig.suptitle("jspec bench: new tokens/s through jspec.generate\n(label: x ar in the same run; grey: peers; "
                 "red: lossy sparse verification)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_peers(peers: list, model_path: str, prompts_path: str, new: int, ignore_eos: bool, stop_tokens,
              timeout_s: float, log=print) -> list[dict]:
    """Each peer in its own process (`python -m jspec.peers`) on the saved prompts, before JAX takes the GPU."""
    out = []
    for peer in peers:
        res = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
        cmd = [sys.executable, "-m", "jspec.peers", "--peer", peer, "--prompts", prompts_path, "--model-dir",
               model_path, "--new", str(new), "--out", res]
        if not ignore_eos:
            cmd += ["--stop-tokens", ",".join(map(str, stop_tokens))]
        log(f"peer {peer}: {' '.join(cmd[2:4])} ...")
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
            if run.returncode != 0:
                raise RuntimeError((run.stderr or run.stdout).strip()[-600:])
            got = [{k: v for k, v in r.items() if k != "tokens"} for r in json.load(open(res))]
            for r in got:
                log(f"  {peer} L={r.get('L')} B={r.get('B')}: {r.get('tokens_per_s') or r.get('error')} tok/s")
            out += got
        except Exception as e:   # a peer that cannot run is recorded as such; jspec's figures still stand
            log(f"  peer {peer} failed: {type(e).__name__}: {str(e)[-300:]}")
            out.append(dict(peer=peer, error=f"{type(e).__name__}: {str(e)[-600:]}"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="jspec bench", description=__doc__.split("\n")[0])
    add_arguments(ap)
    a = ap.parse_args(argv)
    try:
        return run(a)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def add_arguments(ap):
    ap.add_argument("--model", default="smollm2-135m", help="known name or converted checkpoint dir")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                    help="comma-separated method[+lookupN][:knob=value,...] list (ar is always run as the "
                         f"reference; default {','.join(DEFAULT_METHODS)})")
    ap.add_argument("--lengths", default="7936",
                    help="context lengths L (the longest prompt), comma-separated (default 7936: with 256 new "
                         "tokens, an 8K-context model's 8,192 positions)")
    ap.add_argument("--batches", default="1,16,64", help="batch sizes, comma-separated (default 1,16,64)")
    ap.add_argument("--new-tokens", type=int, default=256, help="new tokens per row (default 256)")
    ap.add_argument("--workload", default="long-tasks", help="long-tasks (default), continue, or a prompt folder")
    ap.add_argument("--texts", default=None, metavar="DIR",
                    help="text folder for long-tasks / continue (*.py code, other files prose); default: the "
                         "running Python's standard library and pydoc topics")
    ap.add_argument("--chat", action="store_true", help="with a prompt folder: wrap each file in the chat template")
    ap.add_argument("--ignore-eos", action="store_true", help="decode every row to --new-tokens")
    ap.add_argument("--serial", type=int, default=1, metavar="N",
                    help="at B=1: decode N prompts of ~L tokens one after another, each alone, as one record "
                         "(the peers alike); default 1: one prompt")
    ap.add_argument("--reps", type=int, default=1, help="timed calls per method after the warm-up (fastest kept)")
    ap.add_argument("--check-lossless", action="store_true",
                    help="float32 weights with the highest matmul precision: list every row where a lossless "
                         "method's tokens differ from ar's (exit 1 if any)")
    ap.add_argument("--exact", action="store_true",
                    help="bf16 exact mode (AttnImpl(exact=True)) for every method, ar (the reference) included: "
                         "greedy rows must equal ar's; the summary gives the least share that does")
    ap.add_argument("--exact-cost", action="store_true",
                    help="with --exact: also time each method in the default mode in the same call and record "
                         "exact mode's cost per method (summary: exact_cost_frac_max)")
    ap.add_argument("--peers", default="", help="comma-separated peers run first on the same prompts in their own "
                                                 "process: hf (transformers, static cache), hf-compile "
                                                 "(the same under torch.compile, mode reduce-overhead)")
    ap.add_argument("--peer-timeout", type=float, default=600.0, help="seconds each peer may take")
    ap.add_argument("--out", default="jspec-bench.json", help="result JSON (a .png plot is written beside it)")
    ap.add_argument("--replot", metavar="FILE", default=None,
                    help="only redraw the plot of an existing result JSON (beside it) and print its table")
    ap.add_argument("--merge", nargs="+", metavar="FILE", default=None,
                    help="only merge result files of one source and settings, each shape from one call, into --out")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="record a run from a tree that differs from its commit (marked dirty)")


def _ints(text: str, flag: str) -> list:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BenchError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise BenchError(f"{flag} needs positive integers, got {text!r}")
    return vals


def run(a) -> int:
    from jspec import provenance
    if a.merge:
        doc = merge(a.merge, a.out)
        png = plot(doc["records"], doc["peers"], os.path.splitext(a.out)[0] + ".png")
        print(f"wrote {a.out}" + (f" and {png}" if png else "") + f" from {len(a.merge)} runs")
        _print_table(doc["records"], doc["peers"])
        return 0
    if a.replot:
        doc = _read_result(a.replot)
        print(f"wrote {plot(doc['records'], doc.get('peers', []), os.path.splitext(a.replot)[0] + '.png')}")
        _print_table(doc["records"], doc.get("peers", []))
        return 0
    methods = split_methods(a.methods)
    if not methods:
        raise BenchError("--methods is empty")
    lengths, batches = _ints(a.lengths, "--lengths"), _ints(a.batches, "--batches")
    if a.reps < 1:
        raise BenchError(f"--reps must be >= 1, got {a.reps}")
    if a.serial < 1:
        raise BenchError(f"--serial must be >= 1, got {a.serial}")
    if a.new_tokens < 1:
        raise BenchError(f"--new-tokens must be >= 1, got {a.new_tokens}")
    if a.exact_cost and not a.exact:
        raise BenchError("--exact-cost measures exact mode: give --exact too")
    if a.exact and a.check_lossless:
        raise BenchError("--exact is a bf16 mode and --check-lossless runs float32: give one of them")
    if a.workload not in ("long-tasks", "continue") and not os.path.isdir(a.workload):
        raise BenchError(f"unknown workload {a.workload!r}: long-tasks, continue, or a folder of prompt files")
    if a.texts is not None and not os.path.isdir(a.texts):
        raise BenchError(f"--texts {a.texts!r} is not a folder")
    peers = [p for p in a.peers.split(",") if p.strip()]
    if set(peers) - {"hf", "hf-compile"}:
        raise BenchError(f"unknown peer(s) {sorted(set(peers) - {'hf', 'hf-compile'})}: hf, hf-compile")
    if a.check_lossless:   # lossy verifications (verify=...) run too; only the lossless methods are checked
        os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
    # Provenance first: a run that could not be recorded should not spend the GPU.
    state = provenance.source_state()
    if (state["dirty"] or not state["verified"]) and not a.allow_dirty:
        what = "dirty" if state["verified"] else "not tied to a commit"
        raise BenchError(f"refusing to run: the source tree is {what}"
                         f" (commit {state['commit'][:12]}, tree {state['tree_hash']}); commit first, pass "
                         f"JSPEC_COMMIT=$(python -m jspec.provenance) on a machine without .git, or --allow-dirty")

    from jspec import checkpoints
    path = checkpoints.resolve(a.model, progress=True)
    model_cfg = checkpoints.load_config(path)
    max_pos = model_cfg.max_position
    if max(lengths) + a.new_tokens > max_pos:
        raise BenchError(f"--lengths {max(lengths)} + --new-tokens {a.new_tokens} exceed the model's context of "
                         f"{max_pos} positions; use L <= {max_pos - a.new_tokens}")
    check_methods(methods, model_cfg)
    peer_records = []
    if peers:   # before JAX allocates the GPU: the peers' prompts are built with the tokenizer alone
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(f"{path}/tokenizer")
        texts = _Texts(tok, *text_sources(a.texts)) if a.workload in ("long-tasks", "continue") else None
        shapes = {f"{L}x{B}": [p.tokens for p in make_prompts(tok, a.workload, L, B, texts, a.chat, a.serial)]
                  for L in lengths for B in batches}
        ppath = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
        json.dump(shapes, open(ppath, "w"))
        cfg = checkpoints.load_config(path)
        stops = sorted(set(cfg.eos_token_ids) | ({tok.eos_token_id} if tok.eos_token_id is not None else set()))
        peer_records = run_peers(peers, path, ppath, a.new_tokens, a.ignore_eos, stops, a.peer_timeout)

    import jax
    import jspec
    from jspec.attention import AttnImpl
    if a.check_lossless:
        jax.config.update("jax_default_matmul_precision", "highest")
    model = jspec.load(path, dtype="float32" if a.check_lossless else None)
    impl = AttnImpl(exact=True) if a.exact else AttnImpl()
    t0 = time.perf_counter()
    prov = provenance.record(allow_dirty=True)   # checked above; the record keeps dirty/verified as found
    settings = dict(methods=[m.label for m in methods], lengths=lengths, batches=batches, workload=a.workload,
                    texts=a.texts, new_tokens=a.new_tokens, ignore_eos=a.ignore_eos, reps=a.reps, serial=a.serial,
                    exact=a.exact, exact_cost=a.exact_cost, check_lossless=a.check_lossless,
                    dtype=str(jax.tree.leaves(model.params)[0].dtype))
    if a.exact:   # False: this model or device falls back to the default path, and the run is not exact mode
        from jspec import layers
        settings["exact_supported"] = layers.exact_supported(model.params, model.cfg, impl)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)

    def write(records, complete=False):
        doc = dict(provenance=prov, settings=settings, complete=complete, wall_s=round(time.perf_counter() - t0, 1),
                   records=records, peers=peer_records, summary=document_summary(records, peer_records, settings))
        _write_json(doc, a.out)

    records = bench(model, methods=methods, lengths=lengths, batches=batches, workload=a.workload,
                    new=a.new_tokens, texts_dir=a.texts, ignore_eos=a.ignore_eos, reps=a.reps, chat=a.chat,
                    lossless_check=a.check_lossless, impl=impl, cost_impl=AttnImpl() if a.exact_cost else None,
                    serial=a.serial, on_record=write)
    write(records, complete=True)
    png = plot(records, peer_records, os.path.splitext(a.out)[0] + ".png")
    print(f"wrote {a.out}" + (f" and {png}" if png else ""))
    _print_table(records, peer_records)
    if a.check_lossless:
        # A lossy verification differs by design: its rows_identical_to_ar is reported, not checked.
        bad = [(r["method"], r["L"], r["B"], d) for r in records if r["lossless"] for d in r.get("differences", [])]
        for m, L, B, d in bad:
            print(f"DIFFERS {m} L={L} B={B} row {d['row']} at position {d['position']}: ar {d['ar_token']} vs "
                  f"{d['token']}")
        print("lossless check: " + ("every row identical to ar" if not bad else f"{len(bad)} rows differ"))
        return 1 if bad else 0
    return 0


def _print_table(records, peers):
    print(f"{'L':>6} {'B':>4} {'method':<28} {'tok/s':>10} {'x ar':>6} {'tau':>6} {'ident':>6} {'distinct':>8}")
    for r in records:
        print(f"{r['L']:>6} {r['B']:>4} {r['method']:<28} {r['tokens_per_s']:>10.1f} {r['speedup_vs_ar']:>6.2f} "
              f"{r['tau']:>6.2f} {r['rows_identical_to_ar']:>6.2f} {r['distinct_token_share']:>8.2f}"
              + ("" if r.get("lossless", True) else "  LOSSY"))
    for p in peers:
        if p.get("tokens_per_s"):
            print(f"{p['L']:>6} {p['B']:>4} {'peer ' + p['peer']:<28} {p['tokens_per_s']:>10.1f}")


if __name__ == "__main__":
    sys.exit(main())
