"""Validation of token-id input at the public boundary.

Every public entry point that takes token ids funnels them through `as_tokens`, which accepts
a list/tuple of ints, a 1-D integer numpy array or a 1-D integer torch tensor (recognised
without importing torch) and returns a contiguous int32 numpy array, or raises a clear
`BadInputTypeError` / `BadInputError` naming what was expected and what came.
"""

import numpy as np

from .errors import BadInputError, BadInputTypeError

MAX_TOKEN_ID = 2**31 - 1
_FEW = 32
_EXPECTED = "a 1-D sequence of integer token ids in [0, 2**31 - 1] (list, numpy array or torch tensor)"


def _describe(x) -> str:
    if isinstance(x, np.ndarray):
        return f"numpy array of dtype {x.dtype} and shape {x.shape}"
    return type(x).__name__


def _bounds(arr: np.ndarray) -> tuple[int, int]:
    """(min, max) of a non-empty integer array; a few ids (a decoding step's) through Python's
    builtins, which touch far less code than two numpy reductions when the caches are cold."""
    if arr.size <= _FEW:
        vals = arr.tolist()
        return min(vals), max(vals)
    return int(arr.min()), int(arr.max())


def _out_of_range(name: str, bad) -> BadInputError:
    return BadInputError(f"{name}: expected token ids in [0, 2**31 - 1], got {bad}", param=name)


def as_tokens(x, name: str = "tokens") -> np.ndarray:
    if type(x) is np.ndarray and x.ndim == 1 and x.dtype.kind in "iu" and x.dtype.itemsize <= 8:
        if x.size:
            lo, hi = _bounds(x)
            if lo < 0 or hi > MAX_TOKEN_ID:
                raise _out_of_range(name, lo if lo < 0 else hi)
        return x if x.dtype == np.int32 and x.flags.c_contiguous else np.ascontiguousarray(x, dtype=np.int32)
    if x is None:
        raise BadInputTypeError(f"{name}: expected {_EXPECTED}, got None", param=name)
    if type(x).__module__.split(".")[0] == "torch":
        if getattr(x, "is_floating_point", lambda: False)() or getattr(x, "is_complex", lambda: False)():
            raise BadInputTypeError(f"{name}: expected {_EXPECTED}, got a torch tensor of dtype {x.dtype}", param=name)
        x = x.detach().cpu().numpy()
    if isinstance(x, (str, bytes, dict, set)) or np.isscalar(x):
        raise BadInputTypeError(f"{name}: expected {_EXPECTED}, got {_describe(x)}", param=name)
    if isinstance(x, np.ndarray):
        arr = x
    else:
        try:
            arr = np.asarray(x)
        except (OverflowError, ValueError) as exc:
            raise BadInputError(f"{name}: expected {_EXPECTED}, got values numpy cannot hold ({exc})", param=name) from None
    if arr.dtype == object and arr.ndim == 1 and all(isinstance(v, int) and not isinstance(v, bool) for v in arr.tolist()):
        bad = next(v for v in arr.tolist() if not 0 <= v <= MAX_TOKEN_ID)
        raise _out_of_range(name, bad)
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer) or (arr.size == 0 and arr.dtype == np.float64 and not isinstance(x, np.ndarray))):
        raise BadInputTypeError(f"{name}: expected {_EXPECTED}, got {_describe(arr) if isinstance(x, np.ndarray) else 'elements of dtype ' + str(arr.dtype)}", param=name)
    if arr.ndim != 1:
        raise BadInputError(f"{name}: expected {_EXPECTED}, got an array of shape {arr.shape}", param=name)
    if arr.size:
        lo, hi = _bounds(arr)
        if lo < 0 or hi > MAX_TOKEN_ID:
            bad = lo if lo < 0 else hi
            raise _out_of_range(name, bad)
    return np.ascontiguousarray(arr, dtype=np.int32)
