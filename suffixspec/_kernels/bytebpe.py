r"""Byte-level BPE over ASCII text: the GPT-2 split and the merges, in one pass (bytebpe.py's kernels).

Contract. `encode_documents` tokenizes documents given as UTF-8 bytes exactly as a `tokenizers`
pipeline [Digits(individual_digits) when `split_digits`] + ByteLevel(use_regex, no prefix space) +
BPE (no dropout, merges not ignored) does, for every ASCII stretch between *safe boundaries*: byte
positions where the GPT-2 split of the whole text equals the split of the text before them followed
by the split of the text after them (`_safe`). A stretch holding a non-ASCII byte (an *island*, from
the safe boundary before it to the one after it), and every document flagged `whole`, is left to the
caller (it records where the island's tokens go); the caller encodes islands with the library.

ASCII classes (`CLS_*`, from `ascii_classes`): whitespace is \t \n \v \f \r and space (onig's \s),
letters A-Z a-z (\p{L}), digits 0-9 (\p{N}, char::is_numeric), every other byte is "other".
BPE (`_bpe`): the symbols start as the byte alphabet's ids (a byte the vocabulary lacks gives none,
as in the library); the pair of lowest merge rank is merged
first, the leftmost of equal ranks, until no adjacent pair has a merge: the library's heap order
(rank, then position), with stale heap entries skipped the same way. Merges are an open-addressing
table keyed by (left id << 32 | right id). Words of 2..CACHE_MAX_WORD bytes are cached (bytes ->
ids) in arrays the caller owns; a full cache stops taking entries (results never depend on it).
"""

import numpy as np
from numba import njit

CLS_SPACE, CLS_LETTER, CLS_DIGIT, CLS_OTHER = 0, 1, 2, 3
CACHE_MAX_WORD = 48
# cache slot columns (int64[slots, SLOT_COLS]); an empty slot has S_KOFF -1
S_HASH, S_KOFF, S_KLEN, S_VOFF, S_VLEN = 0, 1, 2, 3, 4
SLOT_COLS = 5
# cache meta (int64[META_COLS]): entries, key bytes used, value ids used
M_ENTRIES, M_KEYS, M_VALS = 0, 1, 2
META_COLS = 3
# island rows (int64[k, ISLAND_COLS]): document, byte start, byte end, token position in `out`
I_DOC, I_START, I_END, I_OUT = 0, 1, 2, 3
ISLAND_COLS = 4
APOS = 39  # '


def ascii_classes() -> np.ndarray:
    """uint8[128]: the class of every ASCII byte."""
    cls = np.full(128, CLS_OTHER, np.uint8)
    cls[[9, 10, 11, 12, 13, 32]] = CLS_SPACE
    cls[ord("A"):ord("Z") + 1] = CLS_LETTER
    cls[ord("a"):ord("z") + 1] = CLS_LETTER
    cls[ord("0"):ord("9") + 1] = CLS_DIGIT
    return cls


@njit(cache=True, inline="always")
def _mix(key, mask):
    h = np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)
    return np.int64((h >> np.uint64(29)) & np.uint64(mask))


def merge_table(pairs: np.ndarray, ranks: np.ndarray, new_ids: np.ndarray):
    """(keys int64, ranks int32, new ids int32) of an open-addressing table of the merges
    (pairs int64[m, 2]); a pair given twice keeps its last row, as the library's map does."""
    size = 64
    while size < 2 * max(len(pairs), 1):
        size *= 2
    keys = np.full(size, -1, np.int64)
    r = np.zeros(size, np.int32)
    t = np.zeros(size, np.int32)
    _fill_merges(pairs.astype(np.int64), ranks.astype(np.int32), new_ids.astype(np.int32), keys, r, t)
    return keys, r, t


@njit(cache=True)
def _fill_merges(pairs, ranks, new_ids, keys, r, t):
    mask = keys.shape[0] - 1
    for k in range(pairs.shape[0]):
        key = (pairs[k, 0] << 32) | pairs[k, 1]
        i = _mix(key, mask)
        while keys[i] != -1 and keys[i] != key:
            i = (i + 1) & mask
        keys[i] = key
        r[i] = ranks[k]
        t[i] = new_ids[k]


@njit(cache=True, inline="always")
def _merge_slot(mkeys, a, b):
    """Slot of the merge (a, b) in the table, -1 when there is none."""
    key = (np.int64(a) << 32) | np.int64(b)
    mask = mkeys.shape[0] - 1
    i = _mix(key, mask)
    while True:
        k = mkeys[i]
        if k == key:
            return i
        if k == -1:
            return -1
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _heap_push(heap, size, key):
    i = size
    heap[i] = key
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= key:
            break
        heap[i] = heap[parent]
        heap[parent] = key
        i = parent
    return size + 1


@njit(cache=True, inline="always")
def _heap_pop(heap, size):
    """The smallest key, and the heap's new size."""
    top = heap[0]
    size -= 1
    last = heap[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and heap[c + 1] < heap[c]:
            c += 1
        if heap[c] >= last:
            break
        heap[i] = heap[c]
        i = c
    if size > 0:
        heap[i] = last
    return top, size


@njit(cache=True)
def _bpe(data, a, b, byte_ids, mkeys, mranks, mnew, out, o):
    """The ids of the word data[a:b] written at out[o:]; returns the end in `out`."""
    sym = np.empty(b - a, np.int32)
    n = 0
    for i in range(a, b):  # a byte outside the vocabulary gives no symbol (the library drops it)
        t = byte_ids[data[i]]
        if t >= 0:
            sym[n] = t
            n += 1
    if n == 0:
        return o
    nxt = np.empty(n, np.int32)
    prv = np.empty(n, np.int32)
    heap = np.empty(3 * n, np.int64)
    size = 0
    for i in range(n):
        nxt[i] = i + 1 if i + 1 < n else -1
        prv[i] = i - 1
    for i in range(n - 1):
        s = _merge_slot(mkeys, sym[i], sym[i + 1])
        if s >= 0:
            size = _heap_push(heap, size, (np.int64(mranks[s]) << 32) | i)
    while size > 0:
        key, size = _heap_pop(heap, size)
        rank = key >> 32
        pos = key & 0xFFFFFFFF
        if sym[pos] < 0:
            continue
        nx = nxt[pos]
        if nx < 0:
            continue
        s = _merge_slot(mkeys, sym[pos], sym[nx])
        if s < 0 or mranks[s] != rank:  # a stale entry: the pair at pos changed since
            continue
        sym[pos] = mnew[s]
        sym[nx] = -1
        after = nxt[nx]
        nxt[pos] = after
        if after >= 0:
            prv[after] = pos
        p = prv[pos]
        if p >= 0:
            s = _merge_slot(mkeys, sym[p], sym[pos])
            if s >= 0:
                size = _heap_push(heap, size, (np.int64(mranks[s]) << 32) | p)
        if after >= 0:
            s = _merge_slot(mkeys, sym[pos], sym[after])
            if s >= 0:
                size = _heap_push(heap, size, (np.int64(mranks[s]) << 32) | pos)
    i = 0
    while i >= 0:
        out[o] = sym[i]
        o += 1
        i = nxt[i]
    return o


@njit(cache=True, inline="always")
def _word_hash(data, a, b):
    h = np.uint64(14695981039346656037)
    for i in range(a, b):
        h = (h ^ np.uint64(data[i])) * np.uint64(1099511628211)
    return h


@njit(cache=True)
def _encode_word(data, a, b, byte_ids, mkeys, mranks, mnew, slots, ckeys, cvals, cmeta, out, o):
    """The ids of the pretoken data[a:b] at out[o:], through the cache; returns the end in `out`."""
    n = b - a
    if n == 1:
        t = byte_ids[data[a]]
        if t < 0:
            return o
        out[o] = t
        return o + 1
    if n > CACHE_MAX_WORD:
        return _bpe(data, a, b, byte_ids, mkeys, mranks, mnew, out, o)
    h = _word_hash(data, a, b)
    mask = slots.shape[0] - 1
    i = np.int64((h ^ (h >> np.uint64(31))) & np.uint64(mask))
    hs = np.int64(h)
    while slots[i, S_KOFF] >= 0:
        if slots[i, S_HASH] == hs and slots[i, S_KLEN] == n:
            k = slots[i, S_KOFF]
            same = True
            for j in range(n):
                if ckeys[k + j] != data[a + j]:
                    same = False
                    break
            if same:
                v = slots[i, S_VOFF]
                for j in range(slots[i, S_VLEN]):
                    out[o + j] = cvals[v + j]
                return o + slots[i, S_VLEN]
        i = (i + 1) & mask
    end = _bpe(data, a, b, byte_ids, mkeys, mranks, mnew, out, o)
    # keep it when there is room (the table at most half full, both arenas with space)
    if (2 * (cmeta[M_ENTRIES] + 1) <= slots.shape[0] and cmeta[M_KEYS] + n <= ckeys.shape[0]
            and cmeta[M_VALS] + (end - o) <= cvals.shape[0]):
        k = cmeta[M_KEYS]
        v = cmeta[M_VALS]
        for j in range(n):
            ckeys[k + j] = data[a + j]
        for j in range(end - o):
            cvals[v + j] = out[o + j]
        slots[i, S_HASH] = hs
        slots[i, S_KOFF] = k
        slots[i, S_KLEN] = n
        slots[i, S_VOFF] = v
        slots[i, S_VLEN] = end - o
        cmeta[M_ENTRIES] += 1
        cmeta[M_KEYS] = k + n
        cmeta[M_VALS] = v + (end - o)
    return end


@njit(cache=True, inline="always")
def _run(data, i, b, cls, want):
    while i < b and cls[data[i]] == want:
        i += 1
    return i


@njit(cache=True, inline="always")
def _contraction(data, i, b):
    """Length of the contraction ('s 't 're 've 'm 'll 'd) at i, 0 when none."""
    if data[i] != APOS or i + 1 >= b:
        return 0
    c = data[i + 1]
    if c == 115 or c == 116 or c == 109 or c == 100:  # s t m d
        return 2
    if i + 2 < b:
        d = data[i + 2]
        if (c == 114 and d == 101) or (c == 118 and d == 101) or (c == 108 and d == 108):  # re ve ll
            return 3
    return 0


@njit(cache=True, inline="always")
def _pretoken_end(data, i, b, cls, split_digits):
    """End of the GPT-2 pretoken starting at i in the ASCII stretch data[i:b] (b: the end of a
    stretch that ends at a safe boundary; with `split_digits`, every digit is a piece of its own)."""
    c = data[i]
    k = cls[c]
    if k == CLS_DIGIT:
        return i + 1 if split_digits else _run(data, i + 1, b, cls, CLS_DIGIT)
    n = _contraction(data, i, b)
    if n:
        return i + n
    if k == CLS_LETTER or k == CLS_OTHER:
        return _run(data, i + 1, b, cls, k)
    # whitespace
    if c == 32 and i + 1 < b:
        k1 = cls[data[i + 1]]
        if k1 == CLS_LETTER or k1 == CLS_OTHER or (k1 == CLS_DIGIT and not split_digits):
            return _run(data, i + 2, b, cls, k1)
    r = _run(data, i + 1, b, cls, CLS_SPACE)
    if r == b or (split_digits and cls[data[r]] == CLS_DIGIT):
        return r  # \s+(?!\S) to the end of the piece
    return r - 1 if r - i >= 2 else r  # \s+(?!\S) leaving one before the next \S, else \s+


@njit(cache=True, inline="always")
def _printable(c):
    return 33 <= c <= 126


@njit(cache=True, inline="always")
def _safe(data, ds, de, p, cls):
    """Whether byte position p (ds < p < de) of the document data[ds:de] is a safe boundary:
    (a) a newline between two printable ASCII bytes (or at the document start before one), or
    (b) a space after a space or newline and before a printable ASCII byte other than a digit."""
    c = data[p]
    q = data[p - 1]
    if q == 10 and _printable(c):
        return p - 1 == ds or _printable(data[p - 2])
    if c == 32 and (q == 32 or q == 10) and p + 1 < de:
        d = data[p + 1]
        return _printable(d) and cls[d] != CLS_DIGIT
    return False


@njit(cache=True)
def _encode_stretch(data, a, b, cls, split_digits, byte_ids, mkeys, mranks, mnew, slots, ckeys, cvals, cmeta, out, o):
    i = a
    while i < b:
        j = _pretoken_end(data, i, b, cls, split_digits)
        o = _encode_word(data, i, j, byte_ids, mkeys, mranks, mnew, slots, ckeys, cvals, cmeta, out, o)
        i = j
    return o


@njit(cache=True)
def encode_documents(data, starts, whole, cls, split_digits, byte_ids, mkeys, mranks, mnew, slots, ckeys, cvals, cmeta,
                     out, out_starts, islands):
    """Token ids of the documents data[starts[d]:starts[d + 1]] into `out` (int32, room for one id
    per byte), document d's at out[out_starts[d]:out_starts[d + 1]], less the islands: rows of
    `islands` (room for one per non-ASCII byte plus one per document) say which bytes the caller
    encodes and where their tokens go. Returns the number of islands."""
    n_docs = starts.shape[0] - 1
    o = 0
    k = 0
    for d in range(n_docs):
        ds = starts[d]
        de = starts[d + 1]
        out_starts[d] = o
        if whole[d]:
            islands[k, I_DOC], islands[k, I_START], islands[k, I_END], islands[k, I_OUT] = d, ds, de, o
            k += 1
            continue
        pos = ds
        i = ds
        while i < de:
            if data[i] < 128:
                i += 1
                continue
            s = i
            while s > pos and not _safe(data, ds, de, s, cls):
                s -= 1
            e = i + 1
            while e < de and not (data[e] < 128 and data[e - 1] < 128 and _safe(data, ds, de, e, cls)):
                e += 1
            o = _encode_stretch(data, pos, s, cls, split_digits, byte_ids, mkeys, mranks, mnew, slots, ckeys, cvals, cmeta,
                                out, o)
            islands[k, I_DOC], islands[k, I_START], islands[k, I_END], islands[k, I_OUT] = d, s, e, o
            k += 1
            pos = e
            i = e
        o = _encode_stretch(data, pos, de, cls, split_digits, byte_ids, mkeys, mranks, mnew, slots, ckeys, cvals, cmeta,
                            out, o)
    out_starts[n_docs] = o
    return k
