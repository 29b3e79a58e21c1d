"""Building shards: one bulk pass per shard, written straight into its mapped file.

Contract. `build_shard_file(path, tokens, doc_lens, ids, tags)` writes one complete shard file
(format.py, arrays `SHARD_ARRAYS`) at `path`: the automaton of the documents (the automaton's own
construction in cache-line rows, `_kernels/bulk_sam.build_rows`, which also records each position's
prefix state), the counts and last ends (`_kernels/corpus_build.py`, from the prefix states), then
its frozen arrays with implicit states (`_kernels/bulk_freeze.py`, as `sam_freeze.implicit_ids`: states
ending at one position only are not stored; token ids as uint16 when they all fit, `token_dtype`,
and state lengths when every suffix link's length fits, the others saturated:
format.LEN_SATURATED), and the document table. The occurrence layout is not stored: readers compute it (snapshot.Shard.layout). Broken
invariants raise `InternalError`.
`ShardWriter` cuts a stream of `Document`s into shards of about `shard_tokens` tokens, builds
them (in worker processes when jobs > 1), and renames each finished file from its temporary
name to `shard-NNNNN.ssx` in its directory; `finish()` fsyncs them all before it returns (each one's
writeback started when it was written, so later shards' builds hide it); it never writes a manifest
(the caller commits).
A process that builds shards keeps its scratch buffers from one shard to the next (`pages.Scratch`:
a fresh page's first touch is a good part of a build); a writer releases its own when it closes, and
a worker's go with it. A worker receives a shard's tokens in shared memory (a memfd passed as a
descriptor), not pickled through its pipe.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

import numpy as np

from .._kernels import bulk_freeze as bfk
from .._kernels import bulk_sam as bsk
from .._kernels import corpus_build as cbk
from .._kernels.frozen import COUNT_ESCAPED
from .._kernels.pages import Scratch, anonymous
from ..errors import BadInputError, InternalError
from ..fileio import fsync_file, temp_name
from ..tokenids import as_tokens
from .documents import Document
from .format import KIND_SHARD, LEN_SATURATED, SHARD_ARRAYS, MappedContainer, PhaseClock
from .manifest import shard_name

__all__ = ["FROZEN_FIELDS", "build_shard_file", "ShardWriter", "sum_phases", "positive_count", "token_dtype"]

FROZEN_FIELDS = ("links", "lens", "counts", "count_escapes", "lasts", "offsets", "etok", "eto", "tokens", "plink",
                 "doc_starts")


def positive_count(name: str, value) -> int:
    """`value` as an int >= 1, else a BadInputError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BadInputError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def token_dtype(tokens: np.ndarray):
    """uint16 when every id of `tokens` fits (a shard's text and edge tokens then take 2 bytes), else int32."""
    return np.uint16 if tokens.shape[0] == 0 or int(tokens.max()) <= np.iinfo(np.uint16).max else np.int32


def sum_phases(records) -> dict:
    out = {}
    for r in records:
        for k, v in r.get("phases", {}).items():
            out[k] = out.get(k, 0.0) + v
    return out


def build_shard_file(path: str, tokens: np.ndarray, doc_lens: np.ndarray, ids: list, tags: list,
                     scratch: Scratch | None = None, durable: bool = True) -> dict:
    """Build one shard and write it at `path` (run in a worker process when jobs > 1): the
    automaton, then its frozen arrays, counts and last ends straight into the mapped file, its
    working arrays from `scratch` when given (else fresh pages); fsynced, or with `durable=False`
    only its writeback started (`MappedContainer.finish`).
    Returns {"bytes", "payload_crc", "n_tokens", "n_documents", "phases"} (seconds per phase)."""
    take = scratch.take if scratch is not None else (lambda _name, n, dtype: anonymous(n, dtype))
    phases = {}
    clock = PhaseClock(phases)
    tokens = np.ascontiguousarray(tokens, np.int32)
    n_tokens, n_docs = tokens.shape[0], len(doc_lens)
    doc_starts = np.zeros(n_docs, np.int64)
    np.cumsum(doc_lens[:-1], out=doc_starts[1:])
    if n_docs == 0 or n_tokens == 0 or int(doc_starts[-1]) + int(doc_lens[-1]) != n_tokens or (doc_lens <= 0).any():
        raise InternalError("document lengths disagree with the shard's tokens")
    pstate = take("pstate", n_tokens, np.int32)  # each position's prefix state, recorded by the build
    ra = bsk.build_rows(tokens, doc_starts, pstate, scratch=scratch)
    n_states = ra.n_states
    if int(ra.M[bsk.N_TOKENS]) != n_tokens:
        raise InternalError("automaton token count disagrees with the document lengths")
    clock.lap("automaton")
    doc_info = json.dumps({"ids": ids, "tags": tags}).encode()
    # counts and last ends from the prefix states (the occurrence layout is the reader's, see
    # snapshot.Shard.layout); `ids_`: every state's id in the frozen layout (implicit states: frozen.py)
    W = take("counts", n_states * cbk.W_COLS, np.int32).reshape(n_states, cbk.W_COLS)
    if not cbk.count_ends(bfk.link_column(ra.S, n_states), bfk.len_column(ra.S, n_states), pstate, W[:, cbk.W_CNT],
                          W[:, cbk.W_LAST], W):
        raise InternalError("counts disagree with the automaton's suffix links")
    clock.lap("counts")
    ids_ = take("ids", n_states, np.int32)
    n_stored, n_stored_edges, n_big, link_len = (int(x) for x in bfk.implicit_ids_rows(
        ra.S, ra.M, tokens, pstate, doc_starts, W[:, cbk.W_CNT], ids_, take("haskid", n_states, np.uint8), COUNT_ESCAPED))
    meta = {"n_tokens": n_tokens, "n_documents": n_docs, "n_states": n_stored, "n_edges": n_stored_edges,
            "n_implicit": n_states - n_stored}
    i4 = np.int32
    tok_dtype = token_dtype(tokens)
    # uint16 lengths when every length a query reads (a suffix link's) fits below LEN_SATURATED;
    # the others (leaves of the suffix-link tree in long documents) are stored saturated
    len_dtype = np.uint16 if link_len < LEN_SATURATED else i4
    len_cap = LEN_SATURATED if len_dtype is np.uint16 else np.iinfo(np.int32).max
    specs = [("links", i4, n_stored), ("lens", len_dtype, n_stored), ("counts", np.uint16, n_stored),
             ("count_escapes", i4, 2 * n_big), ("lasts", i4, n_stored),
             ("offsets", i4 if n_stored_edges < 2**31 else np.int64, n_stored + 1),  # int32 halves the edge offsets
             ("etok", tok_dtype, n_stored_edges), ("eto", i4, n_stored_edges), ("tokens", tok_dtype, n_tokens),
             ("plink", i4, n_tokens), ("doc_starts", np.int64, n_docs), ("doc_info", np.uint8, len(doc_info))]
    if tuple(name for name, _, _ in specs) != SHARD_ARRAYS:
        raise InternalError("shard arrays out of order")
    if n_stored + n_tokens >= 2**31:
        raise InternalError("shard too large for int32 state ids")
    out = MappedContainer(Path(path), KIND_SHARD, meta, specs)
    try:
        a = out.arrays
        if not bfk.freeze_rows_into(ra.S, ra.O, ra.R0, ra.M, ids_, n_stored, W[:, cbk.W_CNT], W[:, cbk.W_LAST], pstate,
                                    doc_starts, a["offsets"], a["etok"], a["eto"], a["links"], a["lens"], a["counts"],
                                    a["lasts"], a["plink"], a["count_escapes"], len_cap, COUNT_ESCAPED):
            raise InternalError("implicit states with stored suffix-link children")
        a["tokens"][:] = tokens
        a["doc_starts"][:] = doc_starts
        a["doc_info"][:] = np.frombuffer(doc_info, np.uint8)
        del ra, W, ids_, a, pstate
        clock.lap("freeze")
        result = out.finish(phases, durable)
    finally:
        out.close()
    result.update(n_tokens=n_tokens, n_documents=n_docs, phases=phases)
    return result


def shared_tokens(parts) -> int:
    """A memfd holding the concatenation of the int32 arrays `parts` (its descriptor: the caller closes it)."""
    n = sum(int(p.shape[0]) for p in parts)
    fd = os.memfd_create("suffixspec-shard-tokens", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(4 * n, 1))
        if n:
            m = mmap.mmap(fd, 4 * n)
            view = np.frombuffer(m, np.int32, count=n)
            np.concatenate(parts, out=view)
            del view
            m.close()
    except BaseException:
        os.close(fd)
        raise
    return fd


_WORKER_SCRATCH = Scratch()  # a worker process's buffers: it builds one shard at a time


def _worker_build(path: str, n_tokens: int, doc_lens: np.ndarray, ids: list, tags: list, tokens_fd: int) -> dict:
    """`build_shard_file` in a worker process, with its scratch, the tokens int32[n_tokens] read from the
    memfd `tokens_fd` (`shared_tokens`)."""
    # private and writable (never written): the kernels take writable arrays, and a read-only one would
    # compile them again for its own type
    m = mmap.mmap(tokens_fd, max(4 * n_tokens, 1), flags=mmap.MAP_PRIVATE)
    return build_shard_file(path, np.frombuffer(m, np.int32, count=n_tokens), doc_lens, ids, tags, _WORKER_SCRATCH,
                            durable=False)


class ShardWriter:
    """Cuts documents into shards of about `shard_tokens` tokens and builds them, in `jobs`
    worker processes when jobs > 1 (at most jobs shards in flight, plus the one being filled, to bound
    memory)."""

    def __init__(self, directory: Path, shard_tokens: int, jobs: int, first_shard: int = 0, doc_base: int = 0, progress=None,
                 vocab_size: int | None = None):
        positive_count("shard_tokens", shard_tokens)
        positive_count("jobs", jobs)
        self.vocab_size = vocab_size  # token ids must be below it (None: any int32)
        self.directory, self.shard_tokens, self.jobs = directory, int(shard_tokens), int(jobs)
        self.next_shard = first_shard
        self.doc_base = doc_base
        self.progress = progress
        self.pending = []  # (record, future or result)
        self.records = []
        self.scratch = Scratch()  # buffers of the shards built in this process (jobs == 1)
        self._reset()
        self.pool = None
        if self.jobs > 1:
            from .workers import WorkerPool

            # all workers fork now, before the caller's tokenizer starts its own threads
            self.pool = WorkerPool(self.jobs)

    def _reset(self):
        self.buf, self.lens, self.ids, self.tags, self.n = [], [], [], [], 0

    def add(self, doc: Document) -> bool:
        toks = as_tokens(doc.tokens, "document tokens")
        if toks.shape[0] == 0:
            return False
        doc_index = self.doc_base + sum(r["n_documents"] for r in self.records) + len(self.lens)
        lo, hi = int(toks.min()), int(toks.max())
        if lo < 0 or (self.vocab_size is not None and hi >= self.vocab_size):
            bad = lo if lo < 0 else hi
            raise BadInputError(f"document {doc.id if doc.id is not None else doc_index}: token id {bad} outside the "
                                f"tokenizer's vocabulary [0, {self.vocab_size})")
        if self.n and self.n + toks.shape[0] > self.shard_tokens:
            self.flush()
            doc_index = self.doc_base + sum(r["n_documents"] for r in self.records)
        self.buf.append(toks)
        self.lens.append(toks.shape[0])
        self.ids.append(str(doc.id) if doc.id is not None else str(doc_index))
        self.tags.append({str(k): str(v) for k, v in (doc.tags or {}).items()})
        self.n += toks.shape[0]
        return True

    def flush(self):
        if not self.n:
            return
        name = shard_name(self.next_shard)
        self.next_shard += 1
        tmp = temp_name(self.directory / name)
        record = {"file": name, "tmp": tmp, "n_tokens": self.n, "n_documents": len(self.lens)}
        lens, ids, tags, parts = np.asarray(self.lens, np.int64), self.ids, self.tags, self.buf
        if self.pool is None:
            tokens = np.concatenate(parts)
            self._reset()
            self.records.append(record)
            self._done(record, build_shard_file(str(tmp), tokens, lens, ids, tags, self.scratch, durable=False))
            return
        fd = shared_tokens(parts)
        try:
            self._reset()
            self.records.append(record)
            while len(self.pending) >= self.jobs:  # a worker free for this one
                self._done(*self._pop())
            self.pending.append((record, self.pool.submit(_worker_build, str(tmp), record["n_tokens"], lens, ids, tags,
                                                          fds=(fd,))))
        finally:
            os.close(fd)  # (the worker has its own copy)

    def _pop(self):
        """The first pending shard whose worker has finished (any order: the records keep theirs)."""
        tickets = [ticket for _, ticket in self.pending]
        record, ticket = self.pending.pop(tickets.index(self.pool.first_done(tickets)))
        return record, self.pool.result(ticket)

    def _done(self, record, result):
        os.replace(record["tmp"], self.directory / record["file"])
        del record["tmp"]  # (only once renamed: a caller interrupted before then removes the temporary)
        record.update(bytes=result["bytes"], payload_crc=result["payload_crc"], phases=result["phases"])
        if self.progress is not None:
            self.progress(record)

    def finish(self) -> list[dict]:
        try:
            self.flush()
            while self.pending:
                self._done(*self._pop())
            # durable before a manifest names them; each was written back while later ones were built
            for r in self.records:
                clock = PhaseClock(r["phases"])
                fsync_file(self.directory / r["file"])
                clock.lap("sync")
        finally:
            self.close()
        return self.records

    def close(self):
        self.scratch.release()
        if self.pool is not None:
            self.pool.stop()
            self.pool = None
