"""What goes into a corpus index: `Document`, build statistics, and reading input files.

Contract. `read_documents` yields (text, id, tags) for text files (one document each) and JSON
lines files (one document per line); explicit inputs that are unreadable, not regular files
(FIFO, device, directory given as a file), binary or malformed raise a BadInputError naming
the file (and line), unless `skip_bad` counts and skips them. Files met while walking a
directory are skipped when binary or not regular files. Nothing here touches an index.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import BadInputError
from ..fileio import open_regular

__all__ = ["Document", "BuildStats", "ReadStats", "IGNORED_DIRS", "JSONL_SUFFIXES", "list_input_files",
           "read_documents", "as_document"]


@dataclass
class Document:
    """A document to index: token ids, a name and tags."""

    tokens: np.ndarray
    id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


def as_document(d) -> Document:
    return d if isinstance(d, Document) else Document(tokens=d)


@dataclass
class BuildStats:
    n_documents: int = 0
    n_tokens: int = 0
    n_shards: int = 0
    bytes_on_disk: int = 0
    seconds: float = 0.0
    empty_documents: int = 0
    phases: dict = field(default_factory=dict)  # seconds per build phase, summed over shards (and workers)

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_on_disk / max(self.n_tokens, 1)


# -- reading input files ---------------------------------------------------------------------

IGNORED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".tox",
                          ".mypy_cache", ".pytest_cache", ".ruff_cache", ".idea", ".vscode", ".eggs"})
JSONL_SUFFIXES = (".jsonl", ".ndjson")


@dataclass
class ReadStats:
    files: int = 0
    skipped_lines: int = 0
    skipped_files: int = 0
    bytes: int = 0


def list_input_files(inputs, glob: str | None = None) -> list[tuple[Path, str]]:
    """(file, document id prefix) for every input: files as given, directories walked
    recursively (sorted; IGNORED_DIRS, hidden directories and `*.egg-info` skipped; `glob`
    matched against file names; only regular files, symlinks followed)."""
    out = []
    for inp in inputs:
        p = Path(inp)
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS and not d.startswith(".") and not d.endswith(".egg-info"))
                for name in sorted(files):
                    if glob and not fnmatch.fnmatch(name, glob):
                        continue
                    if name.startswith(".") or name.endswith((".pyc", ".pyo")):
                        continue
                    f = Path(root) / name
                    if not _is_regular(f):
                        continue  # FIFO, socket, device, dangling link: never read while walking
                    out.append((f, str(Path(p.name) / f.relative_to(p))))
        elif p.exists():
            out.append((p, str(p)))
        else:
            raise BadInputError(f"{p}: no such file or directory")
    return out


def _is_regular(f: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(f).st_mode)
    except OSError:
        return False


def _tags_from(value, where) -> dict:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, str) and "=" in v for v in value):
        return dict(v.split("=", 1) for v in value)
    raise BadInputError(f"{where}: tags: expected an object or a list of 'key=value' strings, got {value!r}")


def read_documents(inputs, *, glob: str | None = None, field_name: str = "text", id_field: str | None = None,
                   tag_field: str | None = None, tags: dict | None = None, skip_bad: bool = False,
                   stats: ReadStats | None = None, files=None) -> Iterator[tuple[str, str, dict]]:
    """(text, id, tags) of every document in `inputs`: a text file is one document; each line of
    a `.jsonl` file is one (its `field_name`, optional `id_field`, `tag_field`). Explicit inputs
    that are unreadable, binary or malformed raise BadInputError naming the file (and line);
    `skip_bad` counts and skips them instead. Binary files found while walking are skipped."""
    stats = stats if stats is not None else ReadStats()
    extra = dict(tags or {})
    explicit = {Path(i) for i in inputs}
    for f, doc_id in (files if files is not None else list_input_files(inputs, glob)):
        try:
            data = _read_regular(f)
        except BadInputError:
            if skip_bad:
                stats.skipped_files += 1
                continue
            raise
        stats.files += 1
        stats.bytes += len(data)
        if f.suffix in JSONL_SUFFIXES:
            yield from _read_jsonl(f, data, field_name, id_field, tag_field, extra, skip_bad, stats)
            continue
        try:
            if b"\0" in data[:8192]:
                raise UnicodeDecodeError("utf-8", b"", 0, 1, "NUL byte")
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            if f in explicit and not skip_bad:
                raise BadInputError(f"{f}: not a UTF-8 text file (binary?)") from None
            stats.skipped_files += 1
            continue
        yield text, doc_id, dict(extra)


def _read_regular(f: Path) -> bytes:
    fd, st = open_regular(f, error=BadInputError)
    # the descriptor is read and closed here, never handed to a file object: an interrupt raised
    # between a file object taking it and our bookkeeping would close it twice (EBADF hid the signal)
    try:
        chunks = []
        while chunk := os.read(fd, max(st.st_size + 1, 1 << 16) if not chunks else 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise BadInputError(f"{f}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _read_jsonl(f, data, field_name, id_field, tag_field, extra, skip_bad, stats):
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        where = f"{f}:{lineno}"
        try:
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise BadInputError(f"{where}: malformed JSON ({getattr(exc, 'msg', exc)})") from None
            if not isinstance(obj, dict):
                raise BadInputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            text = obj.get(field_name)
            if not isinstance(text, str):
                raise BadInputError(f"{where}: field {field_name!r}: expected a string, got {type(text).__name__ if text is not None else 'nothing'}")
            doc_id = f"{f.name}:{lineno}"
            if id_field is not None:
                if obj.get(id_field) is None:
                    raise BadInputError(f"{where}: missing id field {id_field!r}")
                doc_id = str(obj[id_field])
            tags = dict(extra)
            if tag_field is not None:
                tags.update(_tags_from(obj.get(tag_field), where))
        except BadInputError:
            if skip_bad:
                stats.skipped_lines += 1
                continue
            raise
        yield text, doc_id, tags
