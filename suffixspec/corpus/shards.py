"""Building shards: one bulk pass per shard, written straight into its mapped file.

Contract. `build_shard_file(path, tokens, doc_lens, ids, tags)` writes one complete shard file
(format.py, arrays `SHARD_ARRAYS`) at `path`: the automaton of the documents (the same states
and edges as `SuffixAutomaton` builds), its frozen arrays and the occurrence layout
(`_kernels/corpus.py`), and the document table. Broken invariants raise `InternalError`.
`ShardWriter` cuts a stream of `Document`s into shards of about `shard_tokens` tokens, builds
them (in worker processes when jobs > 1), and renames each finished file from its temporary
name to `shard-NNNNN.ssx` in its directory; it never writes a manifest (the caller commits).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .._kernels import corpus as ck
from .._kernels import frozen as fk
from ..tokenids import as_tokens
from ..draft.automaton import SuffixAutomaton
from ..errors import BadInputError, InternalError
from ..fileio import temp_name
from .documents import Document
from .format import KIND_SHARD, SHARD_ARRAYS, MappedContainer, PhaseClock
from .manifest import shard_name

__all__ = ["ROOT_DENSE_LIMIT", "FROZEN_FIELDS", "aligned_rows", "hash_table", "bulk_automaton", "build_shard_file",
           "ShardWriter", "sum_phases", "positive_count"]

FROZEN_FIELDS = ("links", "lens", "counts", "lasts", "offsets", "etok", "eto", "tokens", "doc_starts")


def positive_count(name: str, value) -> int:
    """`value` as an int >= 1, else a BadInputError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BadInputError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def sum_phases(records) -> dict:
    out = {}
    for r in records:
        for k, v in r.get("phases", {}).items():
            out[k] = out.get(k, 0.0) + v
    return out


ROOT_DENSE_LIMIT = 1 << 24  # largest token id + 1 for which a shard is built by the bulk builder (dense root row)


def aligned_rows(rows: int, cols: int) -> np.ndarray:
    """int32[rows, cols] whose data starts on a 64-byte boundary (whole rows in a cache line)."""
    buf = np.empty(rows * cols + 16, np.int32)
    off = (-buf.ctypes.data % 64) // 4
    return buf[off : off + rows * cols].reshape(rows, cols)


def hash_table(rows: int) -> np.ndarray:
    size = 1024
    while rows * ck.B_LOAD_DEN > size * ck.B_LOAD_NUM:
        size *= 2
    H = aligned_rows(size, ck.H_COLS)
    H[:, ck.H_SRC] = -1
    return H


def bulk_automaton(tokens: np.ndarray, doc_starts: np.ndarray, e_rows: int | None = None, h_rows: int | None = None):
    """The automaton of the documents of `tokens` (starting at `doc_starts`), built in one pass
    by `_kernels/corpus.build_run` (same states and edges as `SuffixAutomaton`): (S, E, R, P, BM).
    Room for every state is reserved up front (a token adds at most two); the overflow edges
    and their hash grow between kernel calls, sized by projecting the rate seen so far
    (e_rows, h_rows: initial room, for tests)."""
    n = tokens.shape[0]
    S = aligned_rows(2 * n + 1, ck.B_COLS)
    E = np.empty((n // 2 + 1024 if e_rows is None else e_rows, ck.E_COLS), np.int32)  # ~0.39 overflow edges per token on code
    H = hash_table(int(n * 0.3) + 1024 if h_rows is None else h_rows)
    R = np.empty(int(tokens.max()) + 1, np.int32)
    P = np.empty(n, np.int32)
    BM = np.zeros(ck.B_META, np.int64)
    ck.build_init(S, R, BM)
    while True:
        need = ck.build_run(S, E, H, R, tokens, doc_starts, P, BM)
        if need == 0:
            break
        ne, pos = int(BM[ck.B_NE]), int(BM[ck.B_POS])
        if ne + need > E.shape[0]:
            more = ne * (n - pos) // max(pos, 1)
            grown = np.empty((max(ne + need, ne + more + (more >> 4) + 4096, E.shape[0] + (E.shape[0] >> 2)), ck.E_COLS), np.int32)
            grown[:ne] = E[:ne]
            E = grown
        if (ne + need) * ck.B_LOAD_DEN > H.shape[0] * ck.B_LOAD_NUM:
            H = hash_table(max(E.shape[0], ne + need))
            ck.build_rehash(E, H, ne)
    return S, E, R, P, BM


def build_shard_file(path: str, tokens: np.ndarray, doc_lens: np.ndarray, ids: list, tags: list) -> dict:
    """Build one shard and write it at `path` (run in a worker process when jobs > 1): the
    automaton, then its frozen arrays and occurrence layout straight into the mapped file.
    Returns {"bytes", "payload_crc", "n_tokens", "n_documents", "phases"} (seconds per phase)."""
    phases = {}
    clock = PhaseClock(phases)
    tokens = np.ascontiguousarray(tokens, np.int32)
    n_tokens, n_docs = tokens.shape[0], len(doc_lens)
    doc_starts = np.zeros(n_docs, np.int64)
    np.cumsum(doc_lens[:-1], out=doc_starts[1:])
    if n_docs == 0 or n_tokens == 0 or int(doc_starts[-1]) + int(doc_lens[-1]) != n_tokens or (doc_lens <= 0).any():
        raise InternalError("document lengths disagree with the shard's tokens")
    bulk = int(tokens.max()) < ROOT_DENSE_LIMIT
    if bulk:
        S, E, R, pstate, BM = bulk_automaton(tokens, doc_starts)
        n_states, n_edges = int(BM[ck.B_NS]), int(BM[ck.B_EDGES])
    else:  # huge token ids: the growable automaton (hashed root)
        sa = SuffixAutomaton()
        for i in range(n_docs):
            sa.add_document(tokens[doc_starts[i] : doc_starts[i] + doc_lens[i]])
        n_states, n_edges = sa.n_states, sa.n_edges
        if sa.n_documents != n_docs or len(sa) != n_tokens:
            raise InternalError("automaton document count disagrees with the document lengths")
    clock.lap("automaton")
    doc_info = json.dumps({"ids": ids, "tags": tags}).encode()
    meta = {"n_tokens": n_tokens, "n_documents": n_docs, "n_states": n_states, "n_edges": n_edges}
    i4 = np.int32
    specs = [("links", i4, n_states), ("lens", i4, n_states), ("counts", i4, n_states), ("lasts", i4, n_states),
             ("offsets", i4 if n_edges < 2**31 else np.int64, n_states + 1),  # int32 halves the edge offsets
             ("etok", i4, n_edges), ("eto", i4, n_edges), ("tokens", i4, n_tokens), ("doc_starts", np.int64, n_docs),
             ("occ", i4, n_tokens), ("occ_start", i4, n_states), ("doc_info", np.uint8, len(doc_info))]
    if tuple(name for name, _, _ in specs) != SHARD_ARRAYS:
        raise InternalError("shard arrays out of order")
    out = MappedContainer(Path(path), KIND_SHARD, meta, specs)
    try:
        a = out.arrays
        if bulk:
            if ck.build_freeze(S, E, R, BM, a["links"], a["lens"], a["offsets"], a["etok"], a["eto"]) != n_edges:
                raise InternalError("frozen edge count disagrees with the automaton's")
            a["tokens"][:] = tokens
            a["doc_starts"][:] = doc_starts
            clock.lap("freeze")
            # scratch in the spent builder arrays (mapped already): S holds 32 bytes per state, E >= 8 per token
            scratch_w = S.reshape(-1)[: ck.W_COLS * n_states].reshape(n_states, ck.W_COLS)
            scratch_order = E.reshape(-1)[:n_states]
            if not ck.build_occurrences(a["links"], a["lens"], pstate, a["counts"], a["lasts"], a["occ"], a["occ_start"],
                                        scratch_w, scratch_order):
                raise InternalError("occurrence layout disagrees with the automaton's counts")
            del S, E, R, scratch_w, scratch_order
        else:
            frozen = sa.freeze()  # the rare huge-id fallback: a copy in memory, then into the file
            for name in FROZEN_FIELDS:
                a[name][:] = getattr(frozen, name)
            del sa, frozen
            if not np.array_equal(a["doc_starts"], doc_starts):
                raise InternalError("automaton document table disagrees with the document lengths")
            clock.lap("freeze")
            pstate = ck.prefix_states(a["offsets"], a["etok"], a["eto"], a["tokens"], a["doc_starts"])
            if pstate.shape[0] and pstate[0] == fk.CORRUPT:
                raise InternalError("automaton does not spell its own documents")
            counts, lasts = a["counts"].copy(), a["lasts"].copy()
            if not ck.build_occurrences(a["links"], a["lens"], pstate, a["counts"], a["lasts"], a["occ"], a["occ_start"],
                                        np.empty((n_states, ck.W_COLS), np.int32), np.empty(n_states, np.int32)):
                raise InternalError("occurrence layout disagrees with the automaton's suffix links")
            if not (np.array_equal(counts, a["counts"]) and np.array_equal(lasts, a["lasts"])):
                raise InternalError("occurrence counts disagree with the automaton's")
        a["doc_info"][:] = np.frombuffer(doc_info, np.uint8)
        del a, pstate
        clock.lap("occurrences")
        result = out.finish(phases)
    finally:
        out.close()
    result.update(n_tokens=n_tokens, n_documents=n_docs, phases=phases)
    return result


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
        args = (str(tmp), np.concatenate(self.buf), np.asarray(self.lens, np.int64), self.ids, self.tags)
        self._reset()
        self.records.append(record)
        if self.pool is None:
            self._done(record, build_shard_file(*args))
        else:
            while len(self.pending) >= self.jobs:  # a worker free for this one
                self._done(*self._pop())
            self.pending.append((record, self.pool.submit(build_shard_file, *args)))

    def _pop(self):
        record, ticket = self.pending.pop(0)
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
        finally:
            self.close()
        return self.records

    def close(self):
        if self.pool is not None:
            self.pool.stop()
            self.pool = None
