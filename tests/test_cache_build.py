"""`FrozenAutomaton.from_documents` (one kernel call over all documents, `_kernels/build.py`) against
the per-document path it replaces (a fresh `SuffixAutomaton`, `add_document` per document, `freeze`),
and the response cache's one-build-per-add upkeep against the cache as it was (every level built
alone, then merged two by two, each merge rebuilt), after every add, ids included; `add_many` against
`add` one document at a time."""

import numpy as np
import pytest

import suffixspec.draft.response_cache as cache_mod
from suffixspec import ResponseCache, SuffixAutomaton
from suffixspec.draft.automaton import FrozenAutomaton
from suffixspec.errors import BadInputError, BadInputTypeError


def _reference(docs) -> FrozenAutomaton:
    sam = SuffixAutomaton()
    for d in docs:
        sam.add_document(d)
    fa = sam.freeze()
    fa.kernel_arrays()
    fa.edge_records()
    return fa


def _flat(docs):
    tokens = np.concatenate([np.asarray(d, np.int32) for d in docs]) if docs else np.empty(0, np.int32)
    starts = np.cumsum([0] + [len(d) for d in docs[:-1]]).astype(np.int64)
    return tokens, starts


def _assert_same(got: FrozenAutomaton, want: FrozenAutomaton):
    for name in FrozenAutomaton._FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
    for name, a, b in zip(FrozenAutomaton.KERNEL_FIELDS, got.kernel_arrays(), want.kernel_arrays()):
        assert a.dtype == b.dtype and np.array_equal(a, b) and not a.flags.writeable, name
    assert np.array_equal(got.edge_records(), want.edge_records()) and not got.edge_records().flags.writeable


def _random_docs(rng):
    alphabet = int(rng.choice([1, 2, 3, 5, 40, 50_000, 2**31 - 1]))
    low = 0 if alphabet < 2**31 - 1 else 2**31 - 64  # large ids: the top of the range
    docs = []
    for _ in range(int(rng.integers(1, 9))):
        n = 1 if rng.random() < 0.25 else int(rng.integers(1, 80))
        docs.append(rng.integers(low, low + min(alphabet, 64) if low else alphabet, n, dtype=np.int64).astype(np.int32))
    if rng.random() < 0.3:
        docs = docs + docs[: int(rng.integers(1, len(docs) + 1))]  # repeated documents
    return docs


def test_from_documents_is_the_per_document_build():
    rng = np.random.default_rng(11)
    for _ in range(400):
        docs = _random_docs(rng)
        _assert_same(FrozenAutomaton.from_documents(*_flat(docs)), _reference(docs))


@pytest.mark.parametrize("docs", [
    [[7]],
    [[7], [7], [7]],
    [[0] * 5000 + [1], [0] * 10 + [2]],  # a suffix-link walk past sam.WALK_LIMIT: the general path
    [list(range(3000)), list(range(3000))],  # the root becomes a hub of 3000 edges (hashed, rehashed)
    [[2**31 - 1, 0, 2**31 - 1], [0, 2**31 - 1]],
])
def test_from_documents_edge_cases(docs):
    _assert_same(FrozenAutomaton.from_documents(*_flat(docs)), _reference(docs))


def test_from_documents_of_nothing_and_of_other_inputs():
    _assert_same(FrozenAutomaton.from_documents(np.empty(0, np.int32), [0]), SuffixAutomaton().freeze())
    docs = [[3, 1, 3], [1, 3]]
    want = _reference(docs)
    _assert_same(FrozenAutomaton.from_documents([3, 1, 3, 1, 3], [0, 3]), want)  # a list: through as_tokens
    _assert_same(FrozenAutomaton.from_documents(np.array([3, 1, 3, 1, 3], np.int64), np.array([0, 3], np.int32)), want)
    tokens = np.array([3, 1, 3, 1, 3], np.int32)
    starts = np.array([0, 3], np.int64)
    fa = FrozenAutomaton.from_documents(tokens, starts)
    tokens[0], starts[1] = 9, 4  # the automaton holds copies
    _assert_same(fa, want)


@pytest.mark.parametrize("tokens,starts,err", [
    (np.array([1, -2, 3], np.int32), [0], BadInputError),
    ([1, 2, 3], [1], BadInputError),
    ([1, 2, 3], [0, 2, 2], BadInputError),
    ([1, 2, 3], [0, 2, 1], BadInputError),
    ([1, 2, 3], [0, 3], BadInputError),  # an empty last document
    ([1, 2, 3], [], BadInputError),
    ([], [0, 0], BadInputError),
    ([1, 2, 3], [[0]], BadInputError),
    ([1, 2, 3], "0", BadInputTypeError),
    ([1.5, 2.0], [0], BadInputTypeError),
])
def test_from_documents_rejects_bad_input(tokens, starts, err):
    with pytest.raises(err):
        FrozenAutomaton.from_documents(tokens, starts)


def test_extending_a_frozen_automaton_is_the_per_document_build():
    """`extending=` the automaton over the first documents (thawed, then the rest added) gives the
    same arrays as one build over all of them, whatever the split."""
    rng = np.random.default_rng(12)
    for _ in range(300):
        docs = _random_docs(rng) + _random_docs(rng)
        first = int(rng.integers(1, len(docs) + 1))
        prefix = FrozenAutomaton.from_documents(*_flat(docs[:first]))
        _assert_same(FrozenAutomaton.from_documents(*_flat(docs), extending=prefix), _reference(docs))


@pytest.mark.parametrize("docs,first", [
    ([[0] * 5000, [0] * 5000 + [1]], 1),  # the walk past sam.WALK_LIMIT after a thaw
    ([list(range(3000)), list(range(2990, 3100)), [5]], 1),  # a thawed hub (hashed), then more of its edges
    ([[1, 2, 3]] * 9, 4),
    ([[1, 2], [3]], 2),  # nothing to add
])
def test_extending_edge_cases(docs, first):
    prefix = FrozenAutomaton.from_documents(*_flat(docs[:first]))
    _assert_same(FrozenAutomaton.from_documents(*_flat(docs), extending=prefix), _reference(docs))


def test_extending_checks_that_it_is_the_first_documents():
    prefix = FrozenAutomaton.from_documents([1, 2, 3], [0])
    for tokens, starts in (([1, 2, 4, 5], [0, 3]),  # other tokens
                           ([1, 2, 3, 5], [0, 2]),  # other document starts
                           ([1, 2, 3, 5], [0]),  # the first document goes on
                           ([1, 2], [0])):  # shorter
        with pytest.raises(BadInputError, match="extending"):
            FrozenAutomaton.from_documents(tokens, starts, extending=prefix)
    with pytest.raises(BadInputTypeError, match="extending"):
        FrozenAutomaton.from_documents([1, 2, 3, 4], [0, 3], extending=SuffixAutomaton([1, 2, 3]))
    bad = prefix.arrays()
    bad["links"] = np.array(bad["links"]) * 0 + 5  # suffix links out of range
    with pytest.raises(BadInputError, match="well-formed"):
        FrozenAutomaton.from_documents([1, 2, 3, 4], [0, 3], extending=FrozenAutomaton(**bad))
    empty = SuffixAutomaton().freeze()
    _assert_same(FrozenAutomaton.from_documents([1, 2, 3], [0], extending=empty), prefix)


class _PerDocumentCache(ResponseCache):
    """The cache as it was before one build per add: the new document built as a level of its own,
    then merged with the level before it two by two, every merge rebuilt from a fresh
    `SuffixAutomaton` one document at a time."""

    def add(self, tokens):
        toks = np.asarray(tokens, np.int32)
        if toks.shape[0] == 0:
            return
        levels = self._levels + [(self._new_id(), _reference([toks]))]
        if sum(len(fa) for _, fa in levels) >= self.generation_tokens:
            self._frozen = self._frozen + [(self._new_id(), _reference([d for _, fa in levels for d in _docs(fa)]))]
            del self._frozen[: max(0, len(self._frozen) - (self.generations - 1))]
            levels = []
        else:
            while len(levels) >= 2 and len(levels[-2][1]) <= cache_mod.MERGE_RATIO * len(levels[-1][1]):
                levels[-2:] = [(self._new_id(), _reference([d for _, fa in levels[-2:] for d in _docs(fa)]))]
        self._levels = levels
        self._touch()


def _docs(fa):
    bounds = fa.doc_starts.tolist() + [len(fa)]
    return [fa.tokens[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("max_tokens,generations,alphabet", [(3000, 3, 4), (800, 2, 50_000), (40, 4, 3)])
def test_cache_levels_match_the_per_document_cache_after_every_add(max_tokens, generations, alphabet):
    """Same sources (ids, documents and every array) and the same next id after every add, with
    1-token and repeated documents; and a save/load round trip rebuilds the same sources."""
    rng = np.random.default_rng(max_tokens)
    new, old = ResponseCache(max_tokens, generations), _PerDocumentCache(max_tokens, generations)
    docs = []
    for step in range(220):
        if docs and rng.random() < 0.15:
            doc = docs[int(rng.integers(0, len(docs)))]
        else:
            doc = rng.integers(0, alphabet, 1 if rng.random() < 0.2 else int(rng.integers(1, 120))).tolist()
        docs.append(doc)
        new.add(doc)
        old.add(doc)
        got, want = new.sources()[1], old.sources()[1]
        assert [g for g, _ in got] == [g for g, _ in want] and new._next_id == old._next_id
        assert len(new._frozen) == len(old._frozen)
        for (_, a), (_, b) in zip(got, want):
            _assert_same(a, b)
        if step % 55 == 54:
            loaded = ResponseCache.from_bytes(new.to_bytes())
            assert [g for g, _ in loaded.sources()[1]] == [g for g, _ in got] and loaded._next_id == new._next_id
            for (_, a), (_, b) in zip(loaded.sources()[1], got):
                _assert_same(a, b)


def test_save_and_load_round_trip(tmp_path):
    cache = ResponseCache(2000, 3)
    rng = np.random.default_rng(5)
    for _ in range(90):
        cache.add(rng.integers(0, 7, int(rng.integers(1, 60))).tolist())
    cache.save(tmp_path / "c.rc")
    loaded = ResponseCache.load(tmp_path / "c.rc")
    assert loaded.to_bytes() == cache.to_bytes()
    for (ga, a), (gb, b) in zip(loaded.sources()[1], cache.sources()[1]):
        assert ga == gb
        _assert_same(a, b)


@pytest.mark.parametrize("max_tokens,generations,alphabet", [(3000, 3, 4), (800, 2, 50_000), (40, 4, 3)])
def test_add_many_puts_the_documents_where_adding_them_one_by_one_does(max_tokens, generations, alphabet):
    """Batches of 0-12 documents (1-token, empty and repeated ones; batches that fill one generation or
    several): after every batch the frozen generations hold the documents of the cache fed one by one,
    the live generation the same documents in order, every level is the fresh build over its
    documents, levels keep the merge rule and their ids are distinct, the version moved once; a
    save/load round trip rebuilds the same sources."""
    rng = np.random.default_rng(max_tokens + 1)
    batched, single = ResponseCache(max_tokens, generations), ResponseCache(max_tokens, generations)
    history = []
    for step in range(120):
        batch = []
        for _ in range(int(rng.integers(0, 13))):
            if history and rng.random() < 0.15:
                doc = history[int(rng.integers(0, len(history)))]
            else:
                doc = rng.integers(0, alphabet, 1 if rng.random() < 0.2 else int(rng.integers(1, 120))).tolist()
            history.append(doc)
            batch.append(doc)
        if rng.random() < 0.1:
            batch.insert(int(rng.integers(0, len(batch) + 1)), [])  # an empty document is skipped
        version = batched.version
        batched.add_many(batch)
        for doc in batch:
            single.add(doc)
        assert (batched.version != version) == any(batch)
        assert ([[d.tolist() for d in _docs(fa)] for _, fa in batched._frozen]
                == [[d.tolist() for d in _docs(fa)] for _, fa in single._frozen])
        assert ([d.tolist() for _, fa in batched._levels for d in _docs(fa)]
                == [d.tolist() for _, fa in single._levels for d in _docs(fa)])
        for _, fa in batched.sources()[1]:
            _assert_same(fa, _reference(_docs(fa)))
        sizes = [len(fa) for _, fa in batched._levels]
        assert all(a > cache_mod.MERGE_RATIO * b for a, b in zip(sizes, sizes[1:])), sizes
        ids = [g for g, _ in batched.sources()[1]]
        assert len(set(ids)) == len(ids) and all(g < batched._next_id for g in ids)
        if step % 40 == 39:
            loaded = ResponseCache.from_bytes(batched.to_bytes())
            assert [g for g, _ in loaded.sources()[1]] == ids
            for (_, a), (_, b) in zip(loaded.sources()[1], batched.sources()[1]):
                _assert_same(a, b)


def test_add_many_refuses_a_bad_document_and_keeps_the_cache():
    cache = ResponseCache(1000, 2)
    cache.add_many([[1, 2, 3]])
    before, version = cache.to_bytes(), cache.version
    with pytest.raises(BadInputError):
        cache.add_many([[4, 5], [-1]])
    with pytest.raises(BadInputTypeError, match=r"documents\[1\]"):
        cache.add_many([[4, 5], "text"])
    with pytest.raises(BadInputTypeError, match="list of token id sequences"):
        cache.add_many(7)
    assert cache.to_bytes() == before and cache.version == version
