"""Layering: the module import graph of `jspec` and `pallas_kernels` has no cycle, and its edges point down
the layer map `LAYERS` below.

Every import counts, function-local ones too (the whole syntax tree is walked): a cycle hidden behind an
import inside a function is still a cycle in the design. Dependencies point one way:

    cli -> offline tools (tune, drafter training, selfgen) -> api -> speculative -> model
        -> layers / attention -> pallas_kernels

A module may import modules of its own layer and of the layers below it; every module is placed in the map
(a new file must be placed there), and nothing below the API imports `jspec.api` or `jspec.offline`.

Edges are resolved to the module that defines what is imported:
  - `import a.b` and `from a import b` where a.b is a module: an edge to a.b;
  - `from pkg import name` where the package's __init__ re-exports `name` (`from .mod import name`): an edge
    to the module that defines it (followed through further re-exports) and one to the package, whose
    __init__ runs and may import more (a lazy `__getattr__`): `from jspec import InputError` inside jspec
    would put the importer on a cycle through `jspec/__init__.py`, so modules inside import from the
    defining module (`jspec.errors`);
  - a name defined in the __init__ itself (or not found): an edge to the package.
Importing a submodule (`import jspec.api`, `from jspec.speculative.config import ...`) also runs its parent
packages' __init__; those implicit edges are left out, or the packages' own re-exports would put every
module on a cycle through its package's __init__.
"""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("jspec", "pallas_kernels")

# The layer map, top to bottom. "pkg.*" is a package and every module under it; other names are one module.
LAYERS = (
    ("cli", ("jspec.cli",)),
    # on top of the public API: each takes a loaded model; `jspec bench` (+ its peers) too
    ("offline tools", ("jspec.offline.*", "jspec.bench", "jspec.peers")),
    # the public API; the `jspec` package's __init__ re-exports it (jspec.load, jspec.generate, ...)
    ("api", ("jspec.api", "jspec")),
    ("speculative", ("jspec.speculative.*",)),
    # the target's forward and prefill; the LongSpec drafter block (a decoder layer) + store
    ("model", ("jspec.model", "jspec.prefill", "jspec.drafter.*")),
    ("layers / attention", ("jspec.layers", "jspec.attention", "jspec.kv_cache", "jspec.sharding", "jspec.sampling",
                            "jspec.selection", "jspec.dustin")),
    ("base", ("jspec.config", "jspec.errors", "jspec.data", "jspec.provenance", "jspec.checkpoints.*")),
    ("kernels", ("pallas_kernels.*",)),
)
BELOW_API = ("speculative", "model", "layers / attention", "base", "kernels")


def _modules() -> dict:
    """{module name: path} for every .py file of the packages (a package is its __init__.py)."""
    mods = {}
    for pkg in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, pkg)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
            rel = os.path.relpath(dirpath, ROOT).replace(os.sep, ".")
            for f in sorted(filenames):
                if f.endswith(".py"):
                    mods[rel if f == "__init__.py" else f"{rel}.{f[:-3]}"] = os.path.join(dirpath, f)
    return mods


def _is_package(path: str) -> bool:
    return os.path.basename(path) == "__init__.py"


def _absolute(node: ast.ImportFrom, module: str, path: str) -> str:
    """The absolute module a (possibly relative) `from X import ...` names."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if _is_package(path) else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class Graph:
    def __init__(self):
        self.mods = _modules()
        self.trees = {m: ast.parse(open(p).read(), p) for m, p in self.mods.items()}
        self.edges = {m: set() for m in self.mods}
        for m in self.mods:
            for node in ast.walk(self.trees[m]):
                for target in self._targets(m, node):
                    if target is not None and target != m:
                        self.edges[m].add(target)

    def _internal(self, name: str):
        """The longest prefix of the dotted `name` that is one of our modules, or None (outside)."""
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in self.mods:
                return ".".join(parts[:i])
        return None

    def _targets(self, m: str, node):
        if isinstance(node, ast.Import):
            return [self._internal(a.name) for a in node.names]
        if isinstance(node, ast.ImportFrom):
            src = _absolute(node, m, self.mods[m])
            if self._internal(src) is None:
                return []
            out = []
            for a in node.names:
                target = self.resolve(src, a.name)
                out.append(target)
                if target != f"{src}.{a.name}" and src in self.mods and _is_package(self.mods[src]):
                    out.append(src)   # a name through the package's __init__: that __init__ runs too
            return out
        return []

    def resolve(self, src: str, name: str, _seen=None):
        """The module that `from src import name` depends on (see the module docstring)."""
        if f"{src}.{name}" in self.mods:
            return f"{src}.{name}"
        mod = self._internal(src)
        if mod != src or not _is_package(self.mods[mod]):
            return mod
        seen = _seen or set()
        if (src, name) in seen:
            return src
        seen.add((src, name))
        for node in self.trees[src].body:   # the __init__'s module-level re-exports
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if (a.asname or a.name) == name:
                        inner = _absolute(node, src, self.mods[src])
                        if self._internal(inner) is None:
                            return src
                        return self.resolve(inner, a.name, seen)
        return src

    def cycles(self) -> list:
        """The strongly connected components with more than one module (Tarjan), each as (its modules, one
        example cycle through them)."""
        index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in sorted(self.edges[v]):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))

        for v in sorted(self.edges):
            if v not in index:
                visit(v)
        return [(c, self._example(c)) for c in comps]

    def _example(self, comp: list) -> list:
        """A shortest cycle through the component's first module (breadth-first inside the component)."""
        start, members = comp[0], set(comp)
        prev, frontier = {start: None}, [start]
        while frontier:
            nxt = []
            for v in frontier:
                for w in sorted(self.edges[v] & members):
                    if w == start:
                        path = [v]
                        while prev[path[-1]] is not None:
                            path.append(prev[path[-1]])
                        return path[::-1] + [start]
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        return comp


def test_graph_sees_the_packages():
    """Sanity: the walk finds the modules and the edges the rule above predicts."""
    g = Graph()
    assert {"jspec", "jspec.api", "jspec.cli", "jspec.offline.tune", "jspec.offline.train_drafter",
            "pallas_kernels", "pallas_kernels._common"} <= set(g.mods)
    assert "jspec.api" in g.edges["jspec"]                       # the package's public names
    assert g.resolve("jspec", "load") == "jspec.api"             # re-export -> the defining module
    assert g.resolve("jspec", "config") == "jspec.config"        # a submodule
    assert g.resolve("pallas_kernels", "flash_scores") == "pallas_kernels.flash_scores"
    assert g.resolve("jspec", "__version__") == "jspec"          # defined in the __init__ itself
    assert "jspec.config" in g.edges["jspec.model"]


def layer_of(module: str):
    """The layer of `module` in LAYERS (the entries naming it), or None where none does."""
    hits = [name for name, entries in LAYERS for e in entries
            if module == e.removesuffix(".*") or (e.endswith(".*") and module.startswith(e[:-1]))]
    return hits[0] if len(hits) == 1 else (None if not hits else tuple(hits))


def test_layer_map_places_every_module():
    unplaced = {m: layer_of(m) for m in Graph().mods if not isinstance(layer_of(m), str)}
    assert not unplaced, f"modules in no layer (None) or several of LAYERS: {unplaced}"


def test_imports_point_down():
    g, rank = Graph(), {name: i for i, (name, _) in enumerate(LAYERS)}
    up = sorted(f"{m} ({layer_of(m)}) -> {t} ({layer_of(t)})" for m in g.edges for t in g.edges[m]
                if rank[layer_of(t)] < rank[layer_of(m)])
    assert not up, "imports of a higher layer (see LAYERS):\n  " + "\n  ".join(up)


def _reachable(g: Graph, start: str) -> set:
    seen, todo = set(), [start]
    while todo:
        for t in g.edges[todo.pop()] - seen:
            seen.add(t)
            todo.append(t)
    return seen


def test_nothing_below_the_api_imports_it_or_the_offline_tools():
    """The direction the issue asks for, spelled out: no module of the lower layers imports `jspec.api` (nor
    the `jspec` package, which runs it) or `jspec.offline.*`; importing `jspec.api` loads no offline tool."""
    g = Graph()
    offline = {m for m in g.mods if layer_of(m) == "offline tools"}
    assert {"jspec.offline", "jspec.offline.tune", "jspec.offline.train_drafter", "jspec.offline.selfgen"} <= offline
    lower = [m for m in g.mods if layer_of(m) in BELOW_API]
    assert {"jspec.speculative", "jspec.speculative.engine", "jspec.model", "jspec.attention", "jspec.kv_cache",
            "jspec.drafter", "pallas_kernels._common"} <= set(lower)
    bad = sorted(f"{m} -> {t}" for m in lower for t in g.edges[m] if t in offline | {"jspec.api", "jspec"})
    assert not bad, "a lower layer imports the API or an offline tool:\n  " + "\n  ".join(bad)
    assert not _reachable(g, "jspec.api") & offline, sorted(_reachable(g, "jspec.api") & offline)


def test_no_import_cycles():
    cycles = Graph().cycles()
    assert not cycles, "import cycles (module -> imported module):\n" + "\n".join(
        f"  {' -> '.join(example)}   (the cycle's whole component: {', '.join(comp)})" for comp, example in cycles)
