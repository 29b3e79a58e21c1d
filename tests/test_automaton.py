"""SuffixAutomaton and FrozenAutomaton against the brute-force reference in naive.py."""

import pickle
import random

import numpy as np
import pytest

from suffixspec import BadInputError, BadInputTypeError, FrozenAutomaton, SuffixAutomaton
from suffixspec.errors import InternalError

from support import naive


def _check_live(sam):
    """The live frame the proposal kernels read names the automaton's current arrays."""
    from suffixspec._kernels import sam as sk

    if not isinstance(sam, SuffixAutomaton):
        return
    want = np.zeros(sk.LIVE_LEN, np.int64)
    sk.write_live(want, sam._S, sam._E, sam._L, sam._M, sam._stack)
    assert sam._live.tolist() == want.tolist()


def _check_queries(sam, docs, rng, n_queries=6):
    """Compare match lengths, counts and continuations on random and in-text patterns."""
    _check_live(sam)
    flat = [t for d in docs for t in d]
    alphabet = sorted(set(flat)) or [0]
    assert len(sam) == len(flat)
    for _ in range(n_queries):
        if flat and rng.random() < 0.7:
            i = rng.randrange(len(flat))
            j = rng.randrange(i, min(len(flat), i + 8)) + 1
            pattern = flat[i:j]
            if rng.random() < 0.3:
                pattern = pattern + [rng.choice(alphabet)]
        else:
            pattern = [rng.choice(alphabet + [max(alphabet) + 1]) for _ in range(rng.randrange(0, 6))]
        assert sam.count(pattern) == naive.count(docs, pattern), pattern
        context = [rng.choice(alphabet) for _ in range(rng.randrange(0, 12))] + pattern
        state, length = sam.match(context)
        assert length == naive.match_length(docs, context), context
        assert sam.match_length(context) == length
        suffix = context[len(context) - length :]
        cont = sam.continuations(state).as_dict()
        assert cont == naive.continuations(docs, suffix), (context, suffix)
    _check_live(sam)  # count queries may have grown the link-cut stack


def test_live_frame_reads_back_the_arrays_through_growth_modes_and_pickling():
    """Kernels view (S, E, L, M, stack) through the live frame's addresses: after bulk building,
    online growth (arrays reallocated many times), count queries and a pickle round trip, reading
    the frame must give back exactly the automaton's arrays."""
    from numba import njit

    from suffixspec._kernels import sam as sk

    @njit
    def read(live):
        S, E, L, M, stack = sk.live_arrays(live)
        return S.copy(), E.copy(), L.copy(), M.copy(), stack.shape[0]

    def same(sam):
        S, E, L, M, n_stack = read(sam._live)
        assert np.array_equal(S, sam._S) and np.array_equal(E, sam._E) and np.array_equal(L, sam._L)
        assert np.array_equal(M, sam._M) and n_stack == sam._stack.shape[0]

    rng = np.random.default_rng(5)
    sam = SuffixAutomaton(rng.integers(0, 7, 300))
    same(sam)
    sam.count([1, 2])  # settles counts, not yet online
    same(sam)
    for _ in range(40):
        sam.extend(rng.integers(0, 7, int(rng.integers(1, 200))))  # online: S, E, L grow
        same(sam)
    sam.extend(np.zeros(20_000, np.int64))  # a long run: deep link-cut paths
    toks = sam.tokens.tolist()
    assert sam.count([0] * 5) == sum(toks[i : i + 5] == [0] * 5 for i in range(len(toks) - 4))
    same(sam)
    sam2 = pickle.loads(pickle.dumps(sam))
    same(sam2)
    sam2.extend([3, 4])
    same(sam2)
    with pytest.raises(InternalError, match="int32"):
        sk.write_live(np.zeros(sk.LIVE_LEN, np.int64), sam._S.astype(np.int64), sam._E, sam._L, sam._M, sam._stack)


@pytest.mark.parametrize("alphabet", [2, 3, 4, 5])
def test_random_small_alphabets_after_every_append(alphabet):
    rng = random.Random(alphabet)
    for trial in range(60):
        sam = SuffixAutomaton()
        docs = [[]]
        n = rng.randrange(1, 50)
        for _ in range(n):
            if rng.random() < 0.05 and docs[-1]:
                sam.start_document()
                docs.append([])
            tok = rng.randrange(alphabet)
            sam.append(tok)
            docs[-1].append(tok)
            _check_queries(sam, docs, rng, n_queries=3)


@pytest.mark.parametrize("alphabet", [2, 3, 5])
def test_bulk_build_then_online_appends(alphabet):
    """A bulk first extend (counts settled lazily) followed by one-token appends."""
    rng = random.Random(100 + alphabet)
    for trial in range(60):
        docs = [[rng.randrange(alphabet) for _ in range(rng.randrange(0, 80))]]
        sam = SuffixAutomaton(docs[0])
        if rng.random() < 0.5:
            assert sam.match_length(docs[0][-3:]) == min(3, len(docs[0]))  # match-only keeps bulk mode
        _check_queries(sam, docs, rng, n_queries=10)
        for _ in range(rng.randrange(1, 30)):
            if rng.random() < 0.1 and docs[-1]:
                sam.start_document()
                docs.append([])
            chunk = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 4))]
            sam.extend(chunk)
            docs[-1].extend(chunk)
            _check_queries(sam, docs, rng, n_queries=3)


def test_many_documents_bulk():
    rng = random.Random(7)
    for trial in range(40):
        sam = SuffixAutomaton()
        docs = []
        for _ in range(rng.randrange(1, 8)):
            d = [rng.randrange(3) for _ in range(rng.randrange(1, 20))]
            sam.add_document(d)
            docs.append(d)
        _check_queries(sam, docs, rng, n_queries=20)
        assert sam.n_documents == len(docs)


def test_real_token_streams(real_streams):
    rng = random.Random(11)
    for stream in real_streams:
        stream = stream[:1500]
        sam = SuffixAutomaton(stream[:1000])
        docs = [stream[:1000]]
        _check_queries(sam, docs, rng, n_queries=40)
        for tok in stream[1000:]:
            sam.append(tok)
            docs[0].append(tok)
            if rng.random() < 0.05:
                _check_queries(sam, docs, rng, n_queries=2)
        _check_queries(sam, docs, rng, n_queries=40)


def test_cursor_follows_growing_context_and_growing_text(real_streams):
    rng = random.Random(5)
    for stream in real_streams[:3] + [[rng.randrange(3) for _ in range(400)]]:
        text, context = stream[:300], stream[300:500]
        sam = SuffixAutomaton(text)
        cur = sam.cursor()
        for i, tok in enumerate(context):
            length = cur.append(tok)
            assert length == naive.match_length([text], context[: i + 1])
            assert (cur.state, cur.length) == sam.match(context[: i + 1])
            if i % 7 == 0:
                # the indexed text grows under the cursor (clones may split its state)
                new = rng.choice(stream)
                sam.append(new)
                text = text + [new]
                cur.advance([])
                assert cur.length == naive.match_length([text], context[: i + 1])


def test_following_stops_at_document_end():
    sam = SuffixAutomaton()
    sam.add_document([1, 2, 3, 4])
    sam.add_document([1, 2, 9])
    assert sam.following(0, 10).tolist() == [2, 3, 4]
    assert sam.following(3, 5).tolist() == []
    assert sam.following(4, 1).tolist() == [2]
    assert sam.following(-1, 2).tolist() == [1, 2]
    state = sam.locate([1, 2])
    last = sam.state_last_end(state)
    assert last == 5 and sam.following(last, 4).tolist() == [9]
    with pytest.raises(BadInputError, match="position"):
        sam.following(7, 1)


def _assert_same(a, b, docs, rng):
    _check_queries(a, docs, rng, n_queries=30)
    _check_queries(b, docs, rng, n_queries=30)


def test_freeze_and_pickle_round_trip(real_streams):
    rng = random.Random(3)
    stream = real_streams[2][:2000]
    sam = SuffixAutomaton(stream[:1500])
    for tok in stream[1500:]:
        sam.append(tok)
    docs = [stream]
    frozen = sam.freeze()
    assert isinstance(frozen, FrozenAutomaton)
    assert frozen.nbytes < sam.nbytes
    _assert_same(sam, frozen, docs, rng)
    for obj in (sam, frozen):
        copy = pickle.loads(pickle.dumps(obj))
        _check_queries(copy, docs, rng, n_queries=30)
    # a pickled online automaton keeps growing correctly
    copy = pickle.loads(pickle.dumps(sam))
    copy.extend(stream[:50])
    _check_queries(copy, [stream + stream[:50]], rng, n_queries=30)
    # the frozen copy is independent of later growth
    sam.extend([123456] * 3)
    assert frozen.count([123456]) == 0 and sam.count([123456]) == 3


def test_pickle_bulk_mode_and_empty():
    for tokens in ([], [4, 4, 4, 5]):
        sam = SuffixAutomaton(tokens)
        copy = pickle.loads(pickle.dumps(sam))
        assert len(copy) == len(tokens) and copy.count([4]) == tokens.count(4)
        copy.extend([4])
        assert copy.count([4]) == tokens.count(4) + 1


def test_empty_and_single_token():
    sam = SuffixAutomaton()
    assert len(sam) == 0 and sam.match_length([1, 2]) == 0 and sam.count([1]) == 0 and sam.count([]) == 0
    assert len(sam.continuations(0)) == 0
    sam.append(7)
    assert sam.count([7]) == 1 and sam.match_length([3, 7]) == 1
    assert sam.continuations(0).as_dict() == {7: (1, 0)}
    assert sam.freeze().count([7]) == 1


def test_single_token_repeated_100k_online():
    n = 100_000
    sam = SuffixAutomaton()
    cur = sam.cursor()
    for i in range(n):
        sam.append(5)
        cur.append(5)
        if i % 997 == 0:
            assert sam.count([5] * 3) == max(0, i + 1 - 2)
    assert cur.length == n
    assert sam.count([5]) == n and sam.count([5] * 1000) == n - 999
    state = sam.locate([5] * 50)
    assert sam.continuations(state).as_dict() == {5: (n - 50, n - 1)}
    assert sam.n_states == n + 1


def test_short_period_and_largest_ids():
    big = 2**31 - 1
    period = [big, 0, big - 1, 17]
    tokens = period * 5000
    sam = SuffixAutomaton(tokens)
    assert sam.count(period) == 5000
    assert sam.count(period * 100 + [big]) == 5000 - 100
    assert sam.match_length([3] + period * 3) == 12
    s = sam.locate([big, 0])
    assert sam.continuations(s).as_dict() == {big - 1: (5000, len(tokens) - 2)}
    sam.extend(np.array(period, dtype=np.uint32))
    assert sam.count([big]) == 5001


@pytest.mark.parametrize(
    "bad, exc, words",
    [
        ([1, -1], BadInputError, "got -1"),
        ([2**31], BadInputError, "got 2147483648"),
        ([1.0, 2.0], BadInputTypeError, "float"),
        (np.array([0.5]), BadInputTypeError, "float"),
        (np.zeros((2, 2), np.int64), BadInputError, "shape"),
        (None, BadInputTypeError, "None"),
        ("abc", BadInputTypeError, "str"),
        (3, BadInputTypeError, "int"),
        ([True, False], BadInputTypeError, "bool"),
        ([1, "a"], BadInputTypeError, "dtype"),
        ([2**70], BadInputError, "got 1180591620717411303424"),
    ],
)
def test_bad_input_is_rejected_clearly(bad, exc, words):
    sam = SuffixAutomaton([1, 2, 3])
    with pytest.raises(exc, match="expected") as info:
        sam.extend(bad)
    assert words in str(info.value)
    with pytest.raises(exc):
        sam.count(bad)
    assert len(sam) == 3 and sam.count([1, 2, 3]) == 1  # nothing changed


def test_torch_tensors_accepted_and_float_tensors_rejected():
    torch = pytest.importorskip("torch")
    sam = SuffixAutomaton(torch.tensor([1, 2, 1, 2]))
    assert sam.count(torch.tensor([1, 2], dtype=torch.int32)) == 2
    with pytest.raises(BadInputTypeError, match="torch"):
        sam.extend(torch.tensor([1.0]))
    with pytest.raises(BadInputError, match="shape"):
        sam.extend(torch.zeros((2, 2), dtype=torch.long))


def test_bad_state_ids():
    sam = SuffixAutomaton([1, 2])
    with pytest.raises(BadInputError, match="state id"):
        sam.continuations(99)
    with pytest.raises(BadInputTypeError):
        sam.continuations(1.5)


def test_nbytes_counts_spare_capacity_and_grows():
    sam = SuffixAutomaton()
    small = sam.nbytes
    sam.extend(np.arange(10_000) % 97)
    assert sam.nbytes > small
    assert sam.nbytes >= sam._S.nbytes + sam._E.nbytes + sam._H.nbytes + sam._T.nbytes


def test_frozen_documents_are_the_documents_it_was_built_over():
    rng = np.random.default_rng(11)
    docs = [rng.integers(0, 7, int(n)).tolist() for n in rng.integers(1, 30, 9)]
    sam = SuffixAutomaton()
    for d in docs:
        sam.add_document(d)
    assert [d.tolist() for d in sam.freeze().documents()] == docs
    tokens = np.concatenate([np.asarray(d, np.int32) for d in docs])
    starts = np.cumsum([0] + [len(d) for d in docs[:-1]], dtype=np.int64)
    assert [d.tolist() for d in FrozenAutomaton.from_documents(tokens, starts).documents()] == docs
