"""`RecycleTable`: the recycled-prediction draft source — drafts text never written before, from
the target model's own past predictions.

Every verification pass computes the target's next-token logits at each position of every row's
tree. `harvest` keeps, for the token read at each position, the top-K tokens the model predicted
there (`next[token] -> K candidates`, the most recent pass winning), and the same under the pair of
the token and the one before it (a hashed table of `pair_slots` rows). `grow` merges these
candidates into a request's copy-source tree: one best-first tree over both
(`_kernels/recycle.py`), where a table entry's score is its parent's times the learned chance that
an entry of its rank, at its depth, from the pair table or the token's, with or without a copy
source agreeing, is accepted once its parent is. `learn` calibrates those chances from the rounds (decayed counts
with a prior). Verification is unchanged: recycled nodes are only more candidates, so greedy
output stays identical to plain decoding and sampling keeps its distribution.

`to_bytes`/`from_bytes` (and `save`/`load`) hold the table and its calibration in a checksummed
little-endian file bound to a model identity: nothing is unpickled, every field is checked, and a
damaged or foreign file raises `IndexFormatError` with one line saying what is wrong.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._kernels import recycle as rk
from ..errors import BadInputError, IndexFormatError
from ..fileio import atomic_write_bytes, read_regular
from .tree import DraftTree

__all__ = ["RecycleTable", "RecycledDraft", "DEFAULT_K"]

DEFAULT_K = 8
DEFAULT_PAIR_SLOTS = 1 << 17
DEFAULT_OFF_PATH = 8
DEPTH_BUCKETS = 4  # depths 1, 2, 3 and 4+

MAGIC = b"SSRECYC\0"
FORMAT_VERSION = 1
# magic, version, vocab, k, depth buckets, pair slots, identity (utf-8, NUL-padded), payload crc32,
# header crc32; then the payload: table int32[vocab, k], pairs int32[slots, k], pair keys int64[slots],
# hits and trials float64[buckets]
_HEADER = struct.Struct("<8sIIIII64sII")
MAX_PAIR_SLOTS = 1 << 22
MAX_VOCAB = 1 << 22
MAX_K = 64


@dataclass
class RecycledDraft:
    """A tree `grow` built, with each node's calibration bucket (`rk.NO_BUCKET`: a copy node no
    table entry proposed)."""

    tree: DraftTree
    buckets: np.ndarray  # int32[n]


def _prior(k: int) -> np.ndarray:
    """Acceptance assumed before any round: falling with rank, higher where a copy source agrees
    and for a pair's entries. Indexed [depth, rank, agree, pair] (`rk.bucket_of`)."""
    rank = np.arange(k, dtype=np.float64)
    prior = np.empty((DEPTH_BUCKETS, k, 2, 2))
    for pair, top in ((0, 0.25), (1, 0.4)):
        alone = top / (1.0 + 1.5 * rank)
        prior[:, :, 0, pair] = alone
        prior[:, :, 1, pair] = np.maximum(alone, (top + 0.2) / (1.0 + rank))
    return prior.reshape(-1)


class RecycleTable:
    """The table of one model and tokenizer (`vocab_size` rows of `k` candidates) and its
    calibration. `identity`: what the table belongs to (checked on `load`)."""

    def __init__(self, vocab_size: int, k: int = DEFAULT_K, *, identity: str = "", pair_slots: int = DEFAULT_PAIR_SLOTS,
                 decay: float = 0.995, prior: float = 4.0):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or not 0 < vocab_size <= MAX_VOCAB:
            raise BadInputError(f"vocab_size: expected an integer in [1, {MAX_VOCAB}], got {vocab_size!r}",
                                param="vocab_size")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 < k <= MAX_K:
            raise BadInputError(f"k: expected an integer in [1, {MAX_K}], got {k!r}", param="k")
        if (isinstance(pair_slots, bool) or not isinstance(pair_slots, (int, np.integer))
                or not 0 < pair_slots <= MAX_PAIR_SLOTS or pair_slots & (pair_slots - 1)):
            raise BadInputError(f"pair_slots: expected a power of two in [1, {MAX_PAIR_SLOTS}], got {pair_slots!r}",
                                param="pair_slots")
        if len(identity.encode()) > 64:
            raise BadInputError(f"identity: expected at most 64 bytes, got {len(identity.encode())}", param="identity")
        self.vocab_size, self.k, self.identity = int(vocab_size), int(k), identity
        self.decay, self.prior = float(decay), float(prior)
        self.off_path: int | None = DEFAULT_OFF_PATH  # nodes off the accepted path harvested per row (None: all)
        self.table = np.full((self.vocab_size, self.k), -1, np.int32)
        self.pairs = np.full((int(pair_slots), self.k), -1, np.int32)
        self.pair_keys = np.full(int(pair_slots), -1, np.int64)
        n = DEPTH_BUCKETS * self.k * 4
        self.hits = np.zeros(n)
        self.trials = np.zeros(n)
        self._prior = _prior(self.k)
        self._accept: np.ndarray | None = None

    # ---------------------------------------------------------------------------------- drafting

    def acceptance(self) -> np.ndarray:
        """float64[buckets]: the learned chance that an entry is accepted once its parent is."""
        if self._accept is None:
            self._accept = (self.hits + self.prior * self._prior) / (self.trials + self.prior)
        return self._accept

    def grow(self, tree: DraftTree, context, budget: int, max_depth: int) -> RecycledDraft:
        """`tree` (the copy sources' draft below the last token of `context`, the committed tokens)
        merged with recycled branches: the best `budget` nodes no deeper than `max_depth`."""
        budget, max_depth = max(0, int(budget)), max(0, int(max_depth))
        out = (np.empty(budget, np.int32), np.empty(budget, np.int32), np.empty(budget, np.int32),
               np.empty(budget, np.float64), np.empty(budget, np.int32))
        root = int(context[-1])
        prev = int(context[-2]) if len(context) > 1 else -1
        n = rk.grow(tree.tokens, tree.parents, tree.scores, prev, root, self.table, self.pairs, self.pair_keys,
                    self.acceptance(), DEPTH_BUCKETS, budget, max_depth, *out)
        tokens, parents, depths, scores, buckets = (a[:n] for a in out)
        return RecycledDraft(DraftTree.unchecked(tokens, parents, depths, scores), buckets)

    # ---------------------------------------------------------------------------------- learning

    def harvest(self, logits, keys_at: list[list[int]], prevs_at: list[list[int]], positions: list[list[int]]) -> int:
        """Keep the top-K of `logits` ([b, K', vocab], on its device) at each row's `positions`
        (indices into its dimension 1) under the tokens read there (`keys_at`) and the pairs of
        those with the tokens before them (`prevs_at`, -1: unknown); returns how many positions
        were kept. Only the [P, K] indices cross to the host."""
        import torch

        rows = [r for r, pos in enumerate(positions) for _ in pos]
        if not rows:
            return 0
        flat_pos = [p for pos in positions for p in pos]
        keys = np.fromiter((t for ks in keys_at for t in ks), np.int64, len(rows))
        prevs = np.fromiter((t for ps in prevs_at for t in ps), np.int64, len(rows))
        dev = logits.device
        picked = logits[torch.tensor(rows, device=dev), torch.tensor(flat_pos, device=dev)]
        k = min(self.k, picked.shape[-1])
        top = torch.topk(picked, k, dim=-1).indices.cpu().numpy().astype(np.int32)
        if k < self.k:
            top = np.concatenate([top, np.full((top.shape[0], self.k - k), -1, np.int32)], axis=1)
        rk.harvest(self.table, self.pairs, self.pair_keys, prevs, keys, top)
        return len(rows)

    def learn(self, drafted: RecycledDraft, verified: DraftTree, committed: list[int]) -> None:
        """One row's round: `verified` (a subset of `drafted.tree` closed under parents, what the
        pass checked) and the tokens it committed. Each table entry whose parent was reached is
        a trial of its bucket; it succeeds when its token was the one committed there."""
        buckets = _map_buckets(drafted, verified)
        tested, hit = [], []
        node, children = -1, _children(verified)
        for tok in committed:
            nxt = -1
            for c in children.get(node, ()):
                tested.append(buckets[c])
                if int(verified.tokens[c]) == tok:
                    hit.append(True)
                    nxt = c
                else:
                    hit.append(False)
            if nxt < 0:
                break
            node = nxt
        rk.observe(np.asarray(tested, np.int32), np.asarray(hit, np.bool_), self.hits, self.trials, self.decay)
        self._accept = None

    def to_dict(self) -> dict:
        """The learned acceptance by depth and rank, alone and agreeing with a copy source."""
        acc = self.acceptance().reshape(DEPTH_BUCKETS, self.k, 2, 2)
        return {"token": np.round(acc[:, :, 0, 0], 3).tolist(), "pair": np.round(acc[:, :, 0, 1], 3).tolist(),
                "token_agreed": np.round(acc[:, :, 1, 0], 3).tolist(),
                "pair_agreed": np.round(acc[:, :, 1, 1], 3).tolist(),
                "rows_seen": int((self.table[:, 0] >= 0).sum()), "pairs_seen": int((self.pair_keys >= 0).sum())}

    # ---------------------------------------------------------------------------------- the file

    def to_bytes(self) -> bytes:
        payload = b"".join(np.ascontiguousarray(a, dt).tobytes() for a, dt in (
            (self.table, "<i4"), (self.pairs, "<i4"), (self.pair_keys, "<i8"), (self.hits, "<f8"), (self.trials, "<f8")))
        head = _HEADER.pack(MAGIC, FORMAT_VERSION, self.vocab_size, self.k, DEPTH_BUCKETS, self.pairs.shape[0],
                            self.identity.encode(), zlib.crc32(payload), 0)
        head = head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))
        return head + payload

    def save(self, path) -> None:
        """Write atomically (a temporary in the same directory, fsynced, then renamed)."""
        atomic_write_bytes(Path(path), self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "recycle table", *, identity: str | None = None,
                   vocab_size: int | None = None) -> RecycleTable:
        """Parse and check a saved table; `identity`/`vocab_size`, when given, must match."""
        def fail(what):
            raise IndexFormatError(f"{name}: not a valid suffixspec recycle table: {what}")

        if len(data) < _HEADER.size:
            fail(f"truncated: {len(data)} bytes, shorter than the {_HEADER.size}-byte header")
        magic, version, vocab, k, depth_buckets, slots, ident, payload_crc, head_crc = _HEADER.unpack_from(data, 0)
        if magic != MAGIC:
            fail(f"bad magic {magic!r}, expected {MAGIC!r}")
        if zlib.crc32(data[: _HEADER.size - 4]) != head_crc:
            fail("header checksum mismatch")
        if version != FORMAT_VERSION:
            fail(f"format version {version}, expected {FORMAT_VERSION}")
        if (not 0 < vocab <= MAX_VOCAB or not 0 < k <= MAX_K or depth_buckets != DEPTH_BUCKETS
                or not 0 < slots <= MAX_PAIR_SLOTS or slots & (slots - 1)):
            fail(f"vocab {vocab} (expected 1..{MAX_VOCAB}), k {k} (1..{MAX_K}), depth buckets {depth_buckets} "
                 f"(expected {DEPTH_BUCKETS}) or pair slots {slots} (a power of two up to {MAX_PAIR_SLOTS}) out of range")
        n = DEPTH_BUCKETS * k * 4
        want = _HEADER.size + 4 * vocab * k + 4 * slots * k + 8 * slots + 16 * n
        if len(data) != want:
            fail(f"{len(data)} bytes, expected {want} for vocab {vocab} and k {k}")
        payload = data[_HEADER.size:]
        if zlib.crc32(payload) != payload_crc:
            fail("payload checksum mismatch")
        try:
            ident_s = ident.rstrip(b"\0").decode()
        except UnicodeDecodeError:
            fail("identity is not utf-8")
        if identity is not None and ident_s != identity:
            fail(f"made for {ident_s!r}, this model is {identity!r}")
        if vocab_size is not None and vocab != vocab_size:
            fail(f"vocabulary of {vocab} tokens, this model has {vocab_size}")
        at = 4 * vocab * k
        table = np.frombuffer(payload, "<i4", vocab * k).reshape(vocab, k).astype(np.int32)
        pairs = np.frombuffer(payload, "<i4", slots * k, at).reshape(slots, k).astype(np.int32)
        at += 4 * slots * k
        pair_keys = np.frombuffer(payload, "<i8", slots, at).astype(np.int64)
        stats = np.frombuffer(payload, "<f8", 2 * n, at + 8 * slots).astype(np.float64)
        hits, trials = stats[:n], stats[n:]
        bad = _table_problem(table, vocab) or _table_problem(pairs, vocab) or _keys_problem(pair_keys, pairs, vocab)
        if bad:
            fail(bad)
        if not (np.all(np.isfinite(stats)) and np.all(hits >= 0) and np.all(hits <= trials + 1e-9)):
            fail("calibration counts must be finite, non-negative, hits at most trials")
        out = cls(vocab, k, identity=ident_s, pair_slots=slots)
        out.table, out.pairs, out.pair_keys, out.hits, out.trials = table, pairs, pair_keys, hits.copy(), trials.copy()
        return out

    @classmethod
    def load(cls, path, *, identity: str | None = None, vocab_size: int | None = None) -> RecycleTable:
        """Read a table `save` wrote (a regular file only); any damage raises `IndexFormatError`."""
        data = read_regular(path, error=IndexFormatError, what="recycle table")
        return cls.from_bytes(data, str(path), identity=identity, vocab_size=vocab_size)


def _table_problem(table: np.ndarray, vocab: int) -> str:
    """Why `table` is invalid ("" when it is not): entries in [-1, vocab), -1 only at a row's end,
    a row's entries distinct."""
    if table.size and (table.min() < -1 or table.max() >= vocab):
        return f"token ids must be in [-1, {vocab}), found {int(table.min())}..{int(table.max())}"
    empty = table < 0
    if np.any(empty[:, :-1] & ~empty[:, 1:]):
        return "a row has an entry after an empty slot"
    s = np.sort(table, axis=1)
    if np.any((s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)):
        return "a row repeats a token"
    return ""


def _keys_problem(keys: np.ndarray, pairs: np.ndarray, vocab: int) -> str:
    """Why the pair keys are invalid ("" when they are not): each -1 (its row empty) or a pair code
    below vocab**2 stored in its own slot."""
    used = keys >= 0
    if np.any(keys < -1) or np.any(keys >= vocab * vocab):
        return f"pair keys must be -1 or codes below {vocab * vocab}"
    if np.any(~used & (pairs[:, 0] >= 0)):
        return "a pair slot without a key holds entries"
    slots = np.flatnonzero(used)
    for slot, code in zip(slots.tolist(), keys[used].tolist()):
        if rk.pair_slot(code, keys.shape[0]) != slot:
            return f"pair slot {slot} holds a key that belongs to another slot"
    return ""


def _children(tree: DraftTree) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents.tolist()):
        out.setdefault(p, []).append(i)
    return out


def _map_buckets(drafted: RecycledDraft, verified: DraftTree) -> np.ndarray:
    """The bucket of each node of `verified`, found in `drafted.tree` by its path (siblings are
    distinct, so a (parent, token) pair names one node)."""
    full = drafted.tree
    if verified is full:
        return drafted.buckets
    index = {(p, t): i for i, (p, t) in enumerate(zip(full.parents.tolist(), full.tokens.tolist()))}
    mapped = np.empty(len(verified), np.int64)
    buckets = np.full(len(verified), rk.NO_BUCKET, np.int32)
    for i, (p, t) in enumerate(zip(verified.parents.tolist(), verified.tokens.tolist())):
        parent = -1 if p < 0 else int(mapped[p])
        j = -1 if p >= 0 and parent < 0 else index.get((parent, t), -1)
        mapped[i] = j
        if j >= 0:
            buckets[i] = drafted.buckets[j]
    return buckets


def model_identity(model) -> str:
    """What a table belongs to: the model's class, name, size and vocabulary, hashed (a table is
    the model's predictions over its tokenizer's ids)."""
    import hashlib
    import json

    config = getattr(model, "config", None)
    try:
        params = sum(p.numel() for p in model.parameters())
    except (AttributeError, TypeError):
        params = 0
    ident = json.dumps([type(model).__name__, getattr(config, "_name_or_path", ""), params,
                        getattr(config, "vocab_size", None)])
    return f"{type(model).__name__[:30]}:{hashlib.sha256(ident.encode()).hexdigest()[:24]}"


def harvest_round(table: RecycleTable, logits, root_index, batch, results) -> int:
    """`table.harvest` at positions of one pass's trees: each row's root (read there: its last
    pending token, after the committed one before it), its accepted nodes (read: the node's token,
    after its parent's), and its `table.off_path` best-scored other nodes (None: all of them). The
    positions the acceptance walked (predictions in the committed context) go last, so they win over
    a node off that path that read the same token. Returns the positions kept."""
    keys_at, prevs_at, positions = [], [], []
    for r, res in enumerate(results):
        if not res.tokens:
            keys_at.append([])
            prevs_at.append([])
            positions.append([])
            continue
        at, tree, context = int(root_index[r]), batch.trees[r], batch.contexts[r]
        root_tok = int(batch.pending[r][-1])
        walked = set(int(a) for a in res.accepted_nodes)
        off = [i for i in np.argsort(-tree.scores, kind="stable").tolist() if i not in walked]
        if table.off_path is not None:
            off = off[: table.off_path]
        order = off[::-1] + [-1] + [int(a) for a in res.accepted_nodes]
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        positions.append([at + 1 + i for i in order])
        keys_at.append([root_tok if i < 0 else tokens[i] for i in order])
        root_prev = int(context[-2]) if len(context) > 1 else -1
        prevs_at.append([root_prev if i < 0 else (root_tok if parents[i] < 0 else tokens[parents[i]]) for i in order])
    return table.harvest(logits, keys_at, prevs_at, positions)
