"""One exception hierarchy for the whole package.

Library code raises these; only `suffixspec.cli` turns them into messages and exit codes.
Each class also derives from the builtin a caller would naturally catch (ValueError, TypeError).
`BadInputError` and `BadInputTypeError` (and their subclasses) carry `param`, the name of the
offending argument or request parameter (None when no single one is to blame): callers such as the
HTTP layer read it from there, never from the message text.
"""


class SuffixSpecError(Exception):
    """Base class of every error raised on purpose by suffixspec."""


class _InputError(SuffixSpecError):
    """A caller's mistake in one named input: `param` names it (None: no single one)."""

    def __init__(self, *args, param: str | None = None):
        super().__init__(*args)
        self.param = param

    def __reduce__(self):  # pickling keeps `param` (the default only passes `args`)
        return _rebuild, (type(self), self.args, self.param)


def _rebuild(cls, args, param):
    return cls(*args, param=param)


class BadInputError(_InputError, ValueError):
    """An argument has the right type but a wrong value (negative token id, bad shape...)."""


class BadInputTypeError(_InputError, TypeError):
    """An argument has the wrong type (float tokens, None, a 2-D array...)."""


class IndexFormatError(SuffixSpecError, ValueError):
    """An index file is truncated, corrupted, foreign or of an unsupported version."""


class TokenizerError(SuffixSpecError, ValueError):
    """A tokenizer cannot be loaded, or it does not match the one an index was built with."""


class TokenizerMismatchError(TokenizerError):
    """An index was built with a different tokenizer than the one in use."""


class InternalError(SuffixSpecError, RuntimeError):
    """A broken invariant inside suffixspec: a bug, never the caller's fault."""
