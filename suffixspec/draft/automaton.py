"""`SuffixAutomaton` (growable, online) and `FrozenAutomaton` (compact, read-only).

Both answer the same queries over the indexed token ids:

- `match(context)` / `match_length(context)`: the longest suffix of `context` occurring in the
  text, and `cursor()`: a `MatchCursor` following a growing context in amortized O(1) per token;
- `locate(pattern)` (the state of a token sequence, or -1) and `count(pattern)` (its number of
  end positions, exact);
- `continuations(state)`: next token -> (occurrence count, most recent end position), read from
  the state's outgoing edges, never by scanning the vocabulary; `following(end, n)`: the text
  after an occurrence ending at `end`, never crossing into the next document.

Positions are 0-based indexes into the concatenation of all documents; the *end position* of
an occurrence is the index of its last token. Documents: `start_document()` begins a new one;
no match spans two documents.

Counts stay exact online (see `_kernels/lct.py`): a first bulk `extend` over an empty
automaton records each state's own positions and settles all counts in one O(n) pass when a
count is first asked for; from then on every appended token updates its suffix-link root path
through a link-cut tree in O(log n) amortized. Matching never needs counts.

Thread safety: a `SuffixAutomaton` is not safe for concurrent use (even count queries
restructure the link-cut tree); a `FrozenAutomaton` is read-only and safe to share.
"""

from __future__ import annotations

import numpy as np

from .._kernels import build as bk
from .._kernels import frozen as fk
from .._kernels import lct
from .._kernels import sam as sk
from .._kernels import sam_freeze as sfk
from .._kernels import sam_query as sqk
from .._kernels import walk as wk
from ..errors import BadInputError, BadInputTypeError, IndexFormatError
from ..tokenids import as_tokens

MODE_SETTLED = 2  # true counts in S, no link-cut tree yet (Python-side mode only)


class Continuations:
    """Tokens that followed a matched string, with how often and when they last did."""

    __slots__ = ("tokens", "counts", "last_ends", "states")

    def __init__(self, tokens, counts, last_ends, states):
        self.tokens = tokens          # int32[k], sorted ascending
        self.counts = counts          # int64[k], occurrences of (matched string + token)
        self.last_ends = last_ends    # int64[k], most recent end position of (string + token)
        self.states = states          # int32[k], state reached by each token

    def __len__(self):
        return int(self.tokens.shape[0])

    def as_dict(self) -> dict[int, tuple[int, int]]:
        return {int(t): (int(c), int(e)) for t, c, e in zip(self.tokens, self.counts, self.last_ends)}

    def __repr__(self):
        return f"Continuations({self.as_dict()!r})"


class MatchCursor:
    """Longest suffix of a growing context that occurs in an automaton's text.

    `advance(tokens)` costs amortized O(1) per token; it stays valid while the automaton grows.
    """

    __slots__ = ("_automaton", "state", "length")

    def __init__(self, automaton):
        self._automaton = automaton
        self.state = 0
        self.length = 0

    def advance(self, tokens) -> int:
        toks = as_tokens(tokens)
        self.state, self.length = self._automaton._advance(self.state, self.length, toks)
        return self.length

    def append(self, token: int) -> int:
        return self.advance([token])

    def reset(self) -> None:
        self.state = 0
        self.length = 0

    def __repr__(self):
        return f"MatchCursor(state={self.state}, length={self.length})"


class _Queries:
    """Query methods shared by both layouts, written over a few primitives."""

    def cursor(self) -> MatchCursor:
        return MatchCursor(self)

    def match(self, context) -> tuple[int, int]:
        """(state, length) of the longest suffix of `context` occurring in the text."""
        return self._advance(0, 0, as_tokens(context, "context"))

    def match_length(self, context) -> int:
        return self.match(context)[1]

    def count(self, pattern) -> int:
        """Number of end positions of `pattern` in the text (len(self) for the empty pattern)."""
        state = self.locate(pattern)
        return 0 if state < 0 else self.state_count(state)

    def following(self, end: int, n: int) -> np.ndarray:
        """Up to `n` tokens after position `end`, stopping at the end of its document."""
        end, n = int(end), int(n)
        total = len(self)
        if end < -1 or end >= total:
            raise BadInputError(f"end: expected a position in [-1, {total - 1}], got {end}")
        if n < 0:
            raise BadInputError(f"n: expected a non-negative count, got {n}")
        starts = self._doc_starts()
        doc = max(0, int(np.searchsorted(starts, end, side="right")) - 1)  # the document holding `end`
        stop = int(starts[doc + 1]) if doc + 1 < starts.shape[0] else total
        if end + 1 == stop:
            return np.empty(0, np.int32)
        return np.array(self._text()[end + 1 : min(end + 1 + n, stop)], dtype=np.int32)

    def _check_state(self, state) -> int:
        if isinstance(state, (bool, np.bool_)) or not isinstance(state, (int, np.integer)):
            raise BadInputTypeError(f"state: expected an int state id, got {type(state).__name__}")
        state = int(state)
        if not 0 <= state < self.n_states:
            raise BadInputError(f"state: expected a state id in [0, {self.n_states - 1}], got {state}")
        return state


class SuffixAutomaton(_Queries):
    """Online suffix automaton over token ids in [0, 2**31 - 1]; see the module docstring."""

    def __init__(self, tokens=None):
        self._S = np.empty((16, sk.STATE_COLS), np.int32)
        self._S[0] = (-1, 0, -1, 0, -1, 0)
        self._E = np.empty((16, 4), np.int32)
        self._H = np.full(32, -1, np.int32)
        self._T = np.empty(16, np.int32)
        self._L = np.empty((0, 5), np.int32)
        self._M = np.zeros(sk.META, np.int64)
        self._M[sk.N_STATES] = 1
        self._mode = sk.MODE_BULK
        self._stack = np.empty(64, np.int32)
        self._docs = np.zeros(4, np.int64)  # document start positions, first _n_docs used
        self._n_docs = 1
        self._live = np.zeros(sk.LIVE_LEN, np.int64)  # invariant: names the current S, E, L, M, stack
        self._relink()
        if tokens is not None:
            self.extend(tokens)

    # -- building -----------------------------------------------------------------------
    def extend(self, tokens) -> None:
        """Append tokens to the current document."""
        self._extend_valid(as_tokens(tokens))

    def _extend_valid(self, toks: np.ndarray) -> None:
        """`extend` with tokens `as_tokens` already checked."""
        if toks.shape[0] == 0:
            return
        if self._mode == MODE_SETTLED:
            self._start_online()
        S, E, H, T, L, st = sk.extend(self._S, self._E, self._H, self._T, self._L, self._M, toks, self._stack)
        replaced = S is not self._S or E is not self._E or L is not self._L or st is not self._stack
        self._S, self._E, self._H, self._T, self._L, self._stack = S, E, H, T, L, st
        if replaced:
            self._relink()

    def _relink(self) -> None:
        sk.write_live(self._live, self._S, self._E, self._L, self._M, self._stack)

    def append(self, token: int) -> None:
        self.extend([token])

    def start_document(self) -> None:
        """Begin a new document: later tokens never match across the boundary."""
        n = int(self._M[sk.N_TOKENS])
        if n == self._docs[self._n_docs - 1]:
            return  # current document is still empty
        if self._n_docs == self._docs.shape[0]:
            self._docs = np.concatenate([self._docs, np.zeros(self._n_docs, np.int64)])
        self._docs[self._n_docs] = n
        self._n_docs += 1
        self._M[sk.LAST_STATE] = 0

    def add_document(self, tokens) -> None:
        self.start_document()
        self.extend(tokens)

    def _settle_counts(self) -> None:
        if self._mode == sk.MODE_BULK:
            sk.accumulate(self._S, self._M)
            self._mode = MODE_SETTLED

    def _start_online(self) -> None:
        self._settle_counts()
        self._L = np.empty((self._S.shape[0], 5), np.int32)
        sk.init_lct(self._S, self._L, self._M)
        self._M[sk.MODE] = sk.MODE_ONLINE
        self._mode = sk.MODE_ONLINE
        self._relink()

    # -- primitives for _Queries --------------------------------------------------------
    def _advance(self, state, length, toks):
        if state >= self.n_states or state < 0:
            raise BadInputError(f"cursor state {state} does not belong to this automaton")
        state = sqk.normalize(self._S, state, length)
        s, ln = sqk.advance(self._S, self._E, self._H, state, length, toks)
        return int(s), int(ln)

    def locate(self, pattern) -> int:
        """State whose strings include `pattern`, or -1 if it does not occur."""
        return int(sqk.locate(self._S, self._E, self._H, as_tokens(pattern, "pattern")))

    def prefix_length(self, pattern) -> int:
        """Length of the longest prefix of `pattern` that occurs in the text."""
        return int(wk.prefix_live(self._S, self._E, self._H, as_tokens(pattern, "pattern")))

    @property
    def last_state(self) -> int:
        """State of the whole current document (its longest string is the document so far)."""
        return int(self._M[sk.LAST_STATE])

    def _values(self, states: np.ndarray) -> np.ndarray:
        self._settle_counts()
        out, stack = sqk.true_values(self._S, self._L, self._M, states, self._stack)
        if stack is not self._stack:
            self._stack = stack
            self._relink()
        return out

    def state_count(self, state) -> int:
        return int(self._values(np.array([self._check_state(state)], np.int32))[0, 0])

    def state_last_end(self, state) -> int:
        return int(self._values(np.array([self._check_state(state)], np.int32))[0, 1])

    def state_length(self, state) -> int:
        return int(self._S[self._check_state(state), sk.LEN])

    def state_link(self, state) -> int:
        return int(self._S[self._check_state(state), sk.LINK])

    def continuations(self, state) -> Continuations:
        toks, dsts = sqk.out_edges(self._S, self._E, self._check_state(state))
        vals = self._values(dsts)
        return Continuations(toks, vals[:, 0].copy(), vals[:, 1].copy(), dsts)

    def _doc_starts(self):
        return self._docs[: self._n_docs]

    def _text(self):
        return self._T[: len(self)]

    # -- sizes, copies --------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._M[sk.N_TOKENS])

    @property
    def n_states(self) -> int:
        return int(self._M[sk.N_STATES])

    @property
    def n_edges(self) -> int:
        return int(self._M[sk.N_EDGES])

    @property
    def n_documents(self) -> int:
        return self._n_docs if len(self) else 0

    @property
    def tokens(self) -> np.ndarray:
        """Read-only view of the indexed text."""
        view = self._T[: len(self)]
        view.flags.writeable = False
        return view

    @property
    def nbytes(self) -> int:
        """All memory held by the automaton's arrays, spare capacity included."""
        return int(sum(a.nbytes for a in (self._S, self._E, self._H, self._T, self._L, self._M, self._stack, self._docs)))

    def freeze(self) -> FrozenAutomaton:
        """A compact read-only copy (CSR edges sorted by token), safe to share across threads."""
        self._settle_values()
        offsets, etok, eto = sfk.to_csr(self._S, self._E, self._M)
        links, lens, counts, lasts = sfk.state_columns(self._S, self._M)
        return FrozenAutomaton(
            links=links, lens=lens, counts=counts, lasts=lasts, offsets=offsets, etok=etok, eto=eto,
            tokens=self._T[: len(self)].copy(), doc_starts=self._doc_starts().copy(),
        )

    def _settle_values(self) -> None:
        self._settle_counts()
        if self._mode == sk.MODE_ONLINE:
            lct.settle(self._L, self._S, self.n_states)

    def __getstate__(self):
        n, m, t = self.n_states, self.n_edges, len(self)
        if self._mode == sk.MODE_ONLINE:
            lct.settle(self._L, self._S, n)
        return {
            "version": 1, "mode": self._mode, "S": self._S[:n].copy(), "E": self._E[:m].copy(),
            "H": self._H.copy(), "T": self._T[:t].copy(), "M": self._M.copy(),
            "docs": self._doc_starts().copy(),
        }

    def __setstate__(self, st):
        if st.get("version") != 1:
            raise BadInputError(f"pickled SuffixAutomaton: expected version 1, got {st.get('version')!r}")
        self._S, self._E, self._H, self._T, self._M = st["S"], st["E"], st["H"], st["T"], st["M"]
        if self._E.shape[0] == 0:
            self._E = np.empty((16, 4), np.int32)
        if self._T.shape[0] == 0:
            self._T = np.empty(16, np.int32)
        self._docs = st["docs"]
        self._n_docs = int(self._docs.shape[0])
        self._stack = np.empty(64, np.int32)
        self._L = np.empty((0, 5), np.int32)
        mode = st["mode"]
        # values were settled before pickling: an online automaton restarts its link-cut tree
        self._mode = MODE_SETTLED if mode == sk.MODE_ONLINE else mode
        self._M[sk.MODE] = sk.MODE_BULK
        self._live = np.zeros(sk.LIVE_LEN, np.int64)
        self._relink()

    def __repr__(self):
        return f"SuffixAutomaton(tokens={len(self)}, states={self.n_states}, edges={self.n_edges})"


class FrozenAutomaton(_Queries):
    """Read-only automaton over flat arrays (possibly memory-mapped); see the module docstring."""

    _FIELDS = ("links", "lens", "counts", "lasts", "offsets", "etok", "eto", "tokens", "plink", "count_escapes", "doc_starts")

    def __init__(self, *, links, lens, counts, lasts, offsets, etok, eto, tokens, doc_starts, plink=None,
                 count_escapes=None):
        self.links, self.lens, self.counts, self.lasts = links, lens, counts, lasts
        self.offsets, self.etok, self.eto = offsets, etok, eto
        self.tokens, self.doc_starts = tokens, doc_starts
        # the implicit states' suffix links (`_kernels/frozen.py`; a corpus shard's), empty for none
        self.plink = np.empty(0, np.int32) if plink is None else plink
        # uint16 counts' escapes (`_kernels/frozen.py`: (state, count) pairs), empty for none
        self.count_escapes = np.empty(0, np.int32) if count_escapes is None else count_escapes
        n = links.shape[0]
        for name in ("lens", "counts", "lasts"):
            if getattr(self, name).shape[0] != n:
                raise IndexFormatError(f"frozen automaton: array {name} has {getattr(self, name).shape[0]} rows, expected {n}")
        if offsets.shape[0] != n + 1 or etok.shape[0] != eto.shape[0]:
            raise IndexFormatError("frozen automaton: edge arrays do not match the state count")
        if n == 0 or doc_starts.shape[0] == 0:
            raise IndexFormatError("frozen automaton: no root state or no document table")
        if self.plink.dtype != np.int32 or self.plink.shape[0] not in (0, tokens.shape[0]):
            raise IndexFormatError(f"frozen automaton: plink has {self.plink.shape[0]} rows, expected 0 or {tokens.shape[0]}")
        if self.count_escapes.dtype != np.int32 or self.count_escapes.shape[0] % 2:
            raise IndexFormatError("frozen automaton: count escapes are not (state, count) int32 pairs")
        for a in (self.links, self.lens, self.counts, self.lasts, self.offsets, self.etok, self.eto, self.tokens, self.plink,
                  self.count_escapes):
            if a.flags.writeable:
                a.flags.writeable = False

    def documents(self) -> list[np.ndarray]:
        """The documents it was built over, in order (views of `tokens`)."""
        bounds = [int(x) for x in self.doc_starts] + [len(self)]
        return [self.tokens[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    @classmethod
    def from_documents(cls, tokens, doc_starts, *, extending: FrozenAutomaton | None = None) -> FrozenAutomaton:
        """The automaton `SuffixAutomaton.add_document` builds over the documents
        tokens[doc_starts[i]:doc_starts[i + 1]] (the last one to the end), frozen, with its
        `kernel_arrays()` and `edge_records()` made: the same arrays, in one kernel call
        (`_kernels/build.py`). `doc_starts`: 0 first, strictly increasing, each below
        len(tokens) (no empty document); [0] for no tokens. An int32 array of tokens is taken as it
        is (its ids are checked in the kernel), anything else goes through `as_tokens`.

        `extending`: an automaton over exactly the first of these documents (as this method or
        `SuffixAutomaton.freeze` makes it; its tokens and document starts are checked to be theirs,
        its arrays to be a well-formed layout): it is thawed instead of rebuilt, so only the later
        documents are added (then the whole is laid out again)."""
        if not (isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 and tokens.ndim == 1
                and tokens.flags.c_contiguous):
            tokens = as_tokens(tokens)
        starts = np.asarray(doc_starts) if isinstance(doc_starts, (np.ndarray, list, tuple)) else None
        if starts is None or not (np.issubdtype(starts.dtype, np.integer)
                                  or (starts.size == 0 and starts.dtype == np.float64)):
            raise BadInputTypeError(f"doc_starts: expected a 1-D sequence of integer positions, got "
                                    f"{type(doc_starts).__name__}")
        if starts.ndim != 1:
            raise BadInputError(f"doc_starts: expected a 1-D sequence of positions, got shape {starts.shape}")
        starts = np.ascontiguousarray(starts, dtype=np.int64)
        bad = bk.check_documents(tokens, starts)
        if bad == bk.DOCS_NEGATIVE_TOKEN:
            raise BadInputError("tokens: expected token ids in [0, 2**31 - 1], got a negative one")
        if bad != bk.DOCS_OK:
            raise BadInputError(f"doc_starts: expected 0 first, strictly increasing and below {tokens.shape[0]} "
                                f"(no empty document), got {starts.tolist()[:8]}")
        if extending is not None and not isinstance(extending, FrozenAutomaton):
            raise BadInputTypeError(f"extending: expected a FrozenAutomaton, got {type(extending).__name__}")
        if extending is None or len(extending) == 0:
            built = bk.build_frozen(tokens, starts)
        else:
            first = int(extending.doc_starts.shape[0])
            built = bk.extend_frozen(*extending._thaw_arrays(tokens, starts), tokens, starts, first)
        links, lens, counts, lasts, offsets, etok, eto, text, starts, offsets32, records = built
        fa = cls(links=links, lens=lens, counts=counts, lasts=lasts, offsets=offsets, etok=etok, eto=eto,
                 tokens=text, doc_starts=starts)
        offsets32.flags.writeable = False
        records.flags.writeable = False
        fa.__dict__["_kernel_arrays"] = (offsets32, etok, eto, counts, lasts, links, lens)  # KERNEL_FIELDS
        fa.__dict__["_edge_records"] = records
        return fa

    def _thaw_arrays(self, tokens: np.ndarray, starts: np.ndarray) -> tuple:
        """The arrays `_kernels.build.extend_frozen` thaws, once this automaton is checked to be
        over the first documents of (tokens, starts) (`from_documents`) with a layout it can follow."""
        k, first = len(self), int(self.doc_starts.shape[0])
        if self.plink.shape[0]:
            raise BadInputError("extending: expected an automaton without implicit states (a corpus shard's has them)")
        if not (first <= starts.shape[0] and (starts[first] == k if first < starts.shape[0] else k == tokens.shape[0])
                and np.array_equal(starts[:first], self.doc_starts) and np.array_equal(tokens[:k], self.tokens)):
            raise BadInputError("extending: expected the automaton over the first documents of tokens")
        arrays = (self.links, self.lens, self.counts, self.lasts, np.asarray(self.offsets, np.int64), self.etok, self.eto)
        if not (all(a.ndim == 1 and a.dtype == (np.int64 if i == 4 else np.int32) for i, a in enumerate(arrays))
                and bk.layout_ok(*arrays, k)):
            raise BadInputError("extending: not a well-formed frozen automaton")
        return arrays

    def _corrupt(self, what):
        raise IndexFormatError(f"frozen automaton: damaged arrays ({what})")

    def _check_state(self, state) -> int:
        v = super()._check_state(state)
        if v >= self.n_stored and int(self.plink[v - self.n_stored]) == fk.HOLE:
            # the id of a position whose prefix state is stored: no state
            raise BadInputError(f"state: {state} is no state of this automaton (no implicit state at position "
                                f"{v - self.n_stored})")
        return v

    def _advance(self, state, length, toks):
        if not 0 <= state < self.n_states:
            raise BadInputError(f"cursor state {state} does not belong to this automaton")
        s, ln = fk.advance(self.offsets, self.etok, self.eto, self.links, self.lens, self.tokens, self.plink, state,
                           length, toks)
        if s == fk.CORRUPT:
            self._corrupt("while matching")
        return int(s), int(ln)

    def locate(self, pattern) -> int:
        s = int(fk.locate(self.offsets, self.etok, self.eto, self.tokens, self.plink, as_tokens(pattern, "pattern")))
        if s == fk.CORRUPT:
            self._corrupt("while locating")
        return s

    def prefix_length(self, pattern) -> int:
        """Length of the longest prefix of `pattern` that occurs in the text."""
        n = int(wk.prefix_frozen(self.offsets, self.etok, self.eto, self.tokens, self.plink, as_tokens(pattern, "pattern")))
        return n

    def count_at(self, v: int) -> int:
        """Count of state id v (in range: stored, or implicit: 1); `fk.count_of` without a kernel
        call (this is read per committed token and per restricted query)."""
        if v >= self.n_stored:
            return 1
        c = int(self.counts[v])
        if c == fk.COUNT_ESCAPED and self.count_escapes.shape[0]:
            ids = self.count_escapes[0::2]
            i = int(np.searchsorted(ids, v))
            if i < ids.shape[0] and int(ids[i]) == v:
                return int(self.count_escapes[2 * i + 1])
        return c

    def last_at(self, v: int) -> int:
        """Last end of state id v (in range: stored, or implicit: its position)."""
        return int(self.lasts[v]) if v < self.n_stored else v - self.n_stored

    def state_count(self, state) -> int:
        return self.count_at(self._check_state(state))

    def state_last_end(self, state) -> int:
        return self.last_at(self._check_state(state))

    def state_length(self, state) -> int:
        v = self._check_state(state)
        if v >= self.n_stored:  # an implicit state: its document's prefix up to its position
            p = v - self.n_stored
            return p - int(self.doc_starts[int(np.searchsorted(self.doc_starts, p, side="right")) - 1]) + 1
        length = int(self.lens[v])
        if length == fk.LEN_SATURATED and self.lens.dtype == np.uint16:
            # saturated (a corpus shard's leaf of a long document): its document's prefix up to its last end
            end = int(self.lasts[v])
            if not 0 <= end < len(self):
                self._corrupt(f"last end of state {v}")
            start = int(self.doc_starts[int(np.searchsorted(self.doc_starts, end, side="right")) - 1])
            length = end - start + 1
        return length

    def state_link(self, state) -> int:
        w = int(fk.link_of(self.links, self.plink, self._check_state(state)))
        if w == fk.CORRUPT:
            self._corrupt(f"suffix link of state {state}")
        return w

    def continuations(self, state) -> Continuations:
        toks, dsts, ok = fk.out_edges(self.offsets, self.etok, self.eto, self.tokens, self.plink, self._check_state(state))
        if not ok:
            self._corrupt(f"edges of state {state}")
        counts, lasts = fk.target_values(self.counts, self.count_escapes, self.lasts, self.n_states, dsts)
        return Continuations(toks, counts, lasts, dsts)

    def _doc_starts(self):
        return self.doc_starts

    def _text(self):
        return self.tokens

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_states(self) -> int:
        """The state ids: the stored states, then one per position when there are implicit states
        (ids n_stored + p; a position whose prefix state is stored has none)."""
        return int(self.links.shape[0] + self.plink.shape[0])

    @property
    def n_stored(self) -> int:
        return int(self.links.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.etok.shape[0])

    @property
    def n_documents(self) -> int:
        return int(self.doc_starts.shape[0]) if len(self) else 0

    @property
    def nbytes(self) -> int:
        return int(sum(getattr(self, f).nbytes for f in self._FIELDS))

    def arrays(self) -> dict[str, np.ndarray]:
        return {f: getattr(self, f) for f in self._FIELDS}

    @property
    def longest_document(self) -> int:
        """Tokens in the longest document (no match is longer); computed once."""
        got = self.__dict__.get("_longest_document")
        if got is None:
            n = len(self)
            bounds = np.append(np.asarray(self.doc_starts, np.int64), n)
            got = self.__dict__["_longest_document"] = int(np.diff(bounds).max()) if n else 0
        return got

    KERNEL_FIELDS = ("offsets", "etok", "eto", "counts", "lasts", "links", "lens")
    IMPLICIT_FIELDS = ("tokens", "plink", "count_escapes")  # read by the kernels that meet implicit states
    NARROW_FIELDS = ("etok", "lens", "counts")  # kept uint16 when they are (see kernel_arrays)

    def kernel_arrays(self) -> tuple:
        """`KERNEL_FIELDS` as read-only C arrays (a row of `_kernels.frozen.source_table`): int32, but
        `etok` and `lens` also uint16 (a corpus shard's, read in place: every kernel taking them
        reads either); a converted copy is made only of another dtype, once, and kept."""
        got = self.__dict__.get("_kernel_arrays")
        if got is None:
            out = []
            for name in self.KERNEL_FIELDS:
                a = getattr(self, name)
                narrow = name in self.NARROW_FIELDS and a.dtype == np.uint16
                if not narrow and (a.dtype != np.int32 or not a.flags.c_contiguous):
                    if a.shape[0] and (int(a.max()) > np.iinfo(np.int32).max or int(a.min()) < np.iinfo(np.int32).min):
                        raise BadInputError(f"corpus: array {name} does not fit int32 (split the corpus into smaller shards)")
                    a = np.ascontiguousarray(a, dtype=np.int32)
                elif narrow and not a.flags.c_contiguous:
                    a = np.ascontiguousarray(a)
                if a.flags.writeable:
                    a = a.view()
                    a.flags.writeable = False
                out.append(a)
            got = self.__dict__["_kernel_arrays"] = tuple(out)
        return got

    def implicit_arrays(self) -> tuple:
        """`IMPLICIT_FIELDS` as read-only C arrays for the kernels (tokens int32 or uint16; each as
        it is when it already is, else a copy made once and kept)."""
        got = self.__dict__.get("_implicit_arrays")
        if got is None:
            toks = self.tokens
            if toks.dtype not in (np.int32, np.uint16) or not toks.flags.c_contiguous:
                toks = np.ascontiguousarray(toks, np.int32)
            out = []
            for a in (toks, np.ascontiguousarray(self.plink), np.ascontiguousarray(self.count_escapes)):
                if a.flags.writeable:
                    a = a.view()
                    a.flags.writeable = False
                out.append(a)
            got = self.__dict__["_implicit_arrays"] = tuple(out)
        return got

    def edge_records(self) -> np.ndarray:
        """`_kernels.frozen.edge_records` of the kernel arrays (the drafting kernel's children: an
        edge's token, target and the target's count and last end, side by side), read-only; built
        once and kept on the automaton (16 bytes per edge)."""
        got = self.__dict__.get("_edge_records")
        if got is None:
            offsets, etok, eto, counts, lasts, _links, _lens = self.kernel_arrays()
            got = fk.edge_records(etok, eto, counts, self.count_escapes, lasts, self.plink.shape[0])
            got.flags.writeable = False
            self.__dict__["_edge_records"] = got
        return got

    def __reduce__(self):
        return (_rebuild_frozen, ({f: np.array(a) for f, a in self.arrays().items()},))

    def __repr__(self):
        return f"FrozenAutomaton(tokens={len(self)}, states={self.n_states}, edges={self.n_edges})"


def _rebuild_frozen(arrays):
    return FrozenAutomaton(**arrays)
