"""Self-speculative decoding: the target drafts for itself with sparse attention, then verifies losslessly.

    state = jspec.speculative.init(params, cfg, spec, prompt_tokens, prompt_lengths, capacity)
    tokens, n_out, stats = jspec.speculative.run(params, cfg, spec, samp, state, key, max_new_tokens)

Methods (one module each, one shared engine): streaming, quest, vegas. See engine.py and DESIGN.md section 4.
"""
from jspec.speculative.config import METHODS, SpecConfig
from jspec.speculative.engine import SpecStats, State, init, prepare, run, run_donating

__all__ = ["METHODS", "SpecConfig", "SpecStats", "State", "init", "prepare", "run", "run_donating"]
