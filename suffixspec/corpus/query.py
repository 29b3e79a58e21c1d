"""Queries over an opened corpus index: `CorpusIndex`, `CorpusMatch`, `Subset`.

Contract. A `CorpusIndex` is one snapshot of an index directory (snapshot.py), read-only and
safe to share across threads; writers never change what it maps. Queries ask every shard:
counts add up, the longest match is the maximum, continuations merge (counts summed, most recent
end = maximum). Unrestricted queries are exact. A restricted query (a `Subset`, or any query of
an index with deleted documents) reads O(k) end positions per shard: counts and continuations are
exact when the matched string occurs at most `k` times in a shard, else estimated from a sample
and flagged `estimated` (see `_kernels/corpus_query.py`). Damage met while answering raises an
`IndexFormatError`; a caller's bad argument a `BadInputError`.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .._kernels import corpus_query as cqk
from .._kernels import frozen as fk
from ..errors import BadInputError, IndexFormatError, InternalError, TokenizerMismatchError
from ..tokenids import as_tokens
from .documents import Document
from .format import MANIFEST
from .manifest import tokenizer_info
from .snapshot import Shard, Snapshot, open_snapshot

__all__ = ["CorpusIndex", "CorpusMatch", "Subset", "DEFAULT_K", "check_k", "index_dir"]

DEFAULT_K = 4096


@dataclass
class CorpusMatch:
    """What an index knows about a matched string: `length` tokens long, `count` end positions
    (an estimate when `estimated`), and its continuations: `tokens` (sorted), their `counts`
    and the most recent end position (`last_ends`, global) of matched string + token."""

    length: int
    count: int
    estimated: bool
    tokens: np.ndarray
    counts: np.ndarray
    last_ends: np.ndarray

    def __len__(self) -> int:
        """Number of distinct continuation tokens."""
        return int(self.tokens.shape[0])

    def as_dict(self) -> dict[int, tuple[int, int]]:
        return {int(t): (int(c), int(e)) for t, c, e in zip(self.tokens, self.counts, self.last_ends)}

    def top(self, n: int = 5) -> list[tuple[int, int, int]]:
        """(token, count, last_end) of the `n` most frequent continuations, most recent first on ties."""
        order = np.lexsort((-self.last_ends, -self.counts))[:n]
        return [(int(self.tokens[i]), int(self.counts[i]), int(self.last_ends[i])) for i in order]


class Subset:
    """A compiled document filter of one index: a BitMap of document indexes, a bool mask
    (deleted documents already removed) and, per shard, the position runs of its selected
    documents (see `_kernels/corpus_query.py`). Build once per request, reuse for every query."""

    __slots__ = ("bitmap", "mask", "shard_live", "runs")

    def __init__(self, bitmap, mask: np.ndarray, shard_live: list[bool], runs: list[tuple[np.ndarray, np.ndarray]]):
        self.bitmap = bitmap
        self.mask = mask  # bool[n_documents]
        self.shard_live = shard_live  # per shard: does it hold a selected document?
        self.runs = runs  # per shard: (run_lo, run_hi) int64, shard-local positions

    def __len__(self):
        return int(self.mask.sum())

    def __repr__(self):
        return f"Subset({len(self)} documents)"


class CorpusIndex:
    """An opened corpus index (read-only, memory-mapped, safe to share across threads)."""

    def __init__(self, path: Path, snapshot: Snapshot):
        self.path = path
        self.snapshot = snapshot
        self.shards = snapshot.shards
        self.deleted = snapshot.deleted  # BitMap of deleted document indexes
        self._doc_info = None
        self._live = None
        self._root = None  # unrestricted CorpusMatch of the empty string (read-only arrays)

    # -- opening --------------------------------------------------------------------------
    @classmethod
    def open(cls, path, *, tokenizer=None, verify: bool = False) -> CorpusIndex:
        """Map the index at `path`, checking headers, sizes, the manifest, the document table and
        token ranges (all checksums too when `verify`; see `snapshot.py`); with `tokenizer`,
        also check it is the index's."""
        path = index_dir(path)
        index = cls(path, open_snapshot(path, verify=verify))
        if tokenizer is not None:
            index.check_tokenizer(tokenizer)
        return index

    @property
    def manifest(self) -> dict:
        """The meta block of the manifest this index was opened from (read it, do not change it)."""
        return self.snapshot.manifest.meta

    def verify(self) -> None:
        """Check every checksum of every file; raises IndexFormatError naming the damaged file."""
        self.snapshot.verify()

    def check_tokenizer(self, tokenizer) -> None:
        mine, theirs = self.tokenizer_info, tokenizer_info(tokenizer)
        if mine["fingerprint"] != theirs["fingerprint"]:
            raise TokenizerMismatchError(
                f"{self.path}: index built with tokenizer {mine['name']} (vocab {mine['vocab_size']}, fingerprint "
                f"{mine['fingerprint'][:16]}), but {theirs['name']} (vocab {theirs['vocab_size']}, fingerprint "
                f"{theirs['fingerprint'][:16]}) is in use")

    def close(self) -> None:
        """Drop references to the mapped files (the maps close once no array view remains)."""
        self.shards = []

    # -- sizes and documents ----------------------------------------------------------------
    @property
    def tokenizer_info(self) -> dict:
        return dict(self.manifest["tokenizer"])

    @property
    def format_version(self) -> int:
        return int(self.manifest["format_version"])

    @property
    def n_tokens(self) -> int:
        return int(self.manifest["n_tokens"])

    @property
    def n_documents(self) -> int:
        return int(self.manifest["n_documents"])

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    def __len__(self) -> int:
        return self.n_tokens

    @property
    def bytes_on_disk(self) -> int:
        return self.snapshot.bytes_on_disk

    def _docs(self):
        if self._doc_info is None:
            ids, tags = [], []
            for s in self.shards:
                info = s.doc_info()
                ids += info["ids"]
                tags += info["tags"]
            self._doc_info = (ids, tags)
        return self._doc_info

    @property
    def document_ids(self) -> list[str]:
        return self._docs()[0]

    @property
    def document_tags(self) -> list[dict]:
        return self._docs()[1]

    def document_span(self, doc: int) -> tuple[int, int]:
        """(first position, one past the last) of document index `doc`."""
        doc = int(doc)
        if not 0 <= doc < self.n_documents:
            raise BadInputError(f"doc: expected a document index in [0, {self.n_documents - 1}], got {doc}")
        for s in self.shards:
            if doc < s.doc_base + s.n_documents:
                ds = s.fa.doc_starts
                i = doc - s.doc_base
                stop = int(ds[i + 1]) if i + 1 < ds.shape[0] else s.n_tokens
                return s.token_base + int(ds[i]), s.token_base + stop
        raise InternalError("position or document out of the index's range")

    def document_tokens(self, doc: int) -> np.ndarray:
        lo, hi = self.document_span(doc)
        s = self._shard_of_position(lo)
        return np.array(s.fa.tokens[lo - s.token_base : hi - s.token_base], np.int32)

    def iter_documents(self, include_deleted: bool = False) -> Iterator[Document]:
        ids, tags = self._docs()
        for s in self.shards:
            ds = np.append(np.asarray(s.fa.doc_starts), s.n_tokens)
            for i in range(s.n_documents):
                d = s.doc_base + i
                if include_deleted or d not in self.deleted:
                    yield Document(np.array(s.fa.tokens[ds[i] : ds[i + 1]], np.int32), ids[d], dict(tags[d]))

    # -- subsets ------------------------------------------------------------------------------
    def find_documents(self, *, tags: dict | None = None, ids: Iterable[str] | None = None):
        """BitMap of the documents carrying all `tags` (key -> value) and, if given, named in `ids`."""
        from pyroaring import BitMap

        all_ids, all_tags = self._docs()
        want_ids = set(map(str, ids)) if ids is not None else None
        tags = {str(k): str(v) for k, v in (tags or {}).items()}
        return BitMap(i for i in range(self.n_documents)
                      if (want_ids is None or all_ids[i] in want_ids)
                      and all(all_tags[i].get(k) == v for k, v in tags.items()))

    def select_documents(self, documents=None, *, ids: Iterable[str] | None = None, tags: dict | None = None):
        """BitMap of document indexes chosen by `documents` (ints or a BitMap) and/or `ids` and
        `tags`, all of which must hold (deleted documents included). Strict, for destructive
        use: an index out of range, an unknown id, ids/tags selecting nothing or no selector at
        all raise BadInputError."""
        from pyroaring import BitMap

        if documents is None and ids is None and tags is None:
            raise BadInputError("select: expected document indexes, ids or tags; got none")
        bm = None
        if documents is not None:
            try:
                bm = BitMap(int(d) for d in documents) if not isinstance(documents, BitMap) else BitMap(documents)
            except (TypeError, ValueError, OverflowError):
                raise BadInputError(f"documents: expected document indexes in [0, {self.n_documents - 1}]") from None
            if len(bm) and bm.max() >= self.n_documents:
                raise BadInputError(f"documents: expected indexes in [0, {self.n_documents - 1}], got {bm.max()}")
        if ids is not None:
            ids = [str(i) for i in ids]
            known = set(self.document_ids)
            unknown = [i for i in ids if i not in known]
            if unknown:
                shown = ", ".join(repr(i) for i in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
                raise BadInputError(f"{self.path}: no document with id {shown}")
        if ids is not None or tags is not None:
            found = self.find_documents(tags=tags, ids=ids)
            bm = found if bm is None else bm & found
            if not len(bm):
                what = [f"{k}={v}" for k, v in (tags or {}).items()] + ([f"{len(ids)} given id(s)"] if ids is not None else [])
                raise BadInputError(f"{self.path}: no document matches {' and '.join(what)}")
        return bm

    def subset(self, documents=None, *, tags: dict | None = None, ids: Iterable[str] | None = None) -> Subset:
        """Compile a filter: document indexes (a BitMap or ints), and/or tags / document ids."""
        from pyroaring import BitMap

        bm = None
        if documents is not None:
            try:
                bm = BitMap(documents) if isinstance(documents, BitMap) else BitMap(int(d) for d in documents)
            except (TypeError, ValueError, OverflowError):
                raise BadInputError(f"documents: expected document indexes in [0, {self.n_documents - 1}]") from None
        if tags is not None or ids is not None:
            found = self.find_documents(tags=tags, ids=ids)
            bm = found if bm is None else bm & found
        if bm is None:
            bm = BitMap(range(self.n_documents))
        mask = np.zeros(self.n_documents, np.bool_)
        arr = np.asarray(bm.to_array(), np.int64)
        if arr.size and (arr[0] < 0 or arr[-1] >= self.n_documents):
            raise BadInputError(f"documents: expected indexes in [0, {self.n_documents - 1}]")
        mask[arr] = True
        if len(self.deleted):
            mask[np.asarray(self.deleted.to_array(), np.int64)] = False
        live, runs = [], []
        for s in self.shards:
            sel = mask[s.doc_base : s.doc_base + s.n_documents]
            live.append(bool(sel.any()))
            runs.append(cqk.selected_runs(s.fa.doc_starts, s.n_tokens, sel))
        return Subset(bm, mask, live, runs)

    def _mask(self, subset):
        if subset is None:
            if not len(self.deleted):
                return None
            if self._live is None:
                self._live = self.subset()
            return self._live
        if isinstance(subset, Subset):
            if subset.mask.shape[0] != self.n_documents:
                raise BadInputError("subset: compiled for another index")
            return subset
        return self.subset(subset)

    # -- queries ------------------------------------------------------------------------------
    def _shard_match(self, s: Shard, toks, sub, k: int):
        """(state, length, exact) of the longest suffix of `toks` in the shard's (selected)
        documents; not `exact` when a restricted walk hit its work cap (see subset_match)."""
        fa = s.fa
        if sub is not None and not sub.shard_live[s.number]:
            return 0, 0, True  # no selected document in this shard
        st, ln = fk.advance(fa.offsets, fa.etok, fa.eto, fa.links, fa.lens, fa.tokens, fa.plink, 0, 0, toks)
        if st == fk.CORRUPT:
            s.corrupt("while matching")
        exact = True
        if sub is not None and st != 0:
            run_lo, run_hi = sub.runs[s.number]
            occ, occ_start = s.layout()
            st, ln, exact = cqk.subset_match(fa.links, fa.lens, fa.plink, occ, occ_start, fa.counts, fa.count_escapes, run_lo, run_hi, st,
                                             ln, k)
            if st == fk.CORRUPT:
                s.corrupt("while matching in a subset")
        return int(st), int(ln), bool(exact)

    def match_length(self, context, subset=None, *, k: int = DEFAULT_K) -> int:
        """Length of the longest suffix of `context` that occurs in the (selected) documents
        (restricted: a lower bound when the walk hits its work cap, see `query`)."""
        toks = as_tokens(context, "context")
        sub = self._mask(subset)
        check_k(k)
        return max(self._shard_match(s, toks, sub, k)[1] for s in self.shards)

    def query(self, context, subset=None, *, k: int = DEFAULT_K) -> CorpusMatch:
        """The longest suffix of `context` occurring in the (selected) documents, its count and
        continuations. Restricted, the work is O(k) positions per shard: counts and
        continuations come from at most k sampled positions of the matched string (all of them
        when it occurs at most k times in a shard), and the walk to the longest suffix reads
        O(k) positions (see `_kernels.corpus_query.subset_match`); `estimated` says either fell short."""
        toks = as_tokens(context, "context")
        sub = self._mask(subset)
        check_k(k)
        found = [self._shard_match(s, toks, sub, k) for s in self.shards]
        length = max(ln for _, ln, _ in found)
        walk_exact = all(ex for _, _, ex in found)
        hits = [(s, st) for s, (st, ln, _) in zip(self.shards, found) if ln == length]
        if length == 0:
            if sub is None:  # the empty string: every token follows it; computed once
                if self._root is None:
                    self._root = self._combine(0, [(s, 0) for s in self.shards], None, k)
                    for a in (self._root.tokens, self._root.counts, self._root.last_ends):
                        a.flags.writeable = False
                return self._root
            hits = [(s, 0) for s in self.shards if sub.shard_live[s.number]]
        m = self._combine(length, hits, sub, k)
        if not walk_exact:
            m.estimated = True
        return m

    def lookup(self, pattern, subset=None, *, k: int = DEFAULT_K) -> CorpusMatch:
        """Count and continuations of exactly `pattern` (count 0 if it does not occur)."""
        toks = as_tokens(pattern, "pattern")
        sub = self._mask(subset)
        check_k(k)
        hits = []
        for s in self.shards:
            st = int(fk.locate(s.fa.offsets, s.fa.etok, s.fa.eto, s.fa.tokens, s.fa.plink, toks))
            if st == fk.CORRUPT:
                s.corrupt("while locating")
            if st >= 0 and (sub is None or sub.shard_live[s.number]):
                hits.append((s, st))
        return self._combine(int(toks.shape[0]), hits, sub, k)

    def count(self, pattern, subset=None, *, k: int = DEFAULT_K) -> int:
        """End positions of `pattern` in the (selected) documents; exact unrestricted, and
        restricted when at most `k` per shard, else an estimate (see `lookup().estimated`)."""
        return self.lookup(pattern, subset, k=k).count

    def continuations(self, pattern, subset=None, *, k: int = DEFAULT_K) -> dict[int, tuple[int, int]]:
        return self.lookup(pattern, subset, k=k).as_dict()

    def _combine(self, length, hits, sub, k) -> CorpusMatch:
        check_k(k)
        total, estimated = 0, False
        tok_parts, cnt_parts, end_parts = [], [], []
        for s, st in hits:
            fa = s.fa
            if sub is None:
                if not 0 <= st < fa.n_states:
                    s.corrupt("state out of range")
                total += fa.count_at(st)
                toks, dsts, ok = fk.out_edges(fa.offsets, fa.etok, fa.eto, fa.tokens, fa.plink, st)
                if not ok:
                    s.corrupt(f"edges of state {st}")
                cnts, lasts = fk.target_values(fa.counts, fa.count_escapes, fa.lasts, fa.n_states, dsts)
                tok_parts.append(toks)
                cnt_parts.append(cnts)
                end_parts.append(lasts + s.token_base)
                continue
            run_lo, run_hi = sub.runs[s.number]
            occ, occ_start = s.layout()
            h, sampled, ntoks, nends, ok = cqk.subset_sample(occ, occ_start, fa.counts, fa.count_escapes, fa.doc_starts, fa.tokens,
                                                            run_lo, run_hi, st, k)
            if not ok:
                s.corrupt("while sampling in a subset")
            c = fa.count_at(st)
            if st == 0:  # the empty string: exact from document lengths
                total += self._subset_tokens(s, sub)
            else:
                total += h if sampled == c else int(round(h * c / max(sampled, 1)))
            if sampled != c:
                estimated = True
            if ntoks.shape[0] == 0:
                continue
            order = np.argsort(ntoks, kind="stable")
            uniq, cnt, last = cqk.merge_sorted(ntoks[order], np.ones(ntoks.shape[0], np.int64), nends[order])
            if sampled != c:
                cnt = np.maximum(1, np.rint(cnt * (c / sampled))).astype(np.int64)
            tok_parts.append(uniq)
            cnt_parts.append(cnt)
            end_parts.append(last + s.token_base)
        if sub is not None and any(s.fa.count_at(st) > k for s, st in hits if st != 0):
            estimated = True
        if not tok_parts:
            e = np.empty(0, np.int64)
            return CorpusMatch(length, total, estimated, np.empty(0, np.int32), e, e.copy())
        toks = np.concatenate(tok_parts)
        cnts = np.concatenate(cnt_parts)
        ends = np.concatenate(end_parts)
        if len(tok_parts) > 1:
            order = np.argsort(toks, kind="stable")  # radix sort of int32
            toks, cnts, ends = cqk.merge_sorted(toks[order], cnts[order], ends[order])
        return CorpusMatch(length, total, estimated, toks.astype(np.int32), cnts, ends)

    def _subset_tokens(self, s: Shard, sub: Subset) -> int:
        lens = cqk.doc_lengths(s.fa.doc_starts, s.n_tokens)
        return int(lens[sub.mask[s.doc_base : s.doc_base + s.n_documents]].sum())

    def _shard_of_position(self, pos: int) -> Shard:
        for s in self.shards:
            if pos < s.token_base + s.n_tokens:
                return s
        raise InternalError("position or document out of the index's range")

    def following(self, end: int, n: int) -> np.ndarray:
        """Up to `n` tokens after global position `end`, stopping at the end of its document."""
        end = int(end)
        if not 0 <= end < self.n_tokens:
            raise BadInputError(f"end: expected a position in [0, {self.n_tokens - 1}], got {end}")
        s = self._shard_of_position(end)
        return s.fa.following(end - s.token_base, n)

    def document_of(self, pos: int) -> int:
        """Document index holding global position `pos`."""
        pos = int(pos)
        if not 0 <= pos < self.n_tokens:
            raise BadInputError(f"pos: expected a position in [0, {self.n_tokens - 1}], got {pos}")
        s = self._shard_of_position(pos)
        return s.doc_base + int(np.searchsorted(s.fa.doc_starts, int(pos) - s.token_base, side="right")) - 1

    def info(self) -> dict:
        return {"path": str(self.path), "format_version": self.format_version, "tokenizer": self.tokenizer_info,
                "n_tokens": self.n_tokens, "n_documents": self.n_documents, "n_shards": self.n_shards,
                "n_deleted": len(self.deleted), "bytes_on_disk": self.bytes_on_disk,
                "bytes_per_token": round(self.bytes_on_disk / max(self.n_tokens, 1), 2),
                "n_states": sum(s.fa.n_stored + s.n_implicit for s in self.shards),
                "n_implicit": sum(s.n_implicit for s in self.shards), "n_edges": sum(s.fa.n_edges for s in self.shards)}

    def __repr__(self):
        return f"CorpusIndex({str(self.path)!r}, tokens={self.n_tokens}, documents={self.n_documents}, shards={self.n_shards})"


def index_dir(path) -> Path:
    """`path` as a Path, checked to be a directory (an IndexFormatError saying what it is otherwise)."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise IndexFormatError(f"{path}: no such index") from None
    except OSError as exc:
        what = "a symlink loop" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise IndexFormatError(f"{path}: cannot open the index ({what})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise IndexFormatError(f"{path}: not a suffixspec index (expected a directory holding {MANIFEST})")
    return path


def check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise BadInputError(f"k: expected a positive sample size, got {k!r}")
