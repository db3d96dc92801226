"""jspec: lossless long-context speculative decoding in JAX, with Pallas GPU kernels."""
import logging as _logging


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
