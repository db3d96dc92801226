"""Offline tools, above the public API: each takes a loaded model (or a name it loads through `jspec.api`) and
nothing in the library below `jspec.cli` imports this package.

    tune.py           `jspec tune`: the speculative knobs (ratio, gamma, pages) or the LongSpec draft shape, measured
    train_drafter.py  `jspec train-drafter`: the LongSpec drafter block trained against a frozen target
    selfgen.py        `jspec selfgen`: drafter training text, the target's own continuations of a text folder
    training_text.py  the drafter's training text: files tokenized, packed into chunks, batched by (seed, step)
    heads.py          `jspec profile-heads` (Dustin): the Semantic Retrieval Heads and the tier split
    fidelity.py       `jspec fidelity` (Dustin): what verifying against I_verify costs the target, teacher-forced
    rounds.py         the target over real text in verification blocks with masked attention (heads, fidelity)
"""
from .heads import profile_heads

__all__ = ["profile_heads"]
