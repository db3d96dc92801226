"""`SpecConfig`: the speculative method and its knobs (frozen, hashable: a static jit argument)."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import jax.numpy as jnp

from jspec.errors import InputError

# The speculative methods (the one list; jspec.api.METHODS adds plain "ar", tune tunes every one of these).
METHODS = ("streaming", "quest", "vegas", "longspec")
SCORE_MODES = ("weights", "logits")
COLLECT = ("c2q", "all")
MODES = ("tree", "chain")
TOPK = ("sort", "select")
VERIFY_KINDS = ("dense", "dustin", "streaming", "quest")
SIGNALS = ("hybrid", "draft", "target")


@dataclasses.dataclass(frozen=True)
class Verify:
    """How the target verifies a round's drafts: the verification axis of the configuration (what drafts x how
    they are verified), composable with every drafter. Frozen and hashable (it sits in SpecConfig, a static
    jit argument). docs/methods.md, "Dustin".

    kind:       "dense" (default, lossless: every layer reads the whole cache), or a lossy sparse verification
                that reads only `budget` cache slots per sequence plus the round's own new tokens:
                "dustin" (sink + local window, then tier 1: top-m by the draft-lookahead signal A_D, tier 2:
                the rest by the target-historical signal A_T; `jspec.dustin.select_verify`), "streaming"
                (sink + the newest budget - sink slots) or "quest" (per layer, the budget // page best pages by
                Quest's min/max-key bound for the verified rows' queries, plus the partial last page). A
                sequence whose context fits in the budget is verified densely (identical output).
    budget:     K, the cache slots each sequence's verification reads (the static index width).
    sink, window: dustin / streaming: the protected first and newest slots (streaming: window = budget - sink).
    m:          dustin tier-1 size in slots (None: the profile's, else (budget - sink - window) // 2).
    page:       unit of selection in slots (None: 1 for dustin / streaming, 16 for quest).
    refresh:    R > 0: every R-th verification is dense (fidelity for speed); 0: only the first.
    decay:      A_T <- decay * A_T + (this verification's estimate); 0 (default) keeps only the newest.
    signals:    dustin ablations: "hybrid" (default), "draft" (m = every free slot: A_D only) or "target"
                (m = 0: A_T only).
    target_heads, draft_heads: (layer, q_head) pairs scoring A_T and A_D (the Semantic Retrieval Heads);
                None: the profile's, else the defaults of `jspec.speculative.sparse_verify.default_heads`.
    dense_layers: target layers that always read the whole cache.
    profile:    where the heads came from (a profile's path; a label only, for the record).
    """

    kind: str = "dense"
    budget: int = 512
    sink: int = 4
    window: int = 64
    m: Optional[int] = None
    page: Optional[int] = None
    refresh: int = 0
    decay: float = 0.0
    signals: str = "hybrid"
    target_heads: Optional[tuple] = None
    draft_heads: Optional[tuple] = None
    dense_layers: tuple = ()
    profile: Optional[str] = None

    def __post_init__(self):
        for name in ("target_heads", "draft_heads"):
            pairs = getattr(self, name)
            if pairs is None:
                continue
            try:
                pairs = tuple((int(a), int(b)) for a, b in pairs)
            except (TypeError, ValueError):
                raise InputError(f"verify {name} must be (layer, q_head) pairs, got {pairs!r}") from None
            object.__setattr__(self, name, pairs)
        object.__setattr__(self, "dense_layers", tuple(int(x) for x in self.dense_layers))
        if self.kind not in VERIFY_KINDS:
            raise InputError(f"unknown verification {self.kind!r}; available: {', '.join(VERIFY_KINDS)}")
        if self.signals not in SIGNALS:
            raise InputError(f"verify signals={self.signals!r} must be one of {SIGNALS}")
        if self.refresh < 0:
            raise InputError(f"verify refresh={self.refresh} must be >= 0 (a dense verification every R rounds)")
        if not 0.0 <= self.decay < 1.0:
            raise InputError(f"verify decay={self.decay} must be in [0, 1)")
        if self.page is not None and self.page < 1:
            raise InputError(f"verify page={self.page} must be >= 1")
        if self.kind == "dense":
            return
        if self.m is not None and self.signals != "hybrid":
            raise InputError(f"verify m={self.m} and signals={self.signals!r} both set tier 1's size; give one")
        if self.kind == "quest":
            if self.budget < self.page_size or self.budget % self.page_size:
                raise InputError(f"verify budget={self.budget} must be a positive multiple of page={self.page_size} "
                                 f"(quest keeps whole pages)")
            return
        from jspec import dustin
        try:   # select_verify's own checks (budget vs sink + window, pages, m)
            dustin._check(self.budget, self.sink, self.selection_window, self.tier1, self.page_size)
        except ValueError as e:
            raise InputError(f"verify={self.kind!r}: {e}") from None

    @classmethod
    def from_profile(cls, prof, **overrides) -> "Verify":
        """Dustin with a `jspec.dustin.Profile`'s budget, tiers, heads and dense layers; `overrides` win."""
        return cls(**{**dict(kind="dustin", budget=prof.budget, sink=prof.sink, window=prof.window, m=prof.m,
                             page=prof.page, target_heads=prof.target_heads, draft_heads=prof.draft_heads,
                             dense_layers=prof.dense_layers), **overrides})

    @property
    def lossless(self) -> bool:
        return self.kind == "dense"

    @property
    def page_size(self) -> int:
        return self.page if self.page is not None else (16 if self.kind == "quest" else 1)

    @property
    def selection_window(self) -> int:
        """The protected local window: streaming keeps every slot after the sink."""
        return self.budget - self.sink if self.kind == "streaming" else self.window

    @property
    def tier1(self) -> Optional[int]:
        """Tier-1 size m for `select_verify` (None: its default, half the free slots)."""
        if self.kind == "streaming" or self.signals == "target":
            return 0
        if self.signals == "draft":
            return self.budget - self.sink - self.window
        return self.m


# ------------------------------------------------------------------------------------------ method options
# One frozen (hashable) options object per method, holding only that method's knobs. Each checks its own
# values when built; `check(spec)` adds the rules that involve the shared knobs (budget, gamma, ...).


@dataclasses.dataclass(frozen=True)
class StreamingOptions:
    """streaming: the first `sink` positions (attention sinks) plus the newest budget - sink slots."""

    sink: int = 4

    def __post_init__(self):
        if self.sink < 0:
            raise InputError(f"sink={self.sink} must be >= 0")

    def check(self, spec: "SpecConfig"):
        if spec.budget < self.sink:
            raise InputError(f"budget={spec.budget} must be >= sink={self.sink} (the window is budget - sink)")
        if spec.ratio is not None and spec.min_tokens < self.sink:
            raise InputError(f"min_tokens={spec.min_tokens} must be >= sink={self.sink}")


@dataclasses.dataclass(frozen=True)
class QuestOptions:
    """quest: `page_size` tokens per page (min/max key summaries per page; budget // page_size pages are kept)."""

    page_size: int = 16

    def __post_init__(self):
        if self.page_size < 1:
            raise InputError(f"page_size={self.page_size} must be >= 1")

    def check(self, spec: "SpecConfig"):
        if spec.slots < self.page_size:
            raise InputError(f"budget={spec.slots} must hold at least one page of page_size={self.page_size}")


@dataclasses.dataclass(frozen=True)
class VegasOptions:
    """vegas: top-k of the previous verification's attention scores.

    select_page: select aligned pages of this many slots (summed scores) instead of single positions (1, the
                default, is the paper's rule). Each draft step then gathers runs of consecutive cache rows and
                the top-k ranks S / select_page scores; the slots from the last page start to the selection
                point are attended whole (up to select_page - 1 more). The budget (static width) must be a
                multiple of it. Pages rank fewer scores and keep a selected token's neighbours, so they
                measured faster at the same or higher tau (docs/performance.md).
    score_mode: ablation: the ranking: "weights" (softmax weights exp(s - lse), default) or "logits" (raw
                scale*q.k).
    collect:    ablation: the rows whose scores are collected: "c2q" (Collect-2-Query: rows 0 and gamma of the
                verified block, see jspec/speculative/vegas.py) or "all" (all gamma + 1 rows).
    topk:       an implementation setting, not a method knob (both keep the same set): the per-layer top-k
                algorithm, "select" (default: the pallas_kernels.topk_select threshold-search kernel on a GPU,
                lax.top_k elsewhere) or "sort" (lax.top_k everywhere; XLA sorts each row). "select" is the
                default because XLA's sort of a long row is the dearer part of the selection step
                (docs/performance.md). It stays here because only vegas' selection reads it.
    """

    select_page: int = 1
    score_mode: str = "weights"
    collect: str = "c2q"
    topk: str = "select"

    def __post_init__(self):
        if self.select_page < 1:
            raise InputError(f"select_page={self.select_page} must be >= 1")
        if self.score_mode not in SCORE_MODES:
            raise InputError(f"score_mode={self.score_mode!r} must be one of {SCORE_MODES}")
        if self.collect not in COLLECT:
            raise InputError(f"collect={self.collect!r} must be one of {COLLECT}")
        if self.topk not in TOPK:
            raise InputError(f"topk={self.topk!r} must be one of {TOPK}")

    def check(self, spec: "SpecConfig"):
        if spec.slots % self.select_page:
            raise InputError(f"budget={spec.slots} must be a multiple of select_page={self.select_page} (whole "
                             f"pages)")


@dataclasses.dataclass(frozen=True)
class LongSpecOptions:
    """longspec: a trained one-block drafter over the target's last-layer KV cache (its params go to
    `init`/`prepare`/`run` as `drafter=`).

    mode:        "tree" (`tree_widths`) or "chain" (gamma drafter steps, one token each; gamma is the chain
                 length).
    tree_widths: tree mode: nodes per level (level l keeps the global top-w_l by cumulative draft
                 log-probability; sampling draws children from q instead, see jspec/speculative/tree.py);
                 sum(tree_widths) draft tokens per round, depth len(tree_widths).
    window:      the drafter's self-attention window W = its ring buffer's slots (`Drafter.window`).
    """

    mode: str = "tree"
    tree_widths: tuple = (4, 16, 16, 16, 16)
    window: int = 512

    def __post_init__(self):
        # A list would make the options unhashable (a static jit argument): store a tuple of ints.
        object.__setattr__(self, "tree_widths", tuple(int(w) for w in self.tree_widths))
        if self.mode not in MODES:
            raise InputError(f"mode={self.mode!r} must be one of {MODES}")
        if not self.tree_widths or min(self.tree_widths) < 1:
            raise InputError(f"tree_widths={self.tree_widths} must be a non-empty tuple of widths >= 1")

    def check(self, spec: "SpecConfig"):
        if spec.depth >= self.window:
            raise InputError(f"the draft depth {spec.depth} must be < window={self.window} (the drafter's ring "
                             f"must hold a whole root-to-leaf path)")


# The options class of each speculative method ("ar" has none).
OPTIONS = {"streaming": StreamingOptions, "quest": QuestOptions, "vegas": VegasOptions, "longspec": LongSpecOptions}
# SpecConfig's own (shared) knobs, and every knob a flat spelling may name (keywords, CLI flags, JSON files).
SHARED = ("method", "gamma", "budget", "ratio", "min_tokens", "max_tokens", "lookup", "verify")
KNOBS = SHARED + tuple(f.name for cls in OPTIONS.values() for f in dataclasses.fields(cls))


def knob_owner(knob: str) -> Optional[str]:
    """The method whose options hold `knob` (None: not a method option)."""
    return next((m for m, cls in OPTIONS.items() if knob in {f.name for f in dataclasses.fields(cls)}), None)


def method_options(method: str, options=None, **knobs):
    """The options object of `method`: `options` (None: the method's defaults; a dict: its fields), with the
    flat `knobs` on top. A knob of another method is an InputError naming the method it belongs to."""
    cls = OPTIONS.get(method)
    for k in knobs:
        if cls is None or k not in {f.name for f in dataclasses.fields(cls)}:
            owner = knob_owner(k)
            if owner is None:
                raise TypeError(f"SpecConfig got an unexpected keyword argument {k!r}")
            takes = "no options" if cls is None else ", ".join(f.name for f in dataclasses.fields(cls))
            raise InputError(f"{k} is a {owner} option; method {method!r} takes {takes}")
    if cls is None:
        if options is not None:
            raise InputError(f"method {method!r} takes no options, got {options!r}")
        return None
    if isinstance(options, dict):   # from a JSON config
        options = cls(**options)
    if options is None:
        options = cls()
    if not isinstance(options, cls):
        raise InputError(f"method {method!r} takes {cls.__name__}, got {type(options).__name__}")
    return dataclasses.replace(options, **knobs) if knobs else options


@dataclasses.dataclass(frozen=True, init=False)
class SpecConfig:
    """Speculative decoding: a sparse-attention self-draft (the target drafts for itself) or LongSpec's
    trained drafter. The knobs every method shares live here; `options` holds the method's own
    (`StreamingOptions`, `QuestOptions`, `VegasOptions`, `LongSpecOptions`; None for "ar"). Frozen and
    hashable: a static jit argument.

    The constructor also takes the method's knobs flat, the spelling of `jspec.generate`, the CLI and config
    files: `SpecConfig("vegas", budget=512, select_page=8)` is `SpecConfig("vegas", budget=512,
    options=VegasOptions(select_page=8))`, and `dataclasses.replace(spec, select_page=16)` works likewise. A
    knob of another method is an InputError.

    method:     "streaming" (sink + recent window), "quest" (query-aware page selection), "vegas"
                (top-k of the previous verification's attention scores) or "longspec" (a trained one-block
                drafter over the target's last-layer KV cache, chain or tree drafts). docs/methods.md. "ar":
                plain decoding through the same engine (gamma forced to 0: each round is one target step), for
                `serve`.
    gamma:      draft tokens per round (one full-attention verification each); longspec chain mode: the
                chain length.
    budget:     KV slots each draft step's selection holds (the same number across methods in comparisons);
                the static width of the index arrays. Tokens after the selection point (see `with_tail` in
                jspec/selection.py) come on top: at most 2*gamma for vegas, gamma-1 for streaming,
                page_size+gamma-2 for quest.
    ratio:      optional dynamic budget: k = clamp(ceil(ratio * context), min_tokens, max_tokens or budget)
                (Vegas' knob; applies to every method so budgets stay comparable). None: k = budget.
    min_tokens, max_tokens: the clamp of the ratio rule; max_tokens (default budget) is then the static width.
    lookup:     also verify, in the same target forward, this many tokens proposed by n-gram lookup over the
                row's own text (prompt + output; jspec/speculative/lookup.py). longspec hangs them off the
                tree's root as a chain of their own; streaming, quest and vegas append them to the gamma
                drafts (proposed from the text and the drafts), so a round accepts up to gamma + lookup.
                0 (default): off. Sampling treats them as point-mass drafts (accept x with p(x), else draw
                from p without x; jspec/speculative/tree.py `accept_sampled` for the tree), so it stays
                lossless.
    verify:     how the drafts are verified (`Verify`, the verification policy's options): dense (default,
                lossless) or a lossy sparse verification (Dustin and its baselines), with any drafter above.
    options:    the method's options object (None: its defaults).
    """

    method: str
    gamma: int
    budget: int
    ratio: Optional[float]
    min_tokens: int
    max_tokens: Optional[int]
    lookup: int
    verify: Verify
    options: object

    def __init__(self, method: str = "vegas", *, gamma: int = 4, budget: int = 512, ratio: Optional[float] = None,
                 min_tokens: int = 256, max_tokens: Optional[int] = None, lookup: int = 0, verify: Verify = Verify(),
                 options=None, **knobs):
        if method != "ar" and method not in METHODS:
            raise InputError(f"unknown speculative method {method!r}; available: {', '.join(METHODS)} "
                             f"(and 'ar' for plain decoding)")
        if isinstance(verify, dict):   # from a JSON config (describe() writes it as a dict)
            verify = Verify(**verify)
        values = dict(method=method, gamma=0 if method == "ar" else gamma, budget=budget, ratio=ratio,
                      min_tokens=min_tokens, max_tokens=max_tokens, lookup=lookup, verify=verify,
                      options=method_options(method, options, **knobs))
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self._check()

    def _check(self):
        if not isinstance(self.verify, Verify):
            raise InputError(f"verify must be a jspec.speculative.Verify, got {type(self.verify).__name__}")
        if self.method != "ar" and self.gamma < 1:
            raise InputError(f"gamma={self.gamma} must be >= 1 (draft tokens per round)")
        if self.budget < 1:
            raise InputError(f"budget={self.budget} must be >= 1 KV slot")
        if self.ratio is not None:
            if not 0.0 < self.ratio <= 1.0:
                raise InputError(f"ratio={self.ratio} must be in (0, 1]")
            if self.max_tokens is not None and self.max_tokens < 1:
                raise InputError(f"max_tokens={self.max_tokens} must be >= 1")
            if not 1 <= self.min_tokens <= self.slots:
                raise InputError(f"min_tokens={self.min_tokens} must be in [1, max_tokens={self.slots}]")
        if self.lookup < 0:
            raise InputError(f"lookup={self.lookup} must be >= 0 (prompt-lookup draft tokens per round)")
        if self.method == "ar":
            if self.lookup:
                raise InputError(f"lookup={self.lookup} needs a speculative method (streaming, quest, vegas, "
                                 f"longspec), not 'ar'")
            if not self.verify.lossless:
                raise InputError(f"verify={self.verify.kind!r} needs a speculative method: 'ar' verifies no "
                                 f"drafts")
            return
        self.options.check(self)

    @property
    def slots(self) -> int:
        """Static width M of the selection (the largest k the budget rule can produce)."""
        if self.ratio is not None and self.max_tokens is not None:
            return self.max_tokens
        return self.budget

    def k(self, context):
        """Selection size per sequence for a context of `context` tokens (int32[B] -> int32[B])."""
        context = jnp.asarray(context, jnp.int32)
        if self.ratio is None:
            return jnp.full(context.shape, self.budget, jnp.int32)
        k = jnp.ceil(self.ratio * context.astype(jnp.float32)).astype(jnp.int32)
        return jnp.clip(k, self.min_tokens, self.slots)

    @property
    def widths(self) -> tuple:
        """Draft tokens per level: longspec's tree widths, or (1,) * gamma for a chain."""
        if self.method == "longspec" and self.options.mode == "tree":
            return self.options.tree_widths
        return (1,) * self.gamma

    @property
    def depth(self) -> int:
        """Most drafts one round can accept: gamma + lookup (longspec: the tree depth, or the lookup chain's if
        longer)."""
        if self.method == "longspec":
            return max(len(self.widths), self.lookup)
        return self.gamma + self.lookup

    def capacity_margin(self) -> int:
        """Cache slots needed beyond prompt + max_new_tokens: a round writes up to gamma + 1 slots ahead
        (longspec: the root, every tree node and the lookup chain). "ar" needs none: its round writes only the
        newest token, at a slot below prompt + max_new_tokens, as plain decoding does."""
        if self.method == "ar":
            return 0
        return sum(self.widths) + self.lookup + 1

    def describe(self) -> dict:
        """The flat form config files and `Stats.knobs` hold: the shared knobs, the method's own knobs and
        `verify` as a dict; `SpecConfig(**spec.describe()) == spec`."""
        own = {} if self.options is None else dataclasses.asdict(self.options)
        return {**{k: getattr(self, k) for k in SHARED if k != "verify"}, **own,
                "verify": dataclasses.asdict(self.verify)}


# ------------------------------------------------------------------------------------------ config files

def write_config(path: str, config: dict) -> str:
    """Write a tuned config as JSON atomically (temp file + rename)."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(config, f, indent=1)
    os.replace(tmp, path)
    return path


def draft_widths(result: dict) -> list:
    """The draft shape a longspec tuning result chose, as widths per level (a chain of g steps: g ones), the form
    a drafter's tuned.json keeps (`jspec.drafter.write_shape`)."""
    return [1] * int(result["gamma"]) if result["mode"] == "chain" else [int(w) for w in result["tree_widths"]]


def read_config(src) -> dict:
    """The knobs of a tuned config in their flat form (`SpecConfig.describe()`'s; `SpecConfig(**knobs)` builds
    it): a JSON file path, its dict, or a SpecConfig.

    Other keys (measurements, model, device, ...) are ignored. Files written before the options objects hold
    every method's knobs: another method's knob at its default is dropped (it never applied), at any other
    value it is an error. The knobs are checked on their own (types, a known speculative method, SpecConfig's
    own rules), so a bad file fails with its name in the message.
    Raises:
      InputError: missing or unreadable file, invalid JSON, wrong types, unknown method.
    """
    if isinstance(src, SpecConfig):
        return src.describe()
    where = "config"
    if isinstance(src, (str, os.PathLike)):
        where = f"config file {os.fspath(src)}"
        try:
            with open(src, encoding="utf-8") as f:
                src = json.load(f)
        except FileNotFoundError:
            raise InputError(f"{where} does not exist (write one with `jspec tune --out FILE`)") from None
        except IsADirectoryError:
            raise InputError(f"{where} is a directory, not a JSON file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{where} is not valid JSON ({e})") from None
        except OSError as e:
            raise InputError(f"cannot read {where}: {e.strerror or e}") from None
    if not isinstance(src, dict):
        raise InputError(f"{where} must be a JSON object with the SpecConfig fields, got {type(src).__name__}")
    if "method" not in src:
        raise InputError(f"{where} names no \"method\" (one of {', '.join(METHODS)})")
    method = _field_value(where, _FIELDS["method"], src["method"])
    if method not in METHODS:
        raise InputError(f"{where} names an unknown speculative method {method!r}; "
                         f"available: {', '.join(METHODS)}")
    knobs = {}
    for name in KNOBS:
        if name not in src:
            continue
        value = _field_value(where, _FIELDS[name], src[name])
        owner = knob_owner(name)
        if owner not in (None, method):   # another method's knob
            if value == _FIELDS[name].default:
                continue
            raise InputError(f"{where}: \"{name}\" is a {owner} option; this config's method is {method!r}")
        knobs[name] = value
    try:
        SpecConfig(**knobs)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return knobs


# Every flat knob's field (SpecConfig's own or an options class's): its annotation and, for options, its default.
_FIELDS = {f.name: f for cls in (SpecConfig, *OPTIONS.values()) for f in dataclasses.fields(cls)}


def _field_value(where: str, field: dataclasses.Field, v):
    """A JSON value checked against a knob's field annotation (a JSON list becomes a tuple)."""
    ann = str(field.type)   # a string here: `from __future__ import annotations` in config.py
    if v is None and "Optional" in ann:
        return None
    if "tuple" in ann:
        if isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return tuple(v)
        want = "a list of integers"
    elif "float" in ann:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        want = "a number"
    elif "int" in ann:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        want = "an integer"
    elif "str" in ann:
        if isinstance(v, str):
            return v
        want = "a string"
    else:
        return v
    raise InputError(f"{where}: \"{field.name}\" must be {want}" + (" or null" if "Optional" in ann else "")
                     + f", got {json.dumps(v)}")
