"""Fast batch encoding for byte-level BPE tokenizers (GPT-2 style), the same ids as the library's.

Contract. `ByteLevelEncoder.of(tokenizer)` returns an encoder when the tokenizer's pipeline is one
the kernels (`_kernels/bytebpe.py`) implement -- no normalizer, pre-tokenizer ByteLevel(use_regex,
no prefix space) alone or after Digits(individual_digits), a BPE model without dropout, byte
fallback, ignored merges or subword affixes, no truncation or padding, a post-processor that adds
nothing without special tokens -- and None otherwise (the caller then uses the library).
`encode_batch(texts)` returns, for every text, the int32 ids the library's
`encode_batch(texts, add_special_tokens=False)` gives: ASCII stretches are tokenized by the
kernels; the stretches around non-ASCII characters (islands), texts holding an added token's
content and texts with lone surrogates (which the library refuses: so do we) go through the
library, in one call per batch. Threads: the kernels run in the caller's thread; the library's
call for the islands uses its own pool (`TOKENIZERS_PARALLELISM` governs it).
"""

from __future__ import annotations

import json
import re

import numpy as np

from .._kernels import bytebpe as bk

__all__ = ["ByteLevelEncoder"]

CACHE_SLOTS = 1 << 18
CACHE_KEY_BYTES = 1 << 22
CACHE_VALUE_IDS = 1 << 21
_TEMPLATE_SINGLE_A = [{"Sequence": {"id": "A", "type_id": 0}}]


def _byte_alphabet() -> list[str]:
    """The GPT-2 byte-level character of every byte value."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(0x100 + n)
            n += 1
    return [chars[b] for b in range(256)]


def _pipeline_digits(spec: dict) -> bool | None:
    """Whether the pipeline splits digits first (True), does not (False), or is not one the kernels
    implement (None)."""
    def byte_level(p):
        return (isinstance(p, dict) and p.get("type") == "ByteLevel" and p.get("use_regex", True) is True
                and not p.get("add_prefix_space", True))

    if spec.get("normalizer") is not None or spec.get("truncation") is not None or spec.get("padding") is not None:
        return None
    post = spec.get("post_processor")
    if post is not None and post.get("type") != "ByteLevel" and not (
            post.get("type") == "TemplateProcessing" and post.get("single") == _TEMPLATE_SINGLE_A):
        return None
    pre = spec.get("pre_tokenizer")
    if byte_level(pre):
        return False
    if isinstance(pre, dict) and pre.get("type") == "Sequence":
        steps = pre.get("pretokenizers") or []
        if (len(steps) == 2 and steps[0].get("type") == "Digits" and steps[0].get("individual_digits") is True
                and byte_level(steps[1])):
            return True
    return None


def _aligned_zeros(rows: int, cols: int) -> np.ndarray:
    """int64[rows, cols] of zeros starting on a 64-byte boundary (a 32-byte row in one cache line)."""
    buf = np.zeros(rows * cols + 8, np.int64)
    skip = (-buf.ctypes.data % 64) // 8
    return buf[skip:skip + rows * cols].reshape(rows, cols)


class ByteLevelEncoder:
    """Batch encoding of one byte-level BPE tokenizer (see the module docstring)."""

    def __init__(self, backend, split_digits: bool, byte_ids: np.ndarray, merges, added: list[str]):
        self.backend = backend
        self.split_digits = split_digits
        self.byte_ids = byte_ids
        self.mkeys, self.mranks, self.mnew = merges
        self.added = added
        # one scan of a text for any added token's content (not one `in` per added token)
        self.added_re = re.compile("|".join(re.escape(a) for a in sorted(added, key=len, reverse=True))) if added else None
        self.cls = bk.ascii_classes()
        self.slots = _aligned_zeros(CACHE_SLOTS, bk.SLOT_COLS)
        self.ckeys = np.empty(CACHE_KEY_BYTES, np.uint8)
        self.cvals = np.empty(CACHE_VALUE_IDS, np.int32)
        self.cmeta = np.zeros(bk.META_COLS, np.int64)

    @classmethod
    def of(cls, tokenizer) -> ByteLevelEncoder | None:
        """An encoder for `tokenizer` (a `Tokenizer`), or None when its pipeline is not one this implements."""
        backend = getattr(tokenizer, "backend", None)
        if backend is None:
            return None
        spec = json.loads(backend.to_str())
        split_digits = _pipeline_digits(spec)
        model = spec.get("model") or {}
        if split_digits is None or model.get("type") != "BPE" or model.get("dropout") is not None:
            return None
        if model.get("byte_fallback") or model.get("ignore_merges") or model.get("continuing_subword_prefix") or \
                model.get("end_of_word_suffix"):
            return None
        vocab = model.get("vocab") or {}
        alphabet = _byte_alphabet()
        byte_ids = np.array([vocab.get(c, -1) for c in alphabet], np.int32)  # -1: dropped, as the library does
        pairs, new_ids = [], []
        for m in model.get("merges") or []:
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            if a not in vocab or b not in vocab or a + b not in vocab:
                return None  # (the library refuses such a model)
            pairs.append((vocab[a], vocab[b]))
            new_ids.append(vocab[a + b])
        pairs = np.array(pairs, np.int64).reshape(-1, 2)
        merges = bk.merge_table(pairs, np.arange(len(pairs), dtype=np.int32), np.array(new_ids, np.int32))
        added = [t["content"] for t in spec.get("added_tokens") or [] if t.get("content")]
        return cls(backend, split_digits, byte_ids, merges, added)

    def encode_batch(self, texts) -> list[np.ndarray]:
        """int32 ids of every text, as the library's `encode_batch(texts, add_special_tokens=False)`."""
        texts = list(texts)
        bufs, whole = [], np.zeros(len(texts), np.bool_)
        for i, t in enumerate(texts):
            try:
                bufs.append(t.encode("utf-8"))
            except UnicodeEncodeError:  # lone surrogates: the library decides what they become
                bufs.append(b"")
                whole[i] = True
                continue
            if self.added_re is not None and self.added_re.search(t):
                whole[i] = True
        joined = b"".join(bufs)
        data = np.frombuffer(joined, np.uint8)
        starts = np.zeros(len(texts) + 1, np.int64)
        np.cumsum([len(b) for b in bufs], out=starts[1:])
        out = np.empty(max(len(joined), 1), np.int32)
        out_starts = np.empty(len(texts) + 1, np.int64)
        islands = np.empty((int(np.count_nonzero(data >= 128)) + len(texts), bk.ISLAND_COLS), np.int64)
        k = bk.encode_documents(data, starts, whole, self.cls, self.split_digits, self.byte_ids, self.mkeys, self.mranks,
                                self.mnew, self.slots, self.ckeys, self.cvals, self.cmeta, out, out_starts, islands)
        result = [out[out_starts[d]:out_starts[d + 1]] for d in range(len(texts))]
        if k:
            self._islands(texts, joined, whole, islands[:k], out, out_starts, result)
        return result

    def _islands(self, texts, joined, whole, islands, out, out_starts, result) -> None:
        """Encode the islands with the library and splice their ids into each document's."""
        strings = [texts[d] if whole[d] else joined[s:e].decode("utf-8") for d, s, e, _ in islands.tolist()]
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        ids = [np.asarray(e.ids, np.int32) for e in encode(strings, add_special_tokens=False)]
        at = 0
        while at < len(islands):
            d = int(islands[at, bk.I_DOC])
            parts, o = [], int(out_starts[d])
            while at < len(islands) and islands[at, bk.I_DOC] == d:
                parts += [out[o:islands[at, bk.I_OUT]], ids[at]]
                o = int(islands[at, bk.I_OUT])
                at += 1
            parts.append(out[o:out_starts[d + 1]])
            result[d] = np.concatenate(parts)
