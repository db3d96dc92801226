"""Where a result came from: commit, dirty flag, command, device, jax, XLA flags -- checked, not typed in.

A result file is only as good as its record of the code that made it. Locally the commit comes from git and
the tree is compared with it. A GPU machine gets a copy of the work tree without `.git`: pass the commit in
as `JSPEC_COMMIT=<sha>:<source hash>` (what `python -m jspec.provenance` prints here) and the recorder checks
it against a hash of the source files it actually runs. A record whose commit cannot be verified is refused
unless the caller allows a dirty tree, and then it says `dirty: true` with the tree's hash.

The source hash covers the files that decide a result: `*.py` and `*.json` under jspec/, pallas_kernels/,
checkpoints/ and bench/ (results excluded), plus pyproject.toml. Weights are not hashed (the bundled
drafter's tuned.json is).
"""
from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("jspec", "pallas_kernels", "checkpoints", "bench")
SUFFIXES = (".py", ".json")


class ProvenanceError(RuntimeError):
    """The code that would make a result cannot be tied to a commit."""


def _is_source(rel: str) -> bool:
    parts = rel.split("/")
    if rel == "pyproject.toml":
        return True
    return (parts[0] in CODE_DIRS and rel.endswith(SUFFIXES) and "__pycache__" not in parts
            and not rel.startswith("bench/results/"))


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + hashlib.sha256(files[rel]).digest())
    return h.hexdigest()[:16]


def tree_hash(root: Path = ROOT) -> str:
    """Hash of the source files as they are on disk under `root`."""
    files = {}
    for d in CODE_DIRS:
        for p in (root / d).rglob("*"):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and _is_source(rel):
                files[rel] = p.read_bytes()
    if (root / "pyproject.toml").is_file():
        files["pyproject.toml"] = (root / "pyproject.toml").read_bytes()
    return _digest(files)


def _git(*args, root: Path = ROOT) -> bytes:
    return subprocess.check_output(["git", "-C", str(root), *args], stderr=subprocess.DEVNULL)


def commit_hash(commit: str = "HEAD", root: Path = ROOT) -> str:
    """Hash of the same source files as committed in `commit` (what `tree_hash` gives on a clean tree)."""
    names = [n for n in _git("ls-tree", "-r", "--name-only", commit, root=root).decode().splitlines() if _is_source(n)]
    return _digest({n: _git("show", f"{commit}:{n}", root=root) for n in names})


def token(root: Path = ROOT) -> str:
    """`<sha>:<hash of HEAD's sources>` to pass to a machine without `.git` as JSPEC_COMMIT."""
    sha = _git("rev-parse", "HEAD", root=root).decode().strip()
    return f"{sha}:{commit_hash(sha, root)}"


def source_state(root: Path = ROOT, env: Optional[dict] = None) -> dict:
    """{commit, verified, dirty, tree_hash}: the commit the source files match, and whether they do.

    With `.git`: HEAD, dirty when the files on disk differ from HEAD's. Without: JSPEC_COMMIT=<sha>:<hash>,
    verified when the files on disk hash to <hash>. No commit at all: commit "unknown", verified False."""
    env = os.environ if env is None else env
    actual = tree_hash(root)
    given = env.get("JSPEC_COMMIT", "")
    if given:
        sha, _, want = given.partition(":")
        if not want:
            raise ProvenanceError(f"JSPEC_COMMIT={given!r} must be <sha>:<source hash> "
                                  f"(run `python -m jspec.provenance` in the checkout)")
        return dict(commit=sha, verified=True, dirty=actual != want, tree_hash=actual)
    if (root / ".git").exists():
        try:
            sha = _git("rev-parse", "HEAD", root=root).decode().strip()
            return dict(commit=sha, verified=True, dirty=actual != commit_hash(sha, root), tree_hash=actual)
        except (subprocess.CalledProcessError, FileNotFoundError):
            pass
    return dict(commit="unknown", verified=False, dirty=True, tree_hash=actual)


def record(*, allow_dirty: bool = False, argv=None, root: Path = ROOT, env: Optional[dict] = None) -> dict:
    """The provenance block of a result file. Raises ProvenanceError when the tree is dirty or its commit
    unknown, unless `allow_dirty` (the record then says so)."""
    import jax

    state = source_state(root, env)
    if (state["dirty"] or not state["verified"]) and not allow_dirty:
        why = ("no commit to tie it to (no .git and no JSPEC_COMMIT)" if not state["verified"]
               else f"the source files differ from commit {state['commit'][:12]} (tree {state['tree_hash']})")
        raise ProvenanceError(f"refusing to record a result: {why}; commit first, or pass --allow-dirty to "
                              f"record it as dirty")
    devs = jax.devices()
    return dict(state, command=" ".join(shlex.quote(a) for a in (sys.argv if argv is None else argv)),
                device=f"{devs[0].platform}:{getattr(devs[0], 'device_kind', '?')}", device_count=len(devs),
                jax=jax.__version__, xla_flags=os.environ.get("XLA_FLAGS", ""),
                matmul_precision=os.environ.get("JAX_DEFAULT_MATMUL_PRECISION", "default"))


if __name__ == "__main__":
    print(token())
