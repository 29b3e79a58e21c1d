"""`as_tokens` against a brute-force reference: every integer dtype, sizes on both sides of the
few-ids path, in range and out of range, arrays, views and lists."""

import numpy as np
import pytest

from suffixspec import BadInputError
from suffixspec.errors import BadInputTypeError
from suffixspec.tokenids import MAX_TOKEN_ID, as_tokens

DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.intc]


def reference(values: list[int]) -> list[int] | None:
    """The ids, or None where one lies outside [0, MAX_TOKEN_ID]."""
    for v in values:
        if not 0 <= v <= MAX_TOKEN_ID:
            return None
    return list(values)


@pytest.mark.parametrize("dtype", DTYPES)
def test_as_tokens_matches_reference(dtype):
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    for size in (0, 1, 2, 31, 32, 33, 200):
        for _ in range(20):
            arr = rng.integers(info.min, info.max, size=size, endpoint=True, dtype=dtype)
            if rng.random() < 0.5:  # mostly in range: token ids
                arr = np.abs(arr.astype(np.int64) % 1000).astype(dtype)
            # a list past int64 becomes floats in numpy (refused as such, not by range)
            lists = [arr.tolist()] if dtype != np.uint64 or arr.size == 0 or int(arr.max()) <= np.iinfo(np.int64).max else []
            for given in [arr, arr[::2], *lists]:
                values = [int(v) for v in (given.tolist() if isinstance(given, np.ndarray) else given)]
                want = reference(values)
                if want is None:
                    with pytest.raises(BadInputError, match=r"expected token ids in \[0, 2\*\*31 - 1\]"):
                        as_tokens(given, "ids")
                    continue
                got = as_tokens(given, "ids")
                assert got.dtype == np.int32 and got.flags.c_contiguous and got.ndim == 1
                assert got.tolist() == want


def test_as_tokens_names_the_bad_value_and_refuses_other_kinds():
    with pytest.raises(BadInputError, match="got -3"):
        as_tokens(np.array([5, -3, 2], np.int64), "ids")
    with pytest.raises(BadInputError, match=f"got {2**31}"):
        as_tokens(np.array([5, 2**31], np.int64), "ids")
    with pytest.raises(BadInputTypeError, match="of dtype bool"):
        as_tokens(np.array([True, False]), "ids")
    with pytest.raises(BadInputError, match="shape"):
        as_tokens(np.zeros((2, 2), np.int32), "ids")
    with pytest.raises(BadInputTypeError, match="float"):
        as_tokens(np.array([1.0, 2.0]), "ids")
    given = np.array([1, 2, 3], np.int32)
    assert as_tokens(given) is given  # already what the kernels read: not copied
