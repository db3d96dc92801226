"""Shared benchmark plumbing: timing, device facts, JSON records, model loading on the GPU machine."""
from __future__ import annotations

import json
import os
import subprocess
import time

import jax

HBM_BYTES_PER_S = 4.3e12   # measured device-to-device copy ceiling on the H200 (../shared/gpu/README.md)


def device_name() -> str:
    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '?')}"


def commit() -> str:
    if os.environ.get("JSPEC_COMMIT"):
        return os.environ["JSPEC_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


def peak_memory_bytes() -> int | None:
    try:
        return int(jax.devices()[0].memory_stats()["peak_bytes_in_use"])
    except Exception:
        return None


def timed(fn, *args, **kw):
    """(result, seconds) with the result blocked on."""
    t = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kw))
    return out, time.perf_counter() - t


def base_record(**kw) -> dict:
    return {"device": device_name(), "jax": jax.__version__, "commit": commit(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""), **kw}


def write_json(path: str, records: list, summary: dict, **extra):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"records": records, "summary": summary, **extra}, f, indent=1)
    print(f"wrote {path}")
