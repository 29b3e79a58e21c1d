"""Text a user hands us in a file (prompts, traces): strict UTF-8 or a clear refusal.

`read_utf8(path)` returns the text of a regular file (or of stdin for "-"); bytes that are not
UTF-8 raise a `BadInputError` naming the file and the byte offset of the first bad byte. Nothing is
decoded with replacement characters: a prompt silently changed would give a silently wrong answer.
"""

from __future__ import annotations

import os
import stat
import sys

from .errors import BadInputError

__all__ = ["read_utf8", "decode_utf8"]


def decode_utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInputError(f"{where}: expected UTF-8 text, got byte 0x{data[exc.start]:02x} at offset {exc.start} "
                            f"({exc.reason})") from None


def read_utf8(path, what: str = "file") -> str:
    """The whole of `path` as text ("-": standard input)."""
    if str(path) == "-":
        return decode_utf8(sys.stdin.buffer.read(), f"{what} (standard input)")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise BadInputError(f"{what} {str(path)!r}: cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise BadInputError(f"{what} {str(path)!r}: expected a regular file")
    with open(path, "rb") as handle:
        return decode_utf8(handle.read(), f"{what} {str(path)!r}")
