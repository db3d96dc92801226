"""The user's surface: `load` a model by name or directory, `generate` from text prompts."""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from jspec import prefill as _gen
from jspec import kv_cache
from jspec import speculative  # the self-speculative methods; also makes `jspec.speculative` available
from jspec.attention import AttnImpl
from jspec.config import ModelConfig, SamplingConfig
from jspec.errors import InputError

METHODS = ("ar",) + speculative.METHODS   # what `method=` (and `jspec generate --method`) accepts


def check_request(lengths, *, capacity: int, max_new_tokens: int, vocab_size: int, tokens=None):
    """Host-side validation with messages a user can act on. lengths: per-sequence prompt lengths."""
    lengths = np.asarray(lengths)
    if lengths.size == 0:
        raise InputError("no prompts given")
    if (lengths <= 0).any():
        raise InputError(f"prompt {int(np.argmin(lengths))} is empty: every prompt needs at least one token")
    if max_new_tokens < 1:
        raise InputError(f"{max_new_tokens=} must be >= 1")
    need = int(lengths.max()) + max_new_tokens
    if need > capacity:
        raise InputError(
            f"prompt of {int(lengths.max())} tokens + {max_new_tokens} new tokens needs {need} cache slots, "
            f"but the cache holds {capacity}; shorten the prompt, lower max_new_tokens or raise the capacity")
    if tokens is not None:
        bad = (np.asarray(tokens) < 0) | (np.asarray(tokens) >= vocab_size)
        if bad.any():
            raise InputError(f"token ids must lie in [0, {vocab_size}); got {int(np.asarray(tokens)[bad][0])}")



@dataclasses.dataclass
class Model:
    params: Any
    cfg: ModelConfig
    tokenizer: Any
    path: str
    mesh: Any = None    # a 1-D tensor-parallel jax Mesh when params are head-sharded (`load(devices=N)`)

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        ids = set(self.cfg.eos_token_ids)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is not None:
            ids.add(int(eos))
        return tuple(sorted(ids))


@dataclasses.dataclass
class Stats:
    method: str
    batch: int
    prompt_tokens: list[int]
    new_tokens: list[int]
    prefill_s: float
    decode_s: float
    tokens_per_s: float          # new tokens after the first (which prefill produces) / decode time
    tau: float = 1.0             # mean tokens emitted per target forward
    accept_hist: Optional[list[int]] = None   # rounds that accepted n = 0..gamma drafts (whole batch)
    rounds: Optional[list[int]] = None        # target verifications per sequence (speculative methods)
    tau_per_sequence: Optional[list[float]] = None   # each sequence's tau; a batch runs as long as its slowest
    knobs: Optional[dict] = None              # the SpecConfig of a speculative method
    lossless: bool = True                     # False under a sparse (lossy) verification: spec.verify


@dataclasses.dataclass
class Output:
    texts: list[str]
    tokens: list[list[int]]
    stats: Stats


def load(name_or_dir: str = "smollm2-135m", *, dtype: Optional[str] = None, progress: bool = True,
         devices: int = 1) -> Model:
    """Load a converted checkpoint; a known model name is fetched and converted on first use.

    devices: tensor-parallel degree: N > 1 shards the heads (and the FFN width) over a 1-D mesh of the first
      N jax devices (jspec/sharding.py); generation then keeps the KV cache sharded the same way. N must not
      exceed the devices present and must divide the query heads, the KV heads and the FFN width
      (`jspec.sharding.ShardingError`, a ValueError, says which otherwise). 1: one device, no mesh.
    The params are the runtime layout `jspec.model.forward` runs (`jspec.model.fuse_projections` of the stored
    one: q/k/v and gate/up as one weight each).
    """
    from jspec import checkpoints
    from transformers import AutoTokenizer

    path = checkpoints.resolve(name_or_dir, progress=progress)
    mesh, shardings = None, None
    if devices != 1:
        from jspec import sharding

        # Check the mesh against the stored config before reading any weights: errors come fast.
        mesh = sharding.make_mesh(devices, cfg=checkpoints.load_config(path))
        shardings = sharding.param_shardings(checkpoints.load_config(path), mesh, stored=True)
    params, cfg = checkpoints.load(path, dtype=dtype, sharding=shardings)
    from jspec import model as _model

    out = None if mesh is None else sharding.param_shardings(cfg, mesh)
    # (Donation would not help: no output has an input's shape. The stored arrays are freed on return.)
    params = jax.jit(_model.fuse_projections, static_argnums=1, out_shardings=out)(params, cfg)
    tok = AutoTokenizer.from_pretrained(f"{path}/tokenizer")
    return Model(params=params, cfg=cfg, tokenizer=tok, path=path, mesh=mesh)


def encode(model: Model, prompts: Union[str, Sequence[str], Sequence[Sequence[int]]], *, chat: bool = False):
    """Text (or already-tokenised) prompts -> token lists; `chat` applies the model's chat template."""
    if isinstance(prompts, str):
        prompts = [prompts]
    out = []
    for p in prompts:
        if isinstance(p, str):
            if chat:
                ids = chat_tokens(model.tokenizer, p)
            else:
                ids = model.tokenizer.encode(p, add_special_tokens=False)
        else:
            ids = [int(t) for t in p]
        out.append(ids)
    return out


def chat_tokens(tokenizer, text: str) -> list[int]:
    """One user turn `text` in the tokenizer's chat template, ready for the assistant's answer."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def generate(model: Model, prompts, *, method: Optional[str] = None, max_new_tokens: int = 128,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, chat: bool = False, seed: int = 0,
             capacity: Optional[int] = None, ignore_eos: bool = False, impl: AttnImpl = AttnImpl(),
             config=None, gamma: Optional[int] = None, budget: Optional[int] = None, ratio: Optional[float] = None,
             drafter=None, slots: Optional[int] = None, refill: Optional[int] = None, staged: bool = False,
             progress: bool = False, verify: Optional[str] = None, verify_budget: Optional[int] = None,
             profile=None, **spec_knobs) -> Output:
    """Generate continuations of `prompts` (str, list of str, or list of token-id lists).

    method: "ar" (plain decoding, the default) or a self-speculative method ("streaming", "quest", "vegas")
    with draft length `gamma` (default 4), selection `budget` (KV slots, default 512) or `ratio`, and further
    `jspec.speculative.SpecConfig` knobs as keywords: shared (min_tokens, max_tokens, lookup: that many
    prompt-lookup tokens verified after the drafts) or the method's own options (streaming: sink; quest:
    page_size; vegas: select_page, score_mode, collect, topk; another method's is an error). config: a tuned
    speculative config -- the JSON `jspec tune` writes (a path or its dict) or a SpecConfig -- whose method and
    knobs become the defaults; the keywords given here override them.
    "longspec" drafts with a trained drafter block: `drafter` is a `jspec.drafter.Drafter` or its directory,
    default the bundled checkpoints/drafters/<model name> (SmolLM2-135M has one); knobs mode="tree"|"chain",
    tree_widths, gamma (chain length), lookup (a prompt-lookup chain of this many tokens verified beside the
    tree, `SpecConfig.lookup`). With none of them (and no config) it drafts the tree the drafter was
    tuned with for this batch size (`Drafter.widths_for(slots or batch)`, its tuned.json, which records where
    each shape was measured), else LongSpecOptions' (4, 16, 16, 16, 16).
    A model loaded with `load(devices=N)` runs tensor-parallel: the cache is sharded like its heads.
    slots: run the prompts through this many batch slots with continuous batching (`jspec.speculative.serve`:
    a finished slot takes the next prompt) instead of as one static batch (also for "ar");
    refill: slots filled (prefilled) together, the rounds running until that many are free (default min(4, slots // 4)).
    staged: with slots, prefill the next `refill` prompts ahead and refill finished slots on the device after
    every round, instead of waiting for `refill` free slots (see `jspec.speculative.serve`).
    progress: with slots, a progress bar of finished requests on stderr.
    verify: how the drafts are verified (`jspec.speculative.Verify`, docs/methods.md "Dustin"): None / "dense"
    (lossless, the default), or a LOSSY sparse verification that reads `verify_budget` cache slots per sequence
    (default 512): "dustin" (hybrid draft + target signals), "streaming" (sink + window) or "quest" (pages by
    min/max keys); further knobs as verify_sink, verify_window, verify_m, verify_page, verify_refresh,
    verify_decay, verify_signals ("hybrid" | "draft" | "target"), verify_dense_layers. The output then follows
    the sparse target (greedy: its argmax; sampling: its distribution) and Stats.lossless is False.
    profile: a Dustin profile (`jspec profile-heads`'s JSON path, or a `jspec.dustin.Profile`): its heads, budget,
    tiers and dense layers are the defaults (verify defaults to "dustin"); one made for another model, or for
    another kind of drafter, is an InputError. Without one Dustin uses the default heads
    (`jspec.speculative.sparse_verify.default_heads`).
    Returns texts, token lists (stop token included when one was emitted) and timing stats."""
    req = _check_request(model, prompts, method=method, config=config,
                         knobs=dict(gamma=gamma, budget=budget, ratio=ratio, verify=verify,
                                    verify_budget=verify_budget, profile=profile, **spec_knobs), drafter=drafter,
                         max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, chat=chat,
                         capacity=capacity, slots=slots, refill=refill, staged=staged)
    stops = () if ignore_eos else model.stop_tokens
    impl = attn_impl(model, impl)
    if slots is not None:
        run = _run_served(model, req, stops, seed, impl, progress)
    else:
        run = _run_static(model, req, stops, seed, impl)
    texts = [model.tokenizer.decode(t, skip_special_tokens=True) for t in run.tokens]
    return Output(texts=texts, tokens=run.tokens, stats=_stats(req, run))


@dataclasses.dataclass(frozen=True)
class _Request:
    """A checked `generate` request: what every run path needs."""
    spec: speculative.SpecConfig   # "ar" included (no drafts); longspec's carries its drafter's window and shape
    samp: SamplingConfig
    ids: list                      # one token list per prompt
    capacity: int                  # cache slots per row
    max_new_tokens: int
    drafter: Any = None            # longspec: the drafter block's params
    slots: Optional[int] = None    # continuous batching through this many slots; None: one static batch
    refill: Optional[int] = None
    staged: bool = False


def _check_request(model: Model, prompts, *, method, config, knobs: dict, drafter, max_new_tokens: int,
                   temperature: float, top_k: int, top_p: float, chat: bool, capacity: Optional[int],
                   slots: Optional[int], refill: Optional[int], staged: bool) -> _Request:
    """Every check of a `generate` request, before anything runs; InputError says what to change.
    Also resolves what the request leaves open: the SpecConfig ("ar" too), longspec's drafter and tree, the
    cache capacity."""
    spec = spec_config(method, config, model_cfg=model.cfg, **knobs) or speculative.SpecConfig("ar")
    try:
        samp = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    except ValueError as e:
        raise InputError(str(e)) from None
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens={max_new_tokens} must be >= 1")
    if slots is not None:
        if slots < 1:
            raise InputError(f"slots={slots} must be >= 1")
        if refill is not None and refill < 1:
            raise InputError(f"refill={refill} must be >= 1")
    elif refill is not None or staged:
        raise InputError("refill and staged apply to continuous batching (slots=N) only")
    ids = encode(model, prompts, chat=chat)
    if not ids:
        raise InputError("no prompts given")
    lengths = np.array([len(p) for p in ids], np.int32)
    params = None
    if spec.method == "longspec":
        named = {k for k, v in knobs.items() if v is not None}
        spec, params = _longspec_spec(model, spec, drafter, tuned_for=slots or len(ids),
                                      keep_shape=config is not None or bool(named & {"tree_widths", "mode", "gamma"}))
    if not spec.verify.lossless:
        if slots is not None:
            raise InputError(f"verify={spec.verify.kind!r} runs on a static batch; continuous batching (slots) "
                             f"verifies densely only")
        from jspec.speculative import sparse_verify
        sparse_verify.check(spec, model.cfg)
    need = int(lengths.max()) + max_new_tokens
    margin = spec.capacity_margin()   # a speculative round writes up to gamma + 1 slots ahead ("ar": none)
    if capacity is None:
        capacity = int(-(-(max(need, 1 + max_new_tokens) + margin) // 128) * 128)
    elif need <= capacity < need + margin:
        raise InputError(f"method {spec.method!r} needs gamma + 1 = {margin} cache slots beyond prompt + new "
                         f"tokens ({need}), but capacity is {capacity}")
    if need > model.cfg.max_position:
        raise InputError(f"prompt + new tokens ({need}) exceed the model's context of {model.cfg.max_position} "
                         f"positions")
    check_request(lengths, capacity=capacity, max_new_tokens=max_new_tokens,
                  vocab_size=model.cfg.vocab_size, tokens=np.concatenate([np.asarray(p) for p in ids]))
    return _Request(spec=spec, samp=samp, ids=ids, capacity=capacity, max_new_tokens=max_new_tokens,
                    drafter=params, slots=slots, refill=refill, staged=staged)


def _longspec_spec(model: Model, spec, drafter, *, tuned_for: int, keep_shape: bool):
    """The longspec SpecConfig with the drafter's window and, unless `keep_shape` (a config or a named shape:
    widths, mode or gamma), the shape the drafter was tuned with for `tuned_for` rows; and the drafter's params."""
    d = load_drafter_for(model, drafter)
    spec = dataclasses.replace(spec, window=d.window)
    tuned = d.widths_for(tuned_for)
    if not keep_shape and tuned is not None:
        spec = (dataclasses.replace(spec, mode="chain", gamma=len(tuned)) if max(tuned) == 1   # all ones: a chain
                else dataclasses.replace(spec, mode="tree", tree_widths=tuned))
    return spec, d.params


# Shared SpecConfig knobs that size the sparse drafts of streaming / quest / vegas (longspec takes none).
DRAFT_BUDGET_KNOBS = ("budget", "ratio", "min_tokens", "max_tokens")


def spec_config(method: Optional[str] = None, config=None, *, model_cfg: Optional[ModelConfig] = None,
                **knobs) -> Optional[speculative.SpecConfig]:
    """The SpecConfig `generate` runs (None for plain "ar" decoding).

    Args:
      method: "ar" or a speculative method; None: the config's method, else "ar".
      config: None, a SpecConfig, a dict or the path of a JSON file such as `jspec tune` writes
        (`jspec.speculative.config.read_config` checks it); its knobs are the defaults (a config of another
        method than `method`: its shared knobs only).
      model_cfg: the target's config: a `profile` is checked against it (None: format checks only).
      knobs: SpecConfig knobs in the flat spelling (shared or the method's own options; None = not given);
        they override the config's. Another method's knob is an InputError. The
        verification's: `verify` (its kind), `profile` and `verify_<field>` for the other `Verify` fields.
    Raises:
      InputError: unknown method, bad knob, unreadable config or profile, speculative knobs for "ar", or a
        draft budget (budget, ratio, min_tokens, max_tokens) for "longspec".
    """
    from jspec.speculative.config import SHARED, read_config

    base = {} if config is None else read_config(config)
    given = {k: v for k, v in knobs.items() if v is not None}
    vknobs = {k: given.pop(k) for k in list(given) if k in ("verify", "profile") or k.startswith("verify_")}
    method = method or base.get("method", "ar")
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; available: {', '.join(METHODS)}")
    if method == "ar":   # a knob given for plain decoding would be silently ignored: a mistake
        if given or {k: v for k, v in vknobs.items() if (k, v) != ("verify", "dense")}:
            raise InputError(f"options {sorted({**given, **vknobs})} only apply to speculative methods, not 'ar'")
        return None
    unused = sorted(k for k in given if k in DRAFT_BUDGET_KNOBS)
    if method == "longspec" and unused:   # they size the sparse drafts; the trained drafter would ignore them
        raise InputError(f"options {unused} only apply to the sparse drafts of streaming, quest and vegas; "
                         f"longspec drafts with its trained drafter and takes no draft budget")
    if base and base["method"] != method:   # another method's config: its shared knobs only
        base = {k: v for k, v in base.items() if k in SHARED}
    if vknobs:
        base["verify"] = verify_config(base.get("verify"), method=method, model_cfg=model_cfg, **vknobs)
    try:
        return speculative.SpecConfig(**{**base, **given, "method": method})
    except TypeError as e:
        raise InputError(f"bad speculative option: {e}") from None


def verify_config(base=None, *, method: str, model_cfg: Optional[ModelConfig] = None, verify: Optional[str] = None,
                  profile=None, **knobs) -> speculative.Verify:
    """The `Verify` of `generate`'s verify keywords: `base` (a config file's Verify or its dict), then the profile's
    fields, then verify=<kind> and verify_<field>=value. A profile implies verify="dustin"."""
    import dataclasses as dc

    from jspec import dustin
    fields = {f.name for f in dc.fields(speculative.Verify)}
    vals = dict(base) if isinstance(base, dict) else ({} if base is None else dc.asdict(base))
    if profile is not None:
        prof = profile if isinstance(profile, dustin.Profile) else dustin.read_profile(profile, model_cfg)
        if isinstance(profile, dustin.Profile) and model_cfg is not None:
            prof.check_model(model_cfg)
        want = "longspec" if method == "longspec" else "self"
        if prof.drafter != want:
            raise InputError(f"the profile was made for drafter {prof.drafter!r}, but method {method!r} drafts "
                                  f"with {want!r}; profile this pair with `jspec profile-heads`")
        label = str(profile) if isinstance(profile, (str, os.PathLike)) else "(given)"
        v = speculative.Verify.from_profile(prof, profile=label)
        vals.update({k: getattr(v, k) for k in ("kind", "budget", "sink", "window", "m", "page", "target_heads",
                                                "draft_heads", "dense_layers", "profile")})
    if verify is not None:
        vals["kind"] = verify
    for k, v in knobs.items():
        name = k[len("verify_"):]
        if name not in fields - {"kind", "profile"}:
            raise InputError(f"unknown verification option {k!r}; available: "
                                  f"{', '.join('verify_' + f for f in sorted(fields - {'kind', 'profile'}))}")
        vals[name] = v
    out = speculative.Verify(**vals)
    given = sorted(knobs) + (["profile"] if profile is not None else [])
    if out.lossless and given:   # a knob the dense verification would silently ignore: a mistake
        raise InputError(f"options {given} only apply to a sparse verification (verify='dustin', 'streaming' or "
                              f"'quest'), not the dense one")
    return out


def bundled_drafter_dir(model: Model) -> str:
    """Where a drafter for `model` ships with jspec: drafters/<model directory name> in the top-level
    checkpoints/ folder of a source tree (or editable install), or in jspec/bundled/ of a wheel install
    (pyproject.toml maps the one to the other); the source tree's path when neither exists."""
    name = os.path.basename(str(model.path).rstrip("/"))
    here = os.path.dirname(os.path.abspath(__file__))
    installed = os.path.join(here, "bundled", "drafters", name)
    source = os.path.join(os.path.dirname(here), "checkpoints", "drafters", name)
    return installed if os.path.isdir(installed) else source


def load_drafter_for(model: Model, drafter=None):
    """The LongSpec drafter for `model`: a `jspec.drafter.Drafter`, a directory, or None for the bundled one.
    Raises InputError when there is none, it cannot be read, or it was trained for other shapes."""
    from jspec.drafter import Drafter, load_drafter
    if drafter is None:
        drafter = bundled_drafter_dir(model)
        if not os.path.isdir(drafter):
            raise InputError(f"no bundled LongSpec drafter for {os.path.basename(str(model.path))!r} (looked in "
                                  f"{drafter}); train one with `jspec train-drafter` and pass --drafter DIR")
    if not isinstance(drafter, Drafter):
        path = str(drafter)
        if not os.path.isdir(path):
            raise InputError(f"drafter directory {path!r} does not exist")
        try:
            drafter = load_drafter(path)
        except Exception as e:   # a half-copied or foreign directory: say so, no traceback
            raise InputError(f"cannot read the drafter at {path!r}: {type(e).__name__}: {e}"[:500]) from None
    want, got = model.cfg, drafter.cfg
    fields = ("d_model", "n_heads", "n_kv_heads", "head_dim", "vocab_size")
    bad = [f"{f} {getattr(got, f)} != {getattr(want, f)}" for f in fields if getattr(got, f) != getattr(want, f)]
    if bad:
        raise InputError(f"the drafter was trained for another model ({', '.join(bad)})")
    return drafter


def attn_impl(model: Model, impl: AttnImpl = AttnImpl()) -> AttnImpl:
    """`impl` with the model's tensor-parallel mesh (the Pallas kernels then run per head shard)."""
    return impl if model.mesh is None else dataclasses.replace(impl, mesh=model.mesh)


def new_cache(model: Model, *, batch: int, capacity: int) -> kv_cache.KVCache:
    """An empty KV cache for `model`, created sharded over its mesh (K heads on tp) when it has one."""
    if model.mesh is None:
        return kv_cache.init(model.cfg, batch=batch, capacity=capacity)
    from jspec import sharding
    return sharding.init_cache(model.cfg, model.mesh, batch=batch, capacity=capacity)


@dataclasses.dataclass
class _Run:
    """What a run path hands to `_stats`."""
    tokens: list                   # each sequence's emitted tokens, stop token included
    prefill_s: float
    decode_s: float
    spec_stats: Optional[speculative.SpecStats] = None   # rounds and accepted-length histograms per sequence


def _run_static(model: Model, req: _Request, stops, seed, impl) -> _Run:
    """One static batch through the engine (every method, "ar" included): prefill, then one while_loop."""
    tokens, lengths = _gen.pad_prompts(req.ids)
    tokens = tokens[:, :req.capacity]   # padding must fit too
    t0 = time.perf_counter()
    if model.mesh is None:
        state = speculative.init(model.params, model.cfg, req.spec, jnp.asarray(tokens), jnp.asarray(lengths),
                                 req.capacity, impl=impl, drafter=req.drafter)
    else:  # the same prefill into a cache created sharded (init would leave its layout to XLA)
        state = speculative.engine.init_sharded(model.params, model.cfg, req.spec, tokens, lengths, req.capacity,
                                                model.mesh, impl=impl, drafter=req.drafter)
    jax.block_until_ready(state)
    t1 = time.perf_counter()
    out, n_out, st, _ = speculative.run_donating(model.params, model.cfg, req.spec, req.samp, state,
                                                 jax.random.key(seed), req.max_new_tokens, stop_tokens=stops,
                                                 impl=impl, drafter=req.drafter)
    out, n_out = np.asarray(out), np.asarray(n_out)
    t2 = time.perf_counter()
    return _Run(tokens=[out[b, :n_out[b]].tolist() for b in range(len(n_out))], prefill_s=t1 - t0,
                decode_s=t2 - t1, spec_stats=jax.tree.map(np.asarray, st))


def _run_served(model: Model, req: _Request, stops, seed, impl, progress) -> _Run:
    """Continuous batching through `req.slots` slots (`speculative.serve`, the engine's rounds)."""
    outs, st = speculative.serve(model.params, model.cfg, req.spec, req.samp, req.ids, batch=req.slots,
                                 capacity=req.capacity, max_new_tokens=req.max_new_tokens, stop_tokens=stops,
                                 impl=impl, seed=seed, refill=req.refill, staged=req.staged, progress=progress,
                                 mesh=model.mesh, drafter=req.drafter)
    return _Run(tokens=[o.tolist() for o in outs], prefill_s=st.prefill_s, decode_s=st.decode_s,
                spec_stats=speculative.SpecStats(rounds=np.asarray(st.rounds), accept_hist=np.asarray(st.accept_hist)))


def _stats(req: _Request, run: _Run) -> Stats:
    """The one Stats builder (static batch and served). tokens_per_s counts new tokens after each sequence's
    first, which the prefill produces. "ar" accepts no drafts: tau 1 and no speculative fields."""
    decoded = sum(max(len(t) - 1, 0) for t in run.tokens)
    stats = Stats(method=req.spec.method, batch=req.slots or len(req.ids), prompt_tokens=[len(p) for p in req.ids],
                  new_tokens=[len(t) for t in run.tokens], prefill_s=run.prefill_s, decode_s=run.decode_s,
                  tokens_per_s=decoded / max(run.decode_s, 1e-9), lossless=req.spec.verify.lossless)
    st = run.spec_stats
    if req.spec.method != "ar" and st is not None:
        stats.tau = st.tau()
        stats.accept_hist = np.asarray(st.accept_hist).sum(0).tolist()
        stats.rounds = np.asarray(st.rounds).tolist()
        stats.tau_per_sequence = [round(float(x), 4) for x in st.tau_per_sequence()]
        stats.knobs = req.spec.describe()
    return stats
