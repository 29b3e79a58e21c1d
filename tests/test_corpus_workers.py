"""The shard builders' worker pool (corpus/workers.py) and how a shard's tokens reach a worker
(corpus/shards.py): descriptors passed beside a call, the first finished call found whatever the order
of submission, a shard's tokens through a memfd, and a worker that reuses its scratch from one shard
to the next writing the bytes of a build on fresh pages."""

import mmap
import os
import time

import numpy as np
import pytest

from suffixspec.corpus import shards as C
from suffixspec.corpus.workers import WorkerPool
from suffixspec.errors import InternalError


def _read_fd(n_bytes, fd):
    """(In a worker) the first n_bytes of the file behind descriptor fd, its size, and the descriptor's number."""
    return os.pread(fd, n_bytes, 0), os.fstat(fd).st_size, fd


def _sleep_then(seconds, value):
    time.sleep(seconds)
    return value


def _fd_is_open(fd):
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _raise(message, fd):
    raise ValueError(f"{message} {os.fstat(fd).st_size}")


def test_descriptors_travel_to_the_worker_and_are_closed_there(tmp_path):
    pool = WorkerPool(1)
    try:
        path = tmp_path / "f"
        path.write_bytes(b"suffixspec workers " * 100)
        fd = os.open(path, os.O_RDONLY)
        try:
            ticket = pool.submit(_read_fd, 19, fds=(fd,))
        finally:
            os.close(fd)  # the worker has its own copy
        data, size, theirs = pool.result(ticket)
        assert data == b"suffixspec workers " and size == 1900
        # the descriptor the worker got is closed once its call returns (no leak per shard)
        assert pool.result(pool.submit(_fd_is_open, theirs)) is False
        with pytest.raises(ValueError, match="boom 1900"):  # an exception still comes back, and its descriptor
            fd = os.open(path, os.O_RDONLY)
            try:
                t = pool.submit(_raise, "boom", fds=(fd,))
            finally:
                os.close(fd)
            pool.result(t)
    finally:
        pool.stop()


def test_first_done_is_the_first_call_to_finish_not_the_first_submitted():
    pool = WorkerPool(2)
    try:
        slow = pool.submit(_sleep_then, 1.5, "slow")
        fast = pool.submit(_sleep_then, 0.05, "fast")
        assert pool.first_done([slow, fast]) == fast
        assert pool.result(fast) == "fast"
        assert pool.first_done([slow]) == slow
        assert pool.result(slow) == "slow"
        with pytest.raises(InternalError, match="every worker is busy"):
            pool.submit(_sleep_then, 0.0, 1)
            pool.submit(_sleep_then, 0.0, 2)
            pool.submit(_sleep_then, 0.0, 3)
    finally:
        pool.stop()


def test_shared_tokens_hold_the_concatenation():
    parts = [np.arange(5, dtype=np.int32), np.array([], np.int32), np.array([7, 2**31 - 1], np.int32)]
    fd = C.shared_tokens(parts)
    try:
        m = mmap.mmap(fd, 4 * 7, flags=mmap.MAP_PRIVATE)
        assert np.frombuffer(m, np.int32).tolist() == [0, 1, 2, 3, 4, 7, 2**31 - 1]
        assert os.fstat(fd).st_size == 28
    finally:
        os.close(fd)
    fd = C.shared_tokens([np.array([], np.int32)])
    os.close(fd)


def test_worker_shards_equal_fresh_builds(tmp_path):
    """Several shards in one worker, larger and smaller by turns (its scratch reused and grown), their
    tokens through a memfd: the bytes of each shard built in this process on fresh pages."""
    rng = np.random.default_rng(3)
    pool = WorkerPool(1)
    try:
        for k, (n_docs, alphabet) in enumerate([(30, 5000), (4, 7), (90, 50), (10, 5000)]):
            docs = [rng.integers(0, alphabet, int(rng.integers(1, 200)), dtype=np.int32) for _ in range(n_docs)]
            docs += [docs[0], docs[0][:1]]
            lens = np.array([len(d) for d in docs], np.int64)
            ids, tags = [f"d{i}" for i in range(len(docs))], [{"k": str(k)} for _ in docs]
            fresh = C.build_shard_file(str(tmp_path / f"fresh{k}"), np.concatenate(docs), lens, ids, tags)
            fd = C.shared_tokens(docs)
            try:
                ticket = pool.submit(C._worker_build, str(tmp_path / f"worker{k}"), int(lens.sum()), lens, ids, tags,
                                     fds=(fd,))
            finally:
                os.close(fd)
            got = pool.result(ticket)
            assert got["payload_crc"] == fresh["payload_crc"] and got["n_tokens"] == int(lens.sum())
            assert (tmp_path / f"worker{k}").read_bytes() == (tmp_path / f"fresh{k}").read_bytes()
    finally:
        pool.stop()


def test_writer_syncs_every_shard_it_built(tmp_path, monkeypatch):
    """The shards are written back while later ones build (no fsync in the build itself) and fsynced,
    every one, by `finish()` before it returns (then the caller's manifest may name them)."""
    from suffixspec import fileio
    from suffixspec.corpus import Document
    from suffixspec.corpus import format as F

    synced, started = [], []
    monkeypatch.setattr(C, "fsync_file", lambda path: synced.append(path.name))
    real_start = fileio.start_writeback
    monkeypatch.setattr(F, "start_writeback", lambda fd: (started.append(fd), real_start(fd)))
    writer = C.ShardWriter(tmp_path, shard_tokens=50, jobs=1)
    rng = np.random.default_rng(0)
    for i in range(12):
        writer.add(Document(rng.integers(0, 9, 30).astype(np.int32), f"d{i}"))
    records = writer.finish()
    assert len(records) >= 6 and len(started) == len(records)
    assert synced == [r["file"] for r in records] and all("sync" in r["phases"] for r in records)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(synced)


def test_fsync_file_names_a_missing_file(tmp_path):
    from suffixspec import fileio

    with pytest.raises(FileNotFoundError):
        fileio.fsync_file(tmp_path / "none")
    (tmp_path / "f").write_bytes(b"x" * 10_000)
    fd = os.open(tmp_path / "f", os.O_RDWR)
    try:
        fileio.start_writeback(fd)  # (Linux: sync_file_range; no error either way)
    finally:
        os.close(fd)
    fileio.fsync_file(tmp_path / "f")
