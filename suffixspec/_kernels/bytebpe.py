r"""Byte-level BPE over ASCII text: the GPT-2 split and the merges, in one pass (tokenizer/bytebpe.py's kernels).

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
ids; short keys and results inline in a 32-byte slot) in arrays the caller owns (`SLOT_COLS`); a
full cache stops taking entries (results never depend on it).
"""

import numpy as np
from numba import njit

CLS_SPACE, CLS_LETTER, CLS_DIGIT, CLS_OTHER = 0, 1, 2, 3
CACHE_MAX_WORD = 48
INLINE_KEY = 16
CACHE_LOAD_NUM, CACHE_LOAD_DEN = 3, 5
# cache slot columns (int64[slots, SLOT_COLS], 32 bytes a slot, all zero when empty): the key's first
# and next 8 bytes when it has at most INLINE_KEY bytes, else its hash and its offset in the key
# arena; up to two ids packed; META = key length | id count << 8 | offset of the ids in the value
# arena (more than two) << 16
C_K0, C_K1, C_IDS, C_META = 0, 1, 2, 3
SLOT_COLS = 4
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
def _word_key(data, a, b):
    """(first 8 bytes, next 8 bytes, hash) of the word data[a:b]: the bytes packed little-endian
    when it has at most INLINE_KEY bytes (then they are its key), else an FNV-1a hash of all."""
    n = b - a
    if n <= INLINE_KEY:
        w0 = np.uint64(0)
        w1 = np.uint64(0)
        for j in range(min(n, 8)):
            w0 |= np.uint64(data[a + j]) << np.uint64(8 * j)
        for j in range(8, n):
            w1 |= np.uint64(data[a + j]) << np.uint64(8 * (j - 8))
        h = w0 * np.uint64(0x9E3779B97F4A7C15) + w1 * np.uint64(0xC2B2AE3D27D4EB4F) + np.uint64(n)
        h = (h ^ (h >> np.uint64(32))) * np.uint64(0xD6E8FEB86659FD93)
        return np.int64(w0), np.int64(w1), h ^ (h >> np.uint64(32))
    h = np.uint64(14695981039346656037)
    for i in range(a, b):
        h = (h ^ np.uint64(data[i])) * np.uint64(1099511628211)
    return np.int64(h), np.int64(0), h ^ (h >> np.uint64(31))


@njit(cache=True, inline="always")
def _same_key(slots, i, data, a, n, k0, k1, ckeys):
    if (slots[i, C_META] & 0xFF) != n or slots[i, C_K0] != k0:
        return False
    if n <= INLINE_KEY:
        return slots[i, C_K1] == k1
    k = slots[i, C_K1]
    for j in range(n):
        if ckeys[k + j] != data[a + j]:
            return False
    return True


@njit(cache=True)
def _miss(data, a, b, k0, k1, i, byte_ids, mkeys, mranks, mnew, slots, ckeys, cvals, cmeta, out, o):
    """The ids of the pretoken data[a:b] (key k0, k1; not cached, its empty slot i) at out[o:] by
    BPE, kept in the cache when there is room; returns the end in `out`."""
    n = b - a
    end = _bpe(data, a, b, byte_ids, mkeys, mranks, mnew, out, o)
    m = end - o
    # kept when there is room: the table at most CACHE_LOAD full, the arenas with space
    if (cmeta[M_ENTRIES] + 1) * CACHE_LOAD_DEN > slots.shape[0] * CACHE_LOAD_NUM:
        return end
    if (n > INLINE_KEY and cmeta[M_KEYS] + n > ckeys.shape[0]) or (m > 2 and cmeta[M_VALS] + m > cvals.shape[0]):
        return end
    k1s = k1
    if n > INLINE_KEY:
        k1s = cmeta[M_KEYS]
        for j in range(n):
            ckeys[k1s + j] = data[a + j]
        cmeta[M_KEYS] = k1s + n
    voff = 0
    ids = np.int64(0)
    if m <= 2:
        if m >= 1:
            ids = np.int64(np.uint32(out[o]))
        if m == 2:
            ids |= np.int64(out[o + 1]) << 32
    else:
        voff = cmeta[M_VALS]
        for j in range(m):
            cvals[voff + j] = out[o + j]
        cmeta[M_VALS] = voff + m
    slots[i, C_K0] = k0
    slots[i, C_K1] = k1s
    slots[i, C_IDS] = ids
    slots[i, C_META] = n | (m << 8) | (voff << 16)
    cmeta[M_ENTRIES] += 1
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
    """The ids of the ASCII stretch data[a:b] at out[o:], pretoken by pretoken through the cache
    (one flat loop: the hit path inline, a miss in `_miss`); returns the end in `out`."""
    mask = slots.shape[0] - 1
    i = a
    while i < b:
        j = _pretoken_end(data, i, b, cls, split_digits)
        n = j - i
        if n == 1:
            t = byte_ids[data[i]]
            if t >= 0:  # (a byte the vocabulary lacks gives nothing)
                out[o] = t
                o += 1
        elif n > CACHE_MAX_WORD:
            o = _bpe(data, i, j, byte_ids, mkeys, mranks, mnew, out, o)
        else:
            k0, k1, h = _word_key(data, i, j)
            s = np.int64(h & np.uint64(mask))
            hit = False
            while slots[s, C_META] != 0:
                if _same_key(slots, s, data, i, n, k0, k1, ckeys):
                    hit = True
                    break
                s = (s + 1) & mask
            if hit:
                meta = slots[s, C_META]
                m = (meta >> 8) & 0xFF
                if m <= 2:
                    ids = slots[s, C_IDS]
                    if m >= 1:
                        out[o] = np.int32(ids & 0xFFFFFFFF)
                    if m == 2:
                        out[o + 1] = np.int32(ids >> 32)
                else:
                    v = meta >> 16
                    for q in range(m):
                        out[o + q] = cvals[v + q]
                o += m
            else:
                o = _miss(data, i, j, k0, k1, s, byte_ids, mkeys, mranks, mnew, slots, ckeys, cvals, cmeta, out, o)
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
