"""Speculative decoding, lossless: the target drafts for itself with sparse attention, or a trained LongSpec
drafter drafts a chain or a tree; one target forward verifies each round. `SpecConfig.verify` can make that
verification sparse instead (Dustin and its baselines: lossy, sparse_verify.py):

    spec = SpecConfig("vegas", verify=Verify("dustin", budget=512))     # or Verify.from_profile(profile)
    # shared knobs on SpecConfig, the method's own in its options object (flat keywords work too):
    spec = SpecConfig("vegas", budget=512, options=VegasOptions(select_page=8))   # == ..., select_page=8)

    state = jspec.speculative.init(params, cfg, spec, prompt_tokens, prompt_lengths, capacity)
    tokens, n_out, stats = jspec.speculative.run(params, cfg, spec, samp, state, key, max_new_tokens)

    # LongSpec: the drafter's params are a traced argument of init / prepare / run
    d = jspec.drafter.load_drafter("checkpoints/drafters/smollm2-135m")
    spec = SpecConfig("longspec", tree_widths=(4, 16, 16, 16, 16), window=d.window)   # or mode="chain", gamma=5
    state = jspec.speculative.init(params, cfg, spec, prompt_tokens, prompt_lengths, capacity, drafter=d.params)
    tokens, n_out, stats = jspec.speculative.run(params, cfg, spec, samp, state, key, max_new_tokens,
                                                 drafter=d.params)

    # Continuous batching: a queue of prompts through `batch` slots, a finished slot refilled between rounds
    outs, stats = jspec.speculative.serve(params, cfg, spec, samp, prompts, batch=16, capacity=8448,
                                          max_new_tokens=256)

Methods (one module each, one shared engine): streaming, quest, vegas, longspec (+ tree.py: draft trees and
their lossless acceptance). See engine.py and docs/methods.md.
"""
from jspec.speculative.config import (METHODS, LongSpecOptions, QuestOptions, SpecConfig, StreamingOptions,
                                      VegasOptions, Verify)
from jspec.speculative.engine import SpecStats, State, init, prepare, run, run_donating
from jspec.speculative.serving import ServeStats, serve

__all__ = ["METHODS", "LongSpecOptions", "QuestOptions", "ServeStats", "SpecConfig", "SpecStats", "State",
           "StreamingOptions", "VegasOptions", "Verify", "init", "prepare", "run", "run_donating", "serve"]
