"""What a request's body must be before the server parses it: the bounds that keep one hostile client
from taking the process down.

Contract of `read_json(request, limits)` (on a request the routes will parse):

* `Content-Type` other than JSON: 415 before the body is read (no header at all is taken as JSON).
* A declared `Content-Length` over `limits.max_body_bytes`: 413 before the body is read. A chunked
  body is read up to the limit and refused with 413 once it passes it: the server never holds more
  than the limit of one request's body.
* The whole body must arrive within `limits.read_timeout_s` of the handler starting to read it, else
  408: a client that drips its body holds no engine slot (nothing is submitted before the body is
  whole) and no handler forever.
* These refusals carry `Connection: close`, so the server stops reading the rest of what that client
  sends instead of draining it.
* A client that hangs up mid-body raises `ClientGone` (logged at info, one line, by the caller).
* Bytes that are not UTF-8, text that is not JSON, JSON nested deeper than `MAX_DEPTH` and strings with
  lone surrogates (`"\\ud800"`, legal JSON but no text a tokenizer can take) answer 400; the message
  says what was expected and where, never a Python exception's text.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .protocol import APIError

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["Limits", "ClientGone", "read_json", "check_json", "MAX_DEPTH"]

log = logging.getLogger(__name__)

MAX_DEPTH = 64  # an OpenAI request nests a handful of levels (messages -> content parts -> text)
CLOSE = {"Connection": "close"}


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 4 * 1024 * 1024
    read_timeout_s: float = 30.0


class ClientGone(Exception):
    """The client hung up before its request body was whole."""

    def __init__(self, received: int):
        super().__init__(f"client hung up after {received} bytes of its request body")
        self.received = received


def _header(request: "Request", name: str) -> str | None:
    return request.headers.get(name)


def check_headers(request: Request, limits: Limits) -> None:
    ctype = _header(request, "content-type")
    if ctype is not None:
        media = ctype.split(";", 1)[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise APIError(415, f"Content-Type: expected application/json, got {ctype[:100]!r}",
                           code="unsupported_media_type", headers=CLOSE)
    length = _header(request, "content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise APIError(400, f"Content-Length: expected a number of bytes, got {length[:40]!r}",
                           code="invalid_request", headers=CLOSE)
        if int(length) > limits.max_body_bytes:
            raise APIError(413, f"the request body has {int(length)} bytes; this server takes at most "
                                f"{limits.max_body_bytes} (--max-body-bytes)", code="request_too_large", headers=CLOSE)


async def read_body(request: Request, limits: Limits) -> bytes:
    from starlette.requests import ClientDisconnect

    check_headers(request, limits)
    chunks: list[bytes] = []
    received = 0

    async def read() -> None:
        nonlocal received
        async for chunk in request.stream():
            received += len(chunk)
            if received > limits.max_body_bytes:
                raise APIError(413, f"the request body passed {limits.max_body_bytes} bytes, the most this server "
                                    "takes (--max-body-bytes)", code="request_too_large", headers=CLOSE)
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), limits.read_timeout_s)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {limits.read_timeout_s:g} s "
                            f"({received} bytes came; --read-timeout)", code="request_timeout", headers=CLOSE) from None
    except ClientDisconnect:
        raise ClientGone(received) from None
    return b"".join(chunks)


def parse_json(raw: bytes):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"the request body is not UTF-8 (expected UTF-8 JSON; invalid byte 0x{raw[exc.start]:02x} "
                            f"at offset {exc.start})", code="invalid_json") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
                       code="invalid_json") from None
    except RecursionError:
        raise APIError(400, f"the request body nests deeper than {MAX_DEPTH} levels", code="invalid_json") from None


def check_json(body) -> None:
    """Every string (keys included) is valid Unicode and nothing nests deeper than `MAX_DEPTH`: one pass
    over the parsed body with an explicit stack (no recursion, whatever the depth)."""
    stack = [(body, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, str):
            _check_text(value, where)
            continue
        if isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                raise APIError(400, f"the request body nests deeper than {MAX_DEPTH} levels (at {where or 'the top'})",
                               code="invalid_json")
            if isinstance(value, dict):
                for key, item in value.items():
                    path = f"{where}.{key}" if where else str(key)
                    _check_text(key, path)
                    stack.append((item, depth + 1, path))
            else:
                stack.extend((item, depth + 1, f"{where}[{i}]") for i, item in enumerate(value))


def _check_text(text: str, where: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        # the path of a key with a surrogate has one too: name it escaped
        place = where.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
        raise APIError(400, f"{place}: expected valid Unicode text, got a lone surrogate \\u{code:04x} at character "
                            f"{exc.start}", param=place, code="invalid_text") from None


async def read_json(request: Request, limits: Limits):
    """The request's body, read within the limits, parsed and checked (see the module's contract)."""
    body = parse_json(await read_body(request, limits))
    check_json(body)
    return body
