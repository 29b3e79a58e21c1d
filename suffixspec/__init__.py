"""suffixspec: model-free speculative decoding with suffix automata.

Importing this package is cheap and never imports torch or transformers: names that need
them are resolved lazily on first access (module `__getattr__`).
"""

__version__ = "0.1.0"  # before the imports: submodules read it

from .corpus import (
    CorpusIndex,
    CorpusMatch,
    Document,
    Subset,
    append_documents,
    build_index,
    delete_documents,
    merge_indexes,
    read_documents,
)
from .draft.automaton import Continuations, FrozenAutomaton, MatchCursor, SuffixAutomaton
from .draft.config import ProposerConfig
from .draft.proposer import Proposer
from .draft.response_cache import ResponseCache
from .draft.session import Session
from .draft.tree import DraftTree
from .errors import (
    BadInputError,
    BadInputTypeError,
    IndexFormatError,
    InternalError,
    SuffixSpecError,
    TokenizerError,
    TokenizerMismatchError,
)

# name -> module (relative) holding it; imported on first access
_LAZY = {
    "load_tokenizer": ".tokenizer",
    "Tokenizer": ".tokenizer",
    "SpeculativeGenerator": ".generate",
    "GenerationResult": ".engine.stats",
    "GenerationStats": ".engine.stats",
    "RequestStats": ".engine.stats",
    "DecodeOptions": ".engine.options",
    "CostModel": ".engine.budget",
    "BudgetPolicy": ".engine.budget",
    "Engine": ".engine.engine",
    "Server": ".engine.engine",  # the alias of Engine kept for this release
    "Event": ".engine.engine",
    "Step": ".engine.engine",
    "load_model": ".models",
    "warm_kernels": ".engine.warmup",
}

__all__ = [
    "SuffixAutomaton",
    "FrozenAutomaton",
    "MatchCursor",
    "Continuations",
    "DraftTree",
    "CorpusIndex",
    "CorpusMatch",
    "Document",
    "Subset",
    "build_index",
    "append_documents",
    "delete_documents",
    "merge_indexes",
    "read_documents",
    "Proposer",
    "ProposerConfig",
    "Session",
    "ResponseCache",
    "SuffixSpecError",
    "BadInputError",
    "BadInputTypeError",
    "IndexFormatError",
    "TokenizerError",
    "TokenizerMismatchError",
    "InternalError",
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
