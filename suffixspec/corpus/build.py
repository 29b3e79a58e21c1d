"""Writing indexes: build, append, delete, merge; one writer at a time, readers never disturbed.

Contract.
- `build_index(documents, path)` builds the shards in a temporary sibling folder (its name
  carries the writer, see fileio.py), then commits: a new `path` is the folder renamed into
  place; over an existing index (or when another build created `path` first) the new shards are
  moved into it under fresh numbers and the manifest is swapped, under the writer lock.
- `append_documents` adds shards, `delete_documents` replaces the deleted-documents bitmap,
  `merge_indexes` compacts indexes into one (into one of its inputs too): each holds the index's
  writer lock (lock.py) for the whole change, reading the index under it, so concurrent writers
  serialise and none is lost; `wait` seconds for the lock, else `IndexLockedError`.
- Every change is committed by the manifest's atomic rename; files the old manifest named are
  removed only after it, and a writer first removes what dead writers left (lock.clean; temporary
  siblings of a new index only when their writer is provably gone).
- `delete_documents` and `merge_indexes` open their inputs with full verification.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from ..errors import BadInputError, IndexFormatError, SuffixSpecError, TokenizerMismatchError
from ..fileio import fsync_dir, remove_stale_temps, temp_name
from .documents import BuildStats, as_document
from .format import KIND_DELETED, KIND_MANIFEST, MANIFEST, Container, write_container
from .lock import LOCK_FILE, WriterLock, check_wait, clean
from .manifest import check_manifest, manifest_meta, shard_name, shard_number, tokenizer_info, write_manifest
from .query import CorpusIndex, index_dir
from .shards import ShardWriter, positive_count, sum_phases

__all__ = ["DEFAULT_SHARD_TOKENS", "build_index", "append_documents", "delete_documents", "delete_selected",
           "DeleteReport", "merge_indexes", "IndexWriteError"]

DEFAULT_SHARD_TOKENS = 16_000_000
REPLACE_ERRNOS = (errno.ENOTEMPTY, errno.EEXIST)  # rename onto a non-empty folder: someone built it first


class IndexWriteError(SuffixSpecError, OSError):
    """The operating system refused a write of an index (no space, no permission, ...); the index
    is as it was before the call (the change was not committed)."""


def _os_errors_named(target_arg: int):
    """Decorator: an OSError escaping the call becomes an IndexWriteError naming the index."""

    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except OSError as exc:
                if isinstance(exc, SuffixSpecError):
                    raise
                target = args[target_arg] if len(args) > target_arg else kwargs.get("path", kwargs.get("out"))
                where = f" ({exc.filename})" if exc.filename else ""
                raise IndexWriteError(f"{target}: cannot write the index: {exc.strerror or exc}{where}") from exc

        return call

    return wrap


def _check_target(path: Path) -> None:
    if path.is_symlink() and not path.exists():
        raise BadInputError(f"{path}: a dangling or looping symlink; refusing to build over it")
    if path.exists() and not (path / MANIFEST).is_file() and not (path.is_dir() and not any(path.iterdir())):
        raise BadInputError(f"{path}: exists and is not a suffixspec index; refusing to overwrite it")


def _current_meta(path: Path) -> dict | None:
    """The manifest meta of the index at `path` when it is readable and consistent, else None."""
    try:
        m = Container(path / MANIFEST, KIND_MANIFEST, {})
        m.verify()
        check_manifest(m.path, m.meta)
    except IndexFormatError:
        return None
    return m.meta


def _next_number(path: Path, meta: dict | None) -> int:
    names = os.listdir(path) + ([s["file"] for s in meta["shards"]] if meta else [])
    return max((n for n in map(shard_number, names) if n is not None), default=-1) + 1


def _commit(tmp: Path, path: Path, info: dict, records: list[dict], wait: float, lock) -> int:
    """Publish the shards built in folder `tmp` as the index at `path`; returns its bytes on disk."""
    if lock is None and not path.exists():
        total = write_manifest(tmp, manifest_meta(info, records, None))
        try:
            os.rename(tmp, path)
            fsync_dir(path.parent)
            return total
        except OSError as exc:
            if exc.errno not in REPLACE_ERRNOS:
                raise
        os.unlink(tmp / MANIFEST)  # another build created `path` meanwhile: build over it below
    _check_target(path)
    with lock if lock is not None else WriterLock(path, wait):
        old = _current_meta(path)
        clean(path, old)
        number = _next_number(path, old)
        moved = []
        try:
            for r in records:
                name = shard_name(number)
                number += 1
                os.rename(tmp / r["file"], path / name)
                moved.append(path / name)
                r["file"] = name
            fsync_dir(path)
            meta = manifest_meta(info, records, None)
            total = write_manifest(path, meta)
        except BaseException:
            _remove_unpublished(path, moved)
            raise
        clean(path, meta)  # the old generation's files, now that no manifest names them
    return total


def _remove_unpublished(path: Path, files) -> None:
    """Under the writer lock, after a change of the index at `path` failed or was interrupted: remove
    those of `files` (this writer's shards and temporaries) that the manifest now on disk does not
    name. An interrupt may land after the manifest naming them was renamed into place: they then stay."""
    named = {s["file"] for s in (_current_meta(path) or {}).get("shards", [])}
    for f in files:
        if f is not None and Path(f).name not in named:
            Path(f).unlink(missing_ok=True)


def _build(documents: Iterable, path: Path, info: dict, shard_tokens, jobs, progress, wait: float, lock) -> BuildStats:
    t0 = time.perf_counter()
    positive_count("shard_tokens", shard_tokens)
    positive_count("jobs", jobs)
    _check_target(path)
    remove_stale_temps(path.parent, prefix=f".{path.name}.")  # dead builders' folders (provably dead only)
    tmp = temp_name(path)
    writer = None
    try:  # (from before the folder exists: an interrupt right after its creation still removes it)
        tmp.mkdir(parents=False)
        (tmp / LOCK_FILE).touch()  # every index has its writers' lock file from the start
        writer = ShardWriter(tmp, shard_tokens, jobs, progress=progress, vocab_size=info["vocab_size"])
        empty = 0
        for d in documents:
            if not writer.add(as_document(d)):
                empty += 1
        records = writer.finish()
        if not records:
            raise BadInputError("empty corpus: no document has any token")
        total = _commit(tmp, path, info, records, wait, lock)
    finally:
        try:
            if writer is not None:
                writer.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return BuildStats(sum(r["n_documents"] for r in records), sum(r["n_tokens"] for r in records), len(records), total,
                      time.perf_counter() - t0, empty, sum_phases(records))


@_os_errors_named(1)
def build_index(documents: Iterable, path, *, tokenizer, shard_tokens: int = DEFAULT_SHARD_TOKENS,
                jobs: int = 1, progress=None, wait: float = 0.0) -> BuildStats:
    """Build an index of `documents` (`Document`s or token arrays) at exactly `path`, atomically.

    `tokenizer`: the `Tokenizer` the tokens came from, or a dict {name, vocab_size, fingerprint}.
    An existing index at `path` is replaced (under its writer lock, waiting up to `wait`
    seconds); any other existing file or non-empty directory is an error. `progress(record)`
    is called after each shard is written.
    """
    return _build(documents, Path(path), tokenizer_info(tokenizer), shard_tokens, jobs, progress, check_wait(wait), None)


@_os_errors_named(0)
def append_documents(path, documents: Iterable, *, tokenizer, shard_tokens: int = DEFAULT_SHARD_TOKENS, jobs: int = 1,
                     wait: float = 0.0) -> BuildStats:
    """Add documents to an existing index as new shards, under its writer lock (waiting up to
    `wait` seconds); the manifest rename commits them."""
    t0 = time.perf_counter()
    path = index_dir(path)
    wait = check_wait(wait)
    vocab = tokenizer_info(tokenizer)["vocab_size"]
    writer = None
    try:
        writer = ShardWriter(path, shard_tokens, jobs, vocab_size=vocab)  # its workers fork before the lock is taken
        with WriterLock(path, wait):
            try:
                index = CorpusIndex.open(path, tokenizer=tokenizer)  # under the lock: the latest manifest
                meta = index.manifest
                clean(path, meta)
                writer.next_shard = _next_number(path, meta)
                writer.doc_base = meta["n_documents"]
                for d in documents:
                    writer.add(as_document(d))
                records = writer.finish()
                total = index.bytes_on_disk
                if records:
                    old = [dict(s) for s in meta["shards"]]
                    total = write_manifest(path, manifest_meta(meta["tokenizer"], old + records, meta.get("deleted")))
            except BaseException:
                writer.close()  # (no worker still writing a file removed below)
                _remove_unpublished(path, [p for r in writer.records for p in (r.get("tmp"), path / r["file"])])
                raise
    finally:
        if writer is not None:
            writer.close()
    return BuildStats(sum(r["n_documents"] for r in records), sum(r["n_tokens"] for r in records), len(records), total,
                      time.perf_counter() - t0, phases=sum_phases(records))


@dataclass
class DeleteReport:
    """What `delete_selected` chose and did."""

    selected: int  # documents the selection names (deleted ones included)
    newly_deleted: int
    n_deleted: int  # deleted documents of the index afterwards (or that would be, with dry_run)
    n_documents: int
    document_ids: list = field(default_factory=list)  # ids of the selected documents
    dry_run: bool = False


@_os_errors_named(0)
def delete_selected(path, documents=None, *, ids: Iterable[str] | None = None, tags: dict | None = None,
                    wait: float = 0.0, dry_run: bool = False) -> DeleteReport:
    """Mark documents deleted (see `delete_documents`), resolving the selection under the
    writer lock; with `dry_run` only report what would change (no lock, nothing written)."""
    path = index_dir(path)
    wait = check_wait(wait)
    with nullcontext() if dry_run else WriterLock(path, wait):
        index = CorpusIndex.open(path, verify=True)
        chosen = index.select_documents(documents, ids=ids, tags=tags)
        bm = index.deleted | chosen
        report = DeleteReport(len(chosen), len(bm) - len(index.deleted), len(bm), index.n_documents,
                              [index.document_ids[d] for d in chosen], dry_run)
        if dry_run or not report.newly_deleted:
            return report
        meta = dict(index.manifest)
        clean(path, meta)
        name = f"deleted-{uuid.uuid4().hex[:8]}.ssx"
        tmp = temp_name(path / name)
        try:
            out = write_container(tmp, KIND_DELETED, {"n_deleted": len(bm)},
                                  {"bitmap": np.frombuffer(bm.serialize(), np.uint8)})
            os.replace(tmp, path / name)
            meta["deleted"] = {"file": name, "payload_crc": out["payload_crc"], "bytes": out["bytes"]}
            write_manifest(path, meta)
        except BaseException:
            tmp.unlink(missing_ok=True)
            # an interrupt may land after the manifest naming the bitmap was written: then it stays
            if ((_current_meta(path) or {}).get("deleted") or {}).get("file") != name:
                (path / name).unlink(missing_ok=True)
            raise
        clean(path, meta)  # the previous bitmap, now that no manifest names it
        index.close()
    return report


def delete_documents(path, documents=None, *, ids: Iterable[str] | None = None, tags: dict | None = None,
                     wait: float = 0.0) -> int:
    """Mark documents of the index at `path` deleted; returns how many are deleted afterwards.

    Selection as in `CorpusIndex.subset`: document indexes (ints or a BitMap) and/or the
    documents named in `ids` and carrying all `tags`; given together, all must hold. An index
    out of range, an id naming no document, tags matching no document or no selector at all is
    a BadInputError and changes nothing. Runs under the index's writer lock (waiting up to
    `wait` seconds), reading the index (fully verified) under it.
    """
    return delete_selected(path, documents, ids=ids, tags=tags, wait=wait).n_deleted


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@_os_errors_named(1)
def merge_indexes(paths, out, *, shard_tokens: int | None = None, jobs: int = 1, wait: float = 0.0) -> BuildStats:
    """Compact indexes (all built with one tokenizer, each fully verified) into one at `out`,
    dropping deleted documents; one shard unless `shard_tokens` is given. `out` may be one of
    the inputs: its writer lock is then held from reading to committing."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise BadInputError("merge: expected at least one index")
    out = Path(out)
    wait = check_wait(wait)
    if shard_tokens is not None:
        positive_count("shard_tokens", shard_tokens)
    lock = WriterLock(index_dir(out), wait) if out.exists() and any(_same_dir(out, p) for p in paths) else None
    with lock if lock is not None else nullcontext():
        indexes = [CorpusIndex.open(p, verify=True) for p in paths]
        info = indexes[0].tokenizer_info
        for ix in indexes[1:]:
            if ix.tokenizer_info["fingerprint"] != info["fingerprint"]:
                raise TokenizerMismatchError(
                    f"{ix.path}: built with tokenizer {ix.tokenizer_info['name']} ({ix.tokenizer_info['fingerprint'][:16]}), "
                    f"{indexes[0].path} with {info['name']} ({info['fingerprint'][:16]}); cannot merge")
        if not any(ix.n_documents > len(ix.deleted) for ix in indexes):
            raise BadInputError("merge: every document of the input index(es) is deleted; nothing to merge")

        def docs():
            for ix in indexes:
                yield from ix.iter_documents()

        total = sum(ix.n_tokens for ix in indexes)
        return _build(docs(), out, info, shard_tokens if shard_tokens is not None else max(total, 1), jobs, None, wait,
                      _Held(lock) if lock is not None else None)


class _Held:
    """A lock already held by the caller, as a context manager that leaves it held."""

    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        return self.lock

    def __exit__(self, *exc):
        return None
