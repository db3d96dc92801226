"""jspec: lossless long-context speculative decoding in JAX, with Pallas GPU kernels."""
from jspec.api import Model, Output, Stats, encode, generate, load
from jspec.attention import AttnImpl
from jspec.config import PRESETS, ModelConfig, RopeScaling, SamplingConfig, preset
from jspec.decoding import InputError
from jspec.speculative.config import SpecConfig

__all__ = ["AttnImpl", "InputError", "Model", "ModelConfig", "Output", "PRESETS", "RopeScaling",
           "SamplingConfig", "SpecConfig", "Stats", "encode", "generate", "load", "preset"]
__version__ = "0.1.0"
