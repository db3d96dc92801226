"""Offline tools for Dustin (sparse verification), above the public API: `jspec profile-heads` chooses the
Semantic Retrieval Heads and the tier split (heads.py); `jspec fidelity` measures what verifying against
I_verify costs the target, teacher-forced (fidelity.py). Both run the target over real text in verification
blocks with masked attention (rounds.py). `jspec tune` measures the speculative knobs or the LongSpec draft shape
on a loaded model (tune.py). Nothing in the library imports this package."""
from .heads import profile_heads

__all__ = ["profile_heads"]
