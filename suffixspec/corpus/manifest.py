"""The manifest of a corpus index: what it holds, its validation, and its atomic replacement.

Contract. `INDEX/manifest.ssx` is a container file (format.py) with no arrays whose meta block
names the tokenizer, the counts, the shard files (each with its token / document base, size and
payload checksum) and the optional deleted-documents bitmap file. It is the commit point of
every change: `write_manifest` writes it under a temporary name, fsyncs and renames it over the
old one, so a reader sees the old or the new manifest whole. `check_manifest` validates a meta
block completely (types, bases contiguous, counts adding up, file names plain) and raises an
`IndexFormatError` naming the file otherwise. Shard files are named `shard-NNNNN.ssx` (numbers
never reused within a directory while a manifest names them) and bitmaps `deleted-<hex>.ssx`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import BadInputError, IndexFormatError
from ..fileio import fsync_dir, temp_name
from .format import FORMAT_VERSION, KIND_MANIFEST, MANIFEST, version_problem, write_container

__all__ = ["tokenizer_info", "manifest_meta", "check_manifest", "write_manifest", "index_files", "shard_name",
           "shard_number", "is_index_file", "suffixspec_version", "FORMAT_NAME"]

FORMAT_NAME = "suffixspec-corpus-index"
SHARD_RE = re.compile(r"shard-(\d{5,})\.ssx")
DELETED_RE = re.compile(r"deleted-[0-9a-f]{8,}\.ssx")


def suffixspec_version() -> str:
    """The installed suffixspec's version (recorded in manifests, for diagnosis only)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return "unknown"
    try:
        return version("suffixspec")
    except PackageNotFoundError:
        return "unknown"


def tokenizer_info(tokenizer) -> dict:
    """{name, vocab_size, fingerprint} of a Tokenizer or of such a dict; BadInputError otherwise."""
    if isinstance(tokenizer, dict):
        info = tokenizer
    else:
        info = {"name": getattr(tokenizer, "name", None), "vocab_size": getattr(tokenizer, "vocab_size", None),
                "fingerprint": getattr(tokenizer, "fingerprint", None)}
    missing = [k for k in ("name", "vocab_size", "fingerprint") if info.get(k) is None]
    if missing:
        raise BadInputError(f"tokenizer: expected a Tokenizer or a dict with name, vocab_size and fingerprint; missing {', '.join(missing)}")
    vocab = info["vocab_size"]
    try:
        ok = not isinstance(vocab, bool) and int(vocab) == vocab and int(vocab) >= 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise BadInputError(f"tokenizer: vocab_size: expected a positive integer, got {vocab!r}")
    return {"name": str(info["name"]), "vocab_size": int(vocab), "fingerprint": str(info["fingerprint"])}


def shard_name(number: int) -> str:
    return f"shard-{number:05d}.ssx"


def shard_number(name: str) -> int | None:
    m = SHARD_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def is_index_file(name: str) -> bool:
    """A shard or bitmap file name (what a writer may remove once no manifest names it)."""
    return bool(SHARD_RE.fullmatch(name) or DELETED_RE.fullmatch(name))


def manifest_meta(tokenizer: dict, records: list[dict], deleted: dict | None) -> dict:
    shards, tb, db = [], 0, 0
    for r in records:
        shards.append({"file": r["file"], "n_tokens": r["n_tokens"], "n_documents": r["n_documents"],
                       "token_base": tb, "doc_base": db, "bytes": r["bytes"], "payload_crc": r["payload_crc"]})
        tb += r["n_tokens"]
        db += r["n_documents"]
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "tokenizer": tokenizer,
            "n_tokens": tb, "n_documents": db, "shards": shards, "deleted": deleted,
            "suffixspec_version": suffixspec_version()}


def _int(value, lo: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lo


def _plain_name(name) -> bool:
    return isinstance(name, str) and name == os.path.basename(name) and not name.startswith(".") and name.endswith(".ssx")


def manifest_problem(meta: dict) -> str | None:
    """What is wrong with a manifest's meta block, None when it is consistent."""
    if meta.get("format") != FORMAT_NAME:
        return f"unsupported format {meta.get('format')!r}"
    if meta.get("format_version") != FORMAT_VERSION:
        return version_problem(meta.get("format_version"))
    try:
        tok = tokenizer_info(meta.get("tokenizer") if isinstance(meta.get("tokenizer"), dict) else {})
    except BadInputError as exc:
        return f"tokenizer record: {exc}"
    if tok != meta["tokenizer"]:
        return "tokenizer record: malformed"
    records = meta.get("shards")
    if not isinstance(records, list) or not records:
        return "no shard list"
    tb = db = 0
    for i, r in enumerate(records):
        if not isinstance(r, dict) or not _plain_name(r.get("file")):
            return f"shard record {i}: malformed"
        if not all(_int(r.get(k), lo) for k, lo in (("n_tokens", 1), ("n_documents", 1), ("token_base", 0),
                                                     ("doc_base", 0), ("bytes", 0), ("payload_crc", 0))):
            return f"shard record {i}: malformed counts"
        if r["token_base"] != tb or r["doc_base"] != db:
            return f"shard record {i}: bases do not follow the previous shard's"
        tb += r["n_tokens"]
        db += r["n_documents"]
    if len({r["file"] for r in records}) != len(records):
        return "a shard file is listed twice"
    if meta.get("n_tokens") != tb or meta.get("n_documents") != db:
        return "totals disagree with the shard list"
    d = meta.get("deleted")
    if d is not None and not (isinstance(d, dict) and _plain_name(d.get("file")) and _int(d.get("payload_crc"))
                              and _int(d.get("bytes"))):
        return "deleted-documents record: malformed"
    return None


def check_manifest(path: Path, meta: dict) -> None:
    problem = manifest_problem(meta)
    if problem is not None:
        raise IndexFormatError(f"{path}: inconsistent manifest ({problem})")


def index_files(meta: dict) -> list[str]:
    """Every file a manifest names, the manifest first."""
    return [MANIFEST] + [s["file"] for s in meta["shards"]] + ([meta["deleted"]["file"]] if meta.get("deleted") else [])


def write_manifest(directory: Path, meta: dict) -> int:
    """Replace `directory`'s manifest atomically (the commit point of a change); returns the
    bytes on disk of the index it describes."""
    target = Path(directory) / MANIFEST
    tmp = temp_name(target)
    try:
        written = write_container(tmp, KIND_MANIFEST, meta, {})
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(directory)
    return written["bytes"] + sum(s["bytes"] for s in meta["shards"]) + (meta["deleted"]["bytes"] if meta.get("deleted") else 0)
