"""One exception hierarchy for the whole package.

Library code raises these; only `suffixspec.cli` turns them into messages and exit codes.
Each class also derives from the builtin a caller would naturally catch (ValueError, TypeError).
"""


class SuffixSpecError(Exception):
    """Base class of every error raised on purpose by suffixspec."""


class BadInputError(SuffixSpecError, ValueError):
    """An argument has the right type but a wrong value (negative token id, bad shape...)."""


class BadInputTypeError(SuffixSpecError, TypeError):
    """An argument has the wrong type (float tokens, None, a 2-D array...)."""


class IndexFormatError(SuffixSpecError, ValueError):
    """An index file is truncated, corrupted, foreign or of an unsupported version."""


class TokenizerError(SuffixSpecError, ValueError):
    """A tokenizer cannot be loaded, or it does not match the one an index was built with."""


class TokenizerMismatchError(TokenizerError):
    """An index was built with a different tokenizer than the one in use."""


class InternalError(SuffixSpecError, RuntimeError):
    """A broken invariant inside suffixspec: a bug, never the caller's fault."""
