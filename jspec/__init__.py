"""jspec: lossless long-context speculative decoding in JAX, with Pallas GPU kernels."""
import logging as _logging
import os as _os


def _prefer_cublas_gemms() -> None:
    """Add `--xla_gpu_enable_triton_gemm=false` to XLA_FLAGS unless the user's XLA_FLAGS names that flag.

    Decode-sized GEMMs (a few hundred rows) ran faster on cuBLAS than as XLA's autotuned Triton GEMM fusions,
    which also absorb neighbouring ops of the draft steps (docs/performance.md, "Compiler settings"), and compile
    faster. XLA reads XLA_FLAGS when JAX starts its backends, so this only takes effect if jspec is imported
    before the first JAX computation; otherwise nothing changes and a warning says so. To keep Triton GEMMs,
    set `XLA_FLAGS=--xla_gpu_enable_triton_gemm=true`. The flag is GPU-only; other backends ignore it."""
    flags = _os.environ.get("XLA_FLAGS", "")
    if "xla_gpu_enable_triton_gemm" in flags:
        return
    from jax._src import xla_bridge
    if xla_bridge.backends_are_initialized():
        import jax
        if jax.default_backend() != "gpu":
            return
        import warnings
        warnings.warn("jspec was imported after JAX started its backends, so XLA keeps its Triton GEMMs; import "
                      "jspec first, or set XLA_FLAGS=--xla_gpu_enable_triton_gemm=false, for the cuBLAS GEMMs "
                      "jspec is tuned for", stacklevel=3)
        return
    _os.environ["XLA_FLAGS"] = f"{flags} --xla_gpu_enable_triton_gemm=false".strip()


_prefer_cublas_gemms()


def _no_torch_notice(record) -> bool:
    """transformers (imported for the tokenizers) announces "PyTorch was not found. Models won't be
    available..." when it loads without torch; jspec needs no torch. Only that record of transformers'
    root logger is dropped: its other warnings and errors still show."""
    return not record.getMessage().startswith("PyTorch was not found.")


_logging.getLogger("transformers").addFilter(_no_torch_notice)
from jspec.api import Model, Output, Stats, encode, generate, load
from jspec.attention import AttnImpl
from jspec.config import PRESETS, ModelConfig, RopeScaling, SamplingConfig, preset
from jspec.errors import InputError
from jspec.speculative.config import SpecConfig

__all__ = ["AttnImpl", "InputError", "Model", "ModelConfig", "Output", "PRESETS", "RopeScaling",
           "SamplingConfig", "SpecConfig", "Stats", "encode", "generate", "load", "preset"]
__version__ = "0.1.0"
