"""Retrieval corpus index: many documents, frozen into shards, persisted, memory-mapped, filtered.

Terms
-----
- *document*: a token sequence with a name (`id`, a string) and optional tags (`repo=click`).
  A match never spans two documents. Documents are numbered 0..n_documents-1 in build order
  (the *document index*, what bitmaps hold); empty documents are skipped at build time.
- *position*: an index into the concatenation of all documents of the index, over all shards
  in order (shard s covers positions token_base[s] .. token_base[s] + n_tokens[s] - 1). The
  *end position* of an occurrence is the position of its last token, as in `draft/automaton.py`.
- *shard*: a `FrozenAutomaton` over a bounded number of tokens; restricted queries also read its
  occurrence layout, which a reader computes once per shard (see `_kernels/corpus_build.py`).
- *subset*: a `Subset` (compiled from a pyroaring `BitMap` of document indexes or from tags)
  restricting a query to some documents (see query.py for when counts are estimates).
- *deleted* documents (a bitmap stored with the index) are excluded from every result until
  `merge_indexes` compacts them away; `delete_documents` (and `suffixspec delete`) marks them.

On disk an index is a directory::

    INDEX/manifest.ssx          tokenizer, counts, shard list (the commit point of every change)
    INDEX/shard-00000.ssx       one per shard: automaton arrays, text, document table
    INDEX/deleted-XXXXXXXX.ssx  optional: serialized BitMap of deleted document indexes
    INDEX/lock                  the writers' lock file (created by the first change)

Modules, in the order data flows: `documents` (input files -> Documents), `shards` (Documents ->
shard files), `format` (the container format every file uses, checksums), `manifest` (the commit
point), `lock` (one writer at a time, cleaning up after dead ones), `build` (build / append /
delete / merge), `snapshot` (opening and checking one consistent manifest snapshot), `query`
(CorpusIndex and its queries). This package re-exports the public names.
"""

from .build import (
    DEFAULT_SHARD_TOKENS,
    DeleteReport,
    IndexWriteError,
    append_documents,
    build_index,
    delete_documents,
    delete_selected,
    merge_indexes,
)
from .documents import IGNORED_DIRS, JSONL_SUFFIXES, BuildStats, Document, ReadStats, list_input_files, read_documents
from .format import ALIGN, FORMAT_VERSION, KIND_DELETED, KIND_MANIFEST, KIND_SHARD, MAGIC, MANIFEST
from .lock import IndexLockedError
from .query import DEFAULT_K, CorpusIndex, CorpusMatch, Subset

__all__ = [
    "CorpusIndex", "CorpusMatch", "Document", "Subset", "BuildStats",
    "build_index", "append_documents", "delete_documents", "merge_indexes", "read_documents",
    "FORMAT_VERSION", "DEFAULT_K", "DEFAULT_SHARD_TOKENS",
    "ReadStats", "list_input_files", "IGNORED_DIRS", "JSONL_SUFFIXES", "MAGIC", "MANIFEST", "ALIGN",
    "KIND_MANIFEST", "KIND_SHARD", "KIND_DELETED",
    "IndexLockedError", "IndexWriteError", "DeleteReport", "delete_selected",
]
