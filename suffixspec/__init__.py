"""suffixspec: model-free speculative decoding with suffix automata.

Importing this package is cheap and never imports torch or transformers: names that need
them are resolved lazily on first access (module `__getattr__`).
"""

from .automaton import Continuations, FrozenAutomaton, MatchCursor, SuffixAutomaton
from .proposer import Proposer, ResponseCache, Session
from .tree import DraftTree
from .errors import (
    BadInputError,
    BadInputTypeError,
    IndexFormatError,
    SuffixSpecError,
    TokenizerError,
    TokenizerMismatchError,
)

__version__ = "0.1.0"

# name -> module (relative) holding it; imported on first access
_LAZY = {
    "load_tokenizer": ".tokenizer",
    "Tokenizer": ".tokenizer",
}

__all__ = [
    "SuffixAutomaton",
    "FrozenAutomaton",
    "MatchCursor",
    "Continuations",
    "DraftTree",
    "Proposer",
    "Session",
    "ResponseCache",
    "SuffixSpecError",
    "BadInputError",
    "BadInputTypeError",
    "IndexFormatError",
    "TokenizerError",
    "TokenizerMismatchError",
    *_LAZY,
]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'suffixspec' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
