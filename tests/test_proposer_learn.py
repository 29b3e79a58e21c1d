"""Learned continuation confidence (`_kernels/learn.py`) against brute force: the length
buckets, the counts a session collects from its committed tokens (a direct count over the
documents), the confidence formula, and trees drafted with learned confidences against the
exhaustive proposer; plus the set-up moved out of the first proposal."""

import random

import numpy as np
import pytest

from suffixspec import Proposer, SuffixAutomaton
from suffixspec._kernels import learn as lk

from support import naive
from support.naive import learned_conf
from support.trees import check_tree_invariants, corpus_rule, naive_part_candidates, tree_paths


def _bucket(length):
    edges = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    return max(i for i, e in enumerate(edges) if length >= e)


def test_buckets_equal_their_definition():
    for length in range(1, 300):
        assert lk.bucket(length) == _bucket(length), length


def _occurs(docs, pattern):
    return naive.count(docs, pattern) > 0


def _count_events(docs, text_before, tokens, start_len, cls, stats, min_match=1):
    """The events of a cursor with matched length `start_len` over `tokens`, by brute force: at each
    token, a trial at the current length, a hit when (matched suffix + token) occurs in `docs`; the
    next length is the longest suffix of the context, at most one longer, that occurs in `docs`."""
    ctx = list(text_before)
    length = start_len
    for t in tokens:
        if length >= min_match:
            b = _bucket(length)
            stats[cls, b, lk.TRIALS] += 1
            if _occurs(docs, ctx[len(ctx) - length :] + [t]):
                stats[cls, b, lk.HITS] += 1
        ctx.append(t)
        length = max([0] + [k for k in range(1, length + 2) if _occurs(docs, ctx[len(ctx) - k :])])
    return length


def _own_match_length(text):
    """Longest suffix of `text` that also ends earlier in it (the request's own match)."""
    return max([0] + [k for k in range(1, len(text)) if naive.count([text], text[len(text) - k :]) >= 2])


@pytest.mark.parametrize("alphabet", [2, 3, 5])
def test_learned_counts_equal_a_direct_count(alphabet):
    """After every extension, the session's counts and the proposer's equal a direct count of each
    committed token's event in the request (through the text before that extension) and in each
    corpus; a second session adds to the proposer's counts only."""
    rng = random.Random(alphabet)
    for trial in range(12):
        corpus_docs = [[rng.randrange(alphabet) for _ in range(rng.randrange(3, 30))] for _ in range(rng.randrange(1, 3))]
        sam = SuffixAutomaton()
        for d in corpus_docs:
            sam.add_document(d)
        prop = Proposer(corpus=sam.freeze(), global_cache=False)
        expect_global = lk.new_stats()
        for _ in range(2):
            text = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 12))]
            session = prop.start(text)
            expect = lk.new_stats()
            corpus_len = naive.match_length(corpus_docs, text)
            for _ in range(rng.randrange(1, 6)):
                toks = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 5))]
                _count_events([text], text, toks, _own_match_length(text), lk.CLS_OWN, expect)
                corpus_len = _count_events(corpus_docs, text, toks, corpus_len, lk.CLS_CORPUS, expect)
                session.extend(toks)
                text = text + toks
                assert np.array_equal(session._stats, expect), (trial, text)
            expect_global += expect
            assert np.array_equal(prop.learned(), expect_global)
            session.close()


def test_conf_kernel_equals_formula_and_reduces_to_the_prior():
    rng = np.random.default_rng(4)
    empty = lk.new_stats()
    for length in range(1, 80):
        assert lk.conf(empty, empty, lk.CLS_CORPUS, length, 1.0, 8.0, 16.0) == length / (length + 1.0)
    for _ in range(200):
        glob, local = lk.new_stats(), lk.new_stats()
        glob[..., 1] = rng.integers(0, 5, glob.shape[:2])
        glob[..., 0] = np.minimum(glob[..., 1], rng.integers(0, 5, glob.shape[:2]))
        local[..., 1] = rng.integers(0, 3, local.shape[:2])
        local[..., 0] = np.minimum(local[..., 1], rng.integers(0, 3, local.shape[:2]))
        cls, length = int(rng.integers(0, 3)), int(rng.integers(1, 100))
        assert lk.conf(local, glob, cls, length, 1.0, 8.0, 16.0) == pytest.approx(learned_conf(local, glob, cls, length))


def test_global_counts_fade_past_the_cap():
    local, glob = lk.new_stats(), lk.new_stats()
    toks = np.zeros(3 * int(lk.GLOBAL_CAP), np.int32)
    sam = SuffixAutomaton([0, 0]).freeze()  # every 0 continues a match of length 1
    lk.count_frozen(sam.offsets, sam.etok, sam.eto, sam.links, sam.lens, sam.tokens, sam.plink, 0, 0, toks, 1, lk.CLS_CORPUS,
                    local, glob)
    assert glob[lk.CLS_CORPUS, :, lk.TRIALS].max() <= lk.GLOBAL_CAP
    assert local.sum() > glob.sum()  # the session's own counts never fade


@pytest.mark.parametrize("alphabet", [2, 3])
def test_trees_with_learned_confidence_equal_brute_force(alphabet):
    """With counts learned from earlier extensions (and an earlier request), the tree is the
    `budget` best paths of the union of the request's and the corpus's exhaustive candidates, each
    step scored with the learned confidence of its source class and length."""
    rng = random.Random(50 + alphabet)
    for trial in range(25):
        corpus_docs = [[rng.randrange(alphabet) for _ in range(rng.randrange(3, 25))] for _ in range(2)]
        sam = SuffixAutomaton()
        for d in corpus_docs:
            sam.add_document(d)
        prop = Proposer(corpus=sam.freeze(), global_cache=False, max_children=64, max_depth=5, match_prior=1.0,
                        recency=0.5, match_levels=2)
        warm = prop.start([rng.randrange(alphabet) for _ in range(6)])
        warm.extend([rng.randrange(alphabet) for _ in range(10)])
        warm.close()
        text = [rng.randrange(alphabet) for _ in range(rng.randrange(2, 12))]
        session = prop.start(text)
        more = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 12))]
        session.extend(more)
        text += more
        local, glob = session._stats.copy(), prop.learned()
        budget = rng.randrange(1, 20)
        tree = session.propose(budget)
        check_tree_invariants(tree)
        # match_levels 2: 2 matched suffixes per source
        union = naive_part_candidates([text], text, 2, 2, 1.0, 0.5, 5, lambda n: learned_conf(local, glob, lk.CLS_OWN, n))
        for path, score in naive_part_candidates(corpus_docs, text, 1, 2, 1.0, 0.5, 5,
                                                 lambda n: learned_conf(local, glob, lk.CLS_CORPUS, n),
                                                 corpus=corpus_rule(session, 0)).items():
            union[path] = max(union.get(path, 0.0), score)
        got = tree_paths(tree)
        for path, score in got.items():
            assert path in union and score == pytest.approx(union[path]), (trial, path)
        assert sorted(got.values(), reverse=True) == pytest.approx(sorted(union.values(), reverse=True)[:budget]), trial


def test_a_stale_source_loses_confidence_to_the_request():
    """A corpus whose long matches keep diverging ends up trusted less than the request's own
    text at the same matched length, so its drafts rank below the request's."""
    rng = np.random.default_rng(0)
    block = rng.integers(10, 60, 40).tolist()
    stale = SuffixAutomaton([t if i % 6 else 99 for i, t in enumerate(block * 3)]).freeze()  # diverges every 6
    prop = Proposer(corpus=stale, global_cache=False)
    for _ in range(4):
        s = prop.start(block)
        s.extend(block * 2)
        s.close()
    got = prop.learned()
    own = got[lk.CLS_OWN, :, 0].sum() / got[lk.CLS_OWN, :, 1].sum()
    corpus = got[lk.CLS_CORPUS, :, 0].sum() / got[lk.CLS_CORPUS, :, 1].sum()
    assert own > 0.9 > corpus
    assert lk.conf(lk.new_stats(), got, lk.CLS_CORPUS, 5, 1.0, 8.0, 16.0) < lk.conf(lk.new_stats(), got, lk.CLS_OWN, 5,
                                                                                     1.0, 8.0, 16.0)


def test_without_learning_the_counts_stay_empty_and_trees_keep_the_prior():
    prop = Proposer(learn=False, global_cache=False)
    s = prop.start([1, 2, 3, 1, 2])
    s.extend([3, 1, 2])
    assert not prop.learned().any() and not s._stats.any()
    tree = s.propose(4)
    assert tree.tokens.tolist()[:1] == [3]


def test_start_does_the_set_up_so_the_first_proposal_is_hot():
    """Sources synced, counts online, the frame and the workspace built in `start`: the first
    proposal takes the hot path (no sync, no frame built in it) and equals a later one's tree."""
    prop = Proposer(corpus=SuffixAutomaton([1, 2, 3, 4, 5, 6]).freeze())
    s = prop.start([9, 1, 2, 3])
    assert s._hot is not None and s._src is prop._sources
    frame = s._frame
    first = s.propose(8)
    assert s._frame is frame
    again = s.propose(8)
    assert first.tokens.tolist() == again.tokens.tolist() == [4, 5, 6][: len(first)]


def _naive_context_bound(traces, budget, corpus_docs):
    """The context bound by brute force over token lists (suffixspec.draft.simulate's docstring)."""
    history, rounds, total = [], 0, 0
    for prompt, out in traces:
        text, pos = list(prompt), 0
        while pos < len(out):
            ahead = out[pos : pos + budget]
            best = 0
            own = max([0] + [k for k in range(1, len(text)) if naive.count([text[:-1]], text[len(text) - k :]) > 0])
            sources = [([text], own)] + [(docs, naive.match_length(docs, text)) for docs in (history, corpus_docs) if docs]
            for docs, n in sources:
                if n >= 1:
                    a = 0
                    while a < len(ahead) and naive.count(docs, text[len(text) - n :] + ahead[: a + 1]) > 0:
                        a += 1
                    best = max(best, a)
            commit = out[pos : pos + best + 1]
            text += commit
            pos += len(commit)
            rounds += 1
        history.append(list(out))
        total += len(out)
    return total / rounds


def test_context_bound_equals_brute_force_and_lies_under_the_copy_oracle():
    from suffixspec.draft.simulate import Trace, context_bound_mean_accepted, oracle_mean_accepted

    rng = random.Random(5)
    for trial in range(30):
        alphabet = rng.choice([2, 3, 4])
        corpus_docs = [[rng.randrange(alphabet) for _ in range(rng.randrange(2, 20))] for _ in range(rng.randrange(1, 3))]
        sam = SuffixAutomaton()
        for d in corpus_docs:
            sam.add_document(d)
        pairs = [([rng.randrange(alphabet) for _ in range(rng.randrange(1, 12))],
                  [rng.randrange(alphabet) for _ in range(rng.randrange(1, 15))]) for _ in range(rng.randrange(1, 4))]
        traces = [Trace(np.array(p, np.int32), np.array(o, np.int32)) for p, o in pairs]
        budget = rng.randrange(1, 8)
        for corpora, docs in (((), []), ((sam.freeze(),), corpus_docs)):
            got = context_bound_mean_accepted(traces, budget, corpora)
            assert got == pytest.approx(_naive_context_bound(pairs, budget, docs)), trial
            assert got <= oracle_mean_accepted(traces, budget, corpora) + 1e-9
