"""The errors a caller of jspec acts on. A module of its own, below everything else, so that any layer can
raise them without importing the layers above (re-exported as `jspec.InputError`)."""


class InputError(ValueError):
    """A request that cannot be served as asked (empty prompt, prompt longer than the cache, ...)."""
