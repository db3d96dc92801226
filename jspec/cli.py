"""`jspec` command line: each subcommand parses flags and calls a keyword-only function tests can import."""
from __future__ import annotations

import argparse
import json
import re
import sys

# SpecConfig knobs that `jspec generate` sets from a flag of the same name (tree_widths: --widths)
_KNOB_FLAGS = ("gamma", "budget", "ratio", "sink", "page_size", "min_tokens", "max_tokens", "score_mode", "collect",
               "mode", "topk", "select_page", "lookup", "tree_widths")


def _flag(knob: str) -> str:
    """The `jspec generate` flag of a SpecConfig / Verify keyword (tree_widths: --widths)."""
    return f"--{'widths' if knob == 'tree_widths' else knob.replace('_', '-')}"


def cmd_fetch(*, model: str = "smollm2-135m", progress: bool = True) -> str:
    from jspec import checkpoints
    path = checkpoints.resolve(model, progress=progress)
    print(path)
    return path


def cmd_convert(*, out: str, from_hf=None, from_gguf=None, dtype="bfloat16", overwrite=False, progress=True) -> str:
    from jspec import checkpoints
    from jspec.errors import InputError
    if (from_hf is None) == (from_gguf is None):
        raise InputError("give exactly one of --from-hf DIR or --from-gguf FILE")
    path = checkpoints.convert(out=out, from_hf=from_hf, from_gguf=from_gguf, dtype=dtype, overwrite=overwrite,
                               progress=progress)
    print(f"converted -> {path}")
    return path


def cmd_generate(*, model: str = "smollm2-135m", method=None, prompt=None, prompt_file=None,
                 prompt_tokens: int = 3000, batch: int = 1, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, chat: bool = False, seed: int = 0, ignore_eos: bool = False,
                 as_json: bool = False, config=None, devices: int = 1, gamma=None, budget=None, ratio=None,
                 sink=None, page_size=None, min_tokens=None, max_tokens=None, score_mode=None, collect=None,
                 mode=None, widths=None, drafter=None, topk=None, select_page=None, exact=False, slots=None,
                 refill=None, staged=False, lookup=None, verify=None, verify_budget=None, verify_page=None,
                 verify_m=None, verify_refresh=None, verify_signals=None, profile=None):
    import jspec
    from jspec import data

    # Bad flag values are caught before the model loads, so they fail at once.
    # (--devices: jspec.load checks it against the devices present before reading any weight.)
    _check_positive(("--batch", batch), ("--max-new-tokens", max_new_tokens), ("--prompt-tokens", prompt_tokens),
                    ("--slots", slots), ("--refill", refill))
    if slots is None and (refill is not None or staged):
        raise jspec.InputError("refill and staged apply to continuous batching only: --refill and --staged need "
                               "--slots N")
    _check_sampling(temperature, top_k, top_p)
    # Knobs left unset (None) come from --config, else SpecConfig's defaults; explicit flags win over the file.
    knobs = {k: v for k, v in dict(gamma=gamma, budget=budget, ratio=ratio, sink=sink, page_size=page_size,
                                   min_tokens=min_tokens, max_tokens=max_tokens, score_mode=score_mode,
                                   collect=collect, mode=mode, topk=topk, select_page=select_page, lookup=lookup,
                                   tree_widths=_widths(widths) if widths else None).items() if v is not None}
    vknobs = {k: v for k, v in dict(verify=verify, verify_budget=verify_budget, verify_page=verify_page,
                                    verify_m=verify_m, verify_refresh=verify_refresh, verify_signals=verify_signals,
                                    profile=profile).items() if v is not None}
    try:
        spec = jspec.api.spec_config(method, config, **knobs, **vknobs)
    except jspec.InputError as e:
        given = {**knobs, **vknobs}
        foreign = re.fullmatch(r"(\w+) is an? (\w+) option; method '(\w+)' takes (.*)", str(e))
        if foreign and foreign[1] in knobs:   # another method's flag: say it as flags, as the user wrote it
            takes = [_flag(k) for k in foreign[4].split(", ") if k in _KNOB_FLAGS]
            raise jspec.InputError(f"{_flag(foreign[1])} is a {foreign[2]} option; --method {foreign[3]} takes "
                                   + (", ".join(takes) if takes else "none of the method flags")) from None
        if "only apply to" in str(e):   # name the flags, not the keywords
            from jspec.speculative.config import METHODS
            dense = "only apply to a sparse verification" in str(e)
            drafts = "only apply to the sparse drafts" in str(e)
            named = (sorted(k for k in vknobs if k != "verify") if dense else
                     sorted(k for k in knobs if k in jspec.api.DRAFT_BUDGET_KNOBS) if drafts else
                     sorted(given))
            flags = ", ".join(_flag(k) for k in named)
            verb = f"appl{'ies' if len(named) == 1 else 'y'}"
            if drafts:
                raise jspec.InputError(f"{flags} only {verb} to the sparse drafts of streaming, quest and vegas; "
                                       f"--method longspec drafts with its trained drafter") from None
            if dense:
                raise jspec.InputError(f"{flags} only {verb} to a sparse verification (--verify dustin, streaming or "
                                       f"quest), not the dense default") from None
            raise jspec.InputError(f"{flags} only {verb} to the speculative methods ({', '.join(METHODS)}), not ar"
                                   + ("" if method else " (the default without --method or --config)")) from None
        raise
    method = "ar" if spec is None else spec.method
    if drafter is not None and method != "longspec":
        raise jspec.InputError("--drafter only applies to --method longspec")
    text = prompt if prompt is not None else None if prompt_file is None else _read_text(prompt_file, "--prompt-file")

    m = jspec.load(model) if devices == 1 else jspec.load(model, devices=devices)
    if text is not None:
        prompts = [text] * batch
    else:  # default: real long documents from the running Python's standard library
        prompts = data.long_prompts(m.tokenizer, prompt_tokens, count=batch)
    # --exact: bf16 exact mode (AttnImpl.exact): every decode and verification step rounds each row as a
    # one-token step at its position would, so any lossless method's greedy output equals `--exact` ar's.
    from jspec.attention import AttnImpl
    impl = AttnImpl(exact=True) if exact else AttnImpl()
    # The file and the flags go through as given (generate merges them as spec_config did above), so a
    # longspec run that names no shape drafts the drafter's tuned one for this batch.
    out = jspec.generate(m, prompts, method=method, max_new_tokens=max_new_tokens, temperature=temperature,
                         top_k=top_k, top_p=top_p, chat=chat, seed=seed, ignore_eos=ignore_eos, config=config,
                         drafter=drafter, impl=impl, slots=slots, refill=refill,
                         staged=staged, progress=slots is not None, **knobs, **vknobs)
    s = out.stats
    if as_json:
        print(json.dumps({"texts": out.texts, "tokens": out.tokens, "stats": vars(s)}))
    else:
        for i, t in enumerate(out.texts):
            print(f"--- sequence {i} ({s.prompt_tokens[i]} prompt tokens, {s.new_tokens[i]} new) ---")
            print(t)
        print(f"--- {method}: batch {s.batch}, prefill {s.prefill_s:.2f} s, decode {s.decode_s:.2f} s "
              f"(includes compilation on first use), {s.tokens_per_s:.1f} tokens/s, tau {s.tau:.2f}"
              + (f" (per sequence {min(s.tau_per_sequence):.2f}-{max(s.tau_per_sequence):.2f})"
                 if s.tau_per_sequence and s.batch > 1 else "")
              + (f", accepted-length histogram {s.accept_hist}" if s.accept_hist else ""))
        if not s.lossless:
            v = s.knobs["verify"]
            print(f"--- LOSSY: verify={v['kind']} reads {v['budget']} cache slots per sequence; the output follows "
                  f"that sparse target, not the full model (docs/methods.md, \"Dustin\") ---")
    return out


def _widths(text: str) -> tuple:
    from jspec.errors import InputError
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise InputError(f"--widths {text!r} must be comma-separated integers, e.g. 4,16,16,16,16") from None


def _check_positive(*flags) -> None:
    """(flag, value) pairs: a count given below 1 is an InputError naming the flag (None: not given)."""
    from jspec.errors import InputError
    for flag, value in flags:
        if value is not None and value < 1:
            raise InputError(f"{flag} {value} must be >= 1")


def _check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """SamplingConfig's checks, the error naming the flag (`--temperature -1.0 must be >= 0 ...`)."""
    from jspec.config import SamplingConfig
    from jspec.errors import InputError
    try:
        SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    except ValueError as e:
        raise InputError(re.sub(r"\b(temperature|top_k|top_p)=", lambda f: f"--{f[1].replace('_', '-')} ", str(e))) \
            from None


def _read_text(path: str, flag: str) -> str:
    """A UTF-8 text file's contents; a missing, unreadable or binary file is an InputError naming the flag."""
    from jspec.errors import InputError
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise InputError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{flag} {path} is a directory, not a text file") from None
    except UnicodeDecodeError:
        raise InputError(f"{flag} {path} is not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None


def cmd_tune(*, model: str = "smollm2-135m", prompt_file=None, prompt_dir=None, prompt_tokens: int = 2048,
             batch: int = 1, max_new_tokens: int = 64, method: str = "vegas", ratios=None, gammas=None, gamma0=None,
             plateau_tol: float = 0.02, min_tokens=None, reps: int = 2, impl: str = "auto", devices: int = 1,
             jobs=None, out: str = "tune.json", progress: bool = True, trees=None, drafter=None,
             save_shape: bool = False, pages=None) -> dict:
    """Vegas' three-stage tuning, or LongSpec's draft-shape search (jspec/offline/tune.py) on `model`;
    writes the chosen config to `out`; with save_shape (longspec), also the chosen shape into the drafter's
    tuned.json for this batch size."""
    import os

    import jspec
    if save_shape and method != "longspec":
        raise jspec.InputError("--save-shape applies to --method longspec only")
    if prompt_file is not None and prompt_dir is not None:
        raise jspec.InputError("give --prompt-file or --prompt-dir, not both")
    if pages is not None and method != "vegas":
        raise jspec.InputError("--pages applies to --method vegas only")
    from jspec.speculative.config import METHODS
    if method not in METHODS:
        raise jspec.InputError(f"--method {method!r} cannot be tuned; available: {', '.join(METHODS)}")
    _check_positive(("--batch", batch), ("--max-new-tokens", max_new_tokens), ("--prompt-tokens", prompt_tokens),
                    ("--reps", reps), ("--jobs", jobs))
    if prompt_dir is not None and not os.path.isdir(prompt_dir):
        raise jspec.InputError(f"--prompt-dir {prompt_dir} is not a directory")
    text = _read_text(prompt_file, "--prompt-file") if prompt_file is not None else None
    from jspec.attention import AttnImpl
    from jspec.offline.tune import DEFAULT_GAMMAS, DEFAULT_PAGES, DEFAULT_RATIOS, DEFAULT_TREES, draft_widths, tune

    ratios = _numbers(ratios, float, "--ratios") if ratios is not None else DEFAULT_RATIOS
    gammas = _numbers(gammas, int, "--gammas") if gammas is not None else DEFAULT_GAMMAS
    pages = _numbers(pages, int, "--pages") if pages is not None else DEFAULT_PAGES
    trees = [_numbers(t, int, "--trees") for t in trees.split(";") if t.strip()] if trees is not None else DEFAULT_TREES
    m = jspec.load(model) if devices == 1 else jspec.load(model, devices=devices)
    prompts = text
    if prompt_dir is not None:   # rows take turns over the folder's files (e.g. code and prose)
        from jspec.data import dir_prompts
        prompts = dir_prompts(prompt_dir, m.tokenizer, prompt_tokens, batch)
    backend = {"auto": None, "xla": "xla", "pallas": "pallas"}[impl]
    res = tune(m, prompts=prompts, prompt_tokens=prompt_tokens, batch=batch, max_new_tokens=max_new_tokens,
               method=method, ratios=ratios, gammas=gammas, pages=pages, gamma0=gamma0, plateau_tol=plateau_tol,
               min_tokens=min_tokens, reps=reps, impl=AttnImpl(backend=backend), jobs=jobs, progress=progress,
               out=out, trees=trees, drafter=drafter)
    if save_shape:   # the drafter drafts this shape at this batch size from now on (jspec.generate)
        from jspec.drafter import write_shape
        widths = draft_widths(res)
        path = write_shape(res["drafter"], batch, widths, tau=round(res["tau"], 3),
                           tokens_per_s=round(res["tokens_per_s"], 1), speedup_vs_ar=res.get("speedup_vs_ar"),
                           prompt_tokens=res["prompt_tokens"], device=res["device"], tuned_config=os.path.abspath(out))
        print(f"saved draft widths {','.join(map(str, widths))} for batch {batch} to {path}")
    return res


def _numbers(text: str, kind, flag: str) -> list:
    """"0.01,0.02" -> [0.01, 0.02]; a bad entry is an InputError naming the flag."""
    from jspec.errors import InputError
    try:
        vals = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} must be a comma-separated list of {kind.__name__} values, got {text!r}") from None
    if not vals:
        raise InputError(f"{flag} is empty")
    return vals


class _HelpAll(argparse.Action):
    """`--help-all`: the help with the hidden flags (ablations, implementation settings) shown, then exit."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        for action in parser._actions:
            if getattr(action, "_full_help", None) is not None:
                action.help = action._full_help
        parser.print_help()
        parser.exit()


def _hidden(group, *flags, help=None, **kw):
    """A flag left out of the main help (an ablation, or an implementation setting rather than a method knob):
    it works as any other and `--help-all` lists it."""
    action = group.add_argument(*flags, help=argparse.SUPPRESS, **kw)
    action._full_help = help or ""
    return action


def main(argv=None):
    import os

    from jspec.api import METHODS
    from jspec.speculative.config import METHODS as SPECULATIVE
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner: jspec needs none
    p = argparse.ArgumentParser(prog="jspec", description="Lossless long-context speculative decoding in JAX.")
    sub = p.add_subparsers(dest="cmd", required=True)

    f = sub.add_parser("fetch", help="download + convert a known model into the cache dir ($JSPEC_CACHE)")
    f.add_argument("model", nargs="?", default="smollm2-135m")

    c = sub.add_parser("convert", help="convert a Hugging Face dir or a GGUF file to a jspec (Orbax) checkpoint")
    c.add_argument("--from-hf", metavar="DIR")
    c.add_argument("--from-gguf", metavar="FILE")
    c.add_argument("--out", required=True, metavar="DIR")
    c.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    c.add_argument("--overwrite", action="store_true")

    g = sub.add_parser("generate", help="generate text (default: a long stdlib document, greedy)")
    g.add_argument("--help-all", action=_HelpAll, help="also list the ablations and implementation settings")
    gm = g.add_argument_group("method")
    gm.add_argument("--method", default=None, help=f"{' | '.join(METHODS)} (default: --config's, else ar)")
    gm.add_argument("--config", metavar="FILE", default=None,
                   help="speculative config JSON (e.g. from `jspec tune`): its method and knobs are the defaults, "
                        "flags given here override them")
    gm.add_argument("--gamma", type=int, default=None, help="draft tokens per round (speculative methods; default 4)")
    gm.add_argument("--budget", type=int, default=None, help="KV slots each draft step attends to (default 512)")
    gm.add_argument("--ratio", type=float, default=None,
                   help="dynamic budget: clamp(ceil(ratio * context), --min-tokens, --max-tokens or --budget)")
    gm.add_argument("--min-tokens", type=int, default=None, help="lower clamp of the --ratio rule (default 256)")
    gm.add_argument("--max-tokens", type=int, default=None, help="upper clamp of the --ratio rule")
    gm.add_argument("--sink", type=int, default=None, help="streaming: always-kept first tokens (default 4)")
    gm.add_argument("--page-size", type=int, default=None, help="quest: tokens per page (default 16)")
    gm.add_argument("--select-page", type=int, default=None, metavar="N",
                   help="vegas: select whole aligned pages of N cache slots (summed scores) instead of single slots: "
                        "page-aligned reads are cheaper for the sparse kernel, at a small risk to acceptance "
                        "(default 1; the budget must be a multiple of N; docs/performance.md)")
    gm.add_argument("--mode", choices=["tree", "chain"], default=None, help="longspec: tree (default) or chain drafts")
    gm.add_argument("--widths", default=None,
                   help="longspec tree: nodes per level, e.g. 4,16,16,16,16 (default: the shape the drafter was "
                        "tuned with for this batch size, its tuned.json; else 4,16,16,16,16)")
    gm.add_argument("--drafter", default=None, metavar="DIR",
                   help="longspec: drafter directory (default: the bundled checkpoints/drafters/<model>)")
    gm.add_argument("--lookup", type=int, default=None, metavar="N",
                   help="speculative methods: also verify N tokens proposed by n-gram lookup over each row's "
                        "own text (prompt + output) in the same forward, after the drafts (longspec: beside its "
                        "tree) (default 0: off). It pays on text the model keeps repeating, where lookup "
                        "proposes long runs the drafts miss; docs/performance.md)")
    gv = g.add_argument_group("verification (dense: lossless; any other: LOSSY)")
    gv.add_argument("--verify", choices=["dense", "dustin", "streaming", "quest"], default=None,
                   help="how the drafts are verified: dense (default, lossless) or LOSSY sparse verification over "
                        "--verify-budget cache slots per sequence: dustin (draft + target attention signals; "
                        "--profile), streaming (sink + window) or quest (pages by min/max keys); docs/methods.md")
    gv.add_argument("--verify-budget", type=int, default=None, metavar="N",
                   help="sparse verification: cache slots each sequence's verification reads (default 512)")
    gv.add_argument("--verify-page", type=int, default=None, metavar="P",
                   help="sparse verification: select whole aligned pages of P slots (default 1; quest 16)")
    gv.add_argument("--verify-refresh", type=int, default=None, metavar="R",
                   help="sparse verification: every R-th verification is dense (default 0: only the first)")
    gv.add_argument("--profile", default=None, metavar="FILE",
                   help="dustin: the heads profile JSON of `jspec profile-heads` for this model and drafter "
                        "(implies --verify dustin; default: built-in heads, sparse_verify.default_heads)")
    gp = g.add_argument_group("prompts and sampling")
    src = gp.add_mutually_exclusive_group()
    src.add_argument("--prompt")
    src.add_argument("--prompt-file")
    gp.add_argument("--prompt-tokens", type=int, default=3000, help="length of the default stdlib prompt")
    gp.add_argument("--batch", type=int, default=1)
    gp.add_argument("--max-new-tokens", type=int, default=128)
    gp.add_argument("--temperature", type=float, default=0.0)
    gp.add_argument("--top-k", type=int, default=0)
    gp.add_argument("--top-p", type=float, default=1.0)
    gp.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gp.add_argument("--seed", type=int, default=0)
    gp.add_argument("--ignore-eos", action="store_true")
    gp.add_argument("--json", action="store_true", dest="as_json")
    gs = g.add_argument_group("model, devices and serving")
    gs.add_argument("--model", default="smollm2-135m", help="known name or converted checkpoint dir")
    gs.add_argument("--devices", type=int, default=1,
                   help="tensor parallelism over the first N devices (heads sharded); default 1")
    gs.add_argument("--slots", type=int, default=None,
                   help="continuous batching: the --batch prompts through this many slots (any method, ar included)")
    gs.add_argument("--refill", type=int, default=None,
                   help="with --slots: free slots prefilled together (the rounds run until this many are free; "
                        "default min(4, slots // 4), at least 1)")
    gs.add_argument("--exact", action="store_true",
                   help="bf16 exact mode (GPU): every decode and verification step rounds each row as a one-token "
                        "step would (row-independent Pallas GEMMs, attention on the one-token step's tiles), so that "
                        "greedy tokens of any method equal `--exact` ar's bit for bit (checked on the CPU and on an "
                        "H100); slower (docs/methods.md says by how much). Llama / Qwen2 / Qwen3 layers of width <= 2048 only")


    ga = g.add_argument_group("ablations and implementation settings (only in --help-all)")
    _hidden(ga, "--score-mode", choices=["weights", "logits"], default=None, help="vegas ranking")
    _hidden(ga, "--collect", choices=["c2q", "all"], default=None,
                   help="vegas: Collect-2-Query rows (c2q) or all gamma+1 verified rows")
    _hidden(ga, "--topk", choices=["sort", "select"], default=None,
                   help="vegas: per-layer top-k by the threshold-search kernel (select, default) or lax.top_k (sort)")
    _hidden(ga, "--verify-m", type=int, default=None, metavar="M",
                   help="dustin: slots chosen by the draft signal (tier 1; default the profile's, else half the free "
                        "slots)")
    _hidden(ga, "--verify-signals", choices=["hybrid", "draft", "target"], default=None,
                   help="dustin ablations: both signals (default), the draft's only or the target's only")
    _hidden(ga, "--staged", action="store_true",
                   help="with --slots: prefill the next --refill prompts ahead and refill finished slots on the GPU "
                        "after every round instead of waiting for --refill free slots")

    u = sub.add_parser("tune", help="Vegas' three-stage tuning of ratio and gamma (streaming/quest/vegas), or "
                                    "LongSpec's draft-shape search -> a config JSON for `generate --config`")
    u.add_argument("--model", default="smollm2-135m", help="known name or converted checkpoint dir")
    u.add_argument("--method", default="vegas", help=f"speculative method to tune: {', '.join(SPECULATIVE)} "
                                                     "(default vegas)")
    u.add_argument("--trees", default=None,
                   help="longspec: candidate widths per level, ';'-separated (all ones = a chain; default "
                        "1,1,1,1,1;2,2,2,2,2;2,2,2,2,2,2,2;2,4,4,4;2,4,4,4,4;4,4,4,4;4,8,8,8,8;"
                        "4,16,16,16,16;8,32,32,32)")
    u.add_argument("--drafter", default=None, help="longspec: drafter directory (default: the bundled one)")
    u.add_argument("--save-shape", action="store_true",
                   help="longspec: record the chosen shape in the drafter's tuned.json for this --batch, so "
                        "`generate --method longspec` without --widths drafts it at this batch size")
    u.add_argument("--prompt-file", default=None, help="tune on this text (default: long stdlib documents)")
    u.add_argument("--prompt-dir", default=None,
                   help="tune on the text files of this folder, rows taking turns over them (e.g. one code file "
                        "and one prose file: a batch mixed as the benchmarks' rows)")
    u.add_argument("--prompt-tokens", type=int, default=2048,
                   help="length of each prompt (stdlib or --prompt-dir)")
    u.add_argument("--batch", type=int, default=1)
    u.add_argument("--max-new-tokens", type=int, default=64, help="tokens each measured run decodes")
    u.add_argument("--ratios", default=None, help="candidate ratios, comma-separated (default 0.01,0.02,0.05,0.1,0.2)")
    u.add_argument("--gammas", default=None, help="candidate gammas, comma-separated (default 2,3,4,6,8)")
    u.add_argument("--pages", default=None,
                   help="vegas' stage 4: candidate page sizes of the selection, comma-separated (default 1,8,16: "
                        "single slots, then whole aligned pages of 8 and 16; 1 skips the stage)")
    u.add_argument("--gamma0", type=int, default=None, help="gamma of stage 1 (default: the median candidate)")
    u.add_argument("--plateau-tol", type=float, default=0.02,
                   help="stage 1 stops when one ratio step raises tau by less than this fraction")
    u.add_argument("--min-tokens", type=int, default=None, help="lower clamp of the ratio rule")
    u.add_argument("--reps", type=int, default=2, help="timed runs per config (after a warm-up run)")
    u.add_argument("--impl", default="auto", choices=["auto", "xla", "pallas"], help="attention backend")
    u.add_argument("--devices", type=int, default=1, help="tensor parallelism over the first N devices")
    u.add_argument("--jobs", type=int, default=None,
                   help="configs compiled in parallel before they are timed (default min(4, CPU cores / 4))")
    u.add_argument("--out", default="tune.json", help="where to write the config (default tune.json)")

    from jspec import bench as bench_cli
    bn = sub.add_parser("bench", help="the canonical benchmark: methods x batch sizes x lengths through "
                                      "jspec.generate on long ragged tasks, peers in the same run -> JSON + plot")
    bench_cli.add_arguments(bn)

    from jspec.offline import fidelity as fidelity_cli
    from jspec.offline import heads as heads_cli
    ph = sub.add_parser("profile-heads", help="Dustin: choose the retrieval heads (SRHs) and the tier split m "
                                              "that maximise the attention recovery rate on real text -> a profile "
                                              "JSON + plot")
    heads_cli.add_arguments(ph)
    fd = sub.add_parser("fidelity", help="Dustin: teacher-forced top-1 agreement and NLL increase of sparse "
                                         "verification against dense, per selection method and budget -> JSON + plot")
    fidelity_cli.add_arguments(fd)

    from jspec.offline import selfgen as selfgen_cli
    from jspec.offline import train_drafter as train_cli
    t = sub.add_parser("train-drafter", help="train the LongSpec drafter block against a frozen target")
    train_cli.add_arguments(t)
    sg = sub.add_parser("selfgen", help="drafter training text: the target's own continuations of a text folder")
    selfgen_cli.add_arguments(sg)

    a = p.parse_args(argv)
    from jspec.checkpoints import CheckpointError
    from jspec.errors import InputError
    try:
        if a.cmd == "fetch":
            cmd_fetch(model=a.model)
        elif a.cmd == "convert":
            cmd_convert(out=a.out, from_hf=a.from_hf, from_gguf=a.from_gguf, dtype=a.dtype, overwrite=a.overwrite)
        elif a.cmd == "train-drafter":
            return train_cli.run(a)
        elif a.cmd == "selfgen":
            return selfgen_cli.run(a)
        elif a.cmd == "bench":
            return bench_cli.run(a)
        elif a.cmd == "profile-heads":
            return heads_cli.run(a)
        elif a.cmd == "fidelity":
            return fidelity_cli.run(a)
        elif a.cmd == "generate":
            kw = {k: v for k, v in vars(a).items() if k != "cmd"}
            cmd_generate(**kw)
        elif a.cmd == "tune":
            kw = {k: v for k, v in vars(a).items() if k != "cmd"}
            cmd_tune(**kw)
    except (CheckpointError, InputError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
