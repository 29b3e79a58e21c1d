"""Corpus locality: a session's anchor in each corpus source against a brute-force scan of the
corpus text, round after round, and the continuation the anchor picks among equally frequent ones.

The rule (`session._anchor`, `session._start_cursor`): once the session's longest match in a corpus
is at least ANCHOR_MIN tokens long and occurs once, or its most recent end lies within NEAR_BACK of
the previous anchor moved on by the tokens committed since, the anchor is that end; otherwise the
moved anchor (-1 while there is none). After a prompt, the rule is applied at points of its last
ANCHOR_TAIL tokens too. The draft kernel gives a corpus part's bonus to the child whose most recent
end lies nearest the anchor moved on by the node's depth (`test_draft_kernel.py` checks the trees
against the reference with anchors; here: what that means on a corpus).
"""

import random

import numpy as np

from suffixspec import Proposer, SuffixAutomaton
from suffixspec._kernels import draft as dk
from suffixspec.draft import session as sess


def _brute_match(text, starts, ctx):
    """(length, end positions) of the longest suffix of ctx occurring in one document of text."""
    doc_of = np.searchsorted(starts, np.arange(len(text)), side="right") - 1
    best, ends = 0, []
    for e in range(len(text)):
        n = 0
        while n < len(ctx) and e - n >= starts[doc_of[e]] and text[e - n] == ctx[len(ctx) - 1 - n]:
            n += 1
        if n > best:
            best, ends = n, [e]
        elif n == best and n > 0:
            ends.append(e)
    return best, ends


def _brute_anchor(text, starts, ctx, moved):
    length, ends = _brute_match(text, starts, ctx)
    if length >= sess.ANCHOR_MIN:
        last = max(ends)
        if len(ends) == 1 or (moved >= 0 and abs(last - moved) <= dk.NEAR_BACK):
            return last
    return moved


def _brute_start(text, starts, prompt):
    n, anchor, at = len(prompt), -1, 0
    points = list(range(max(0, n - sess.ANCHOR_TAIL), n + 1, sess.ANCHOR_TAIL // sess.ANCHOR_STEPS))
    if points[-1] < n:
        points.append(n)
    for end in points:
        anchor = _brute_anchor(text, starts, prompt[:end], anchor + (end - at) if anchor >= 0 else -1)
        at = end
    return anchor


def _edited_copy(rng, doc, alphabet):
    out = []
    for t in doc:
        r = rng.random()
        if r < 0.05:
            continue  # deleted
        out.append(t if r > 0.12 else rng.randrange(alphabet))
        if rng.random() < 0.04:
            out.append(rng.randrange(alphabet))  # inserted
    return out


def test_anchors_follow_the_rule_against_a_brute_force_scan():
    checked = anchored = 0
    for seed in range(5):
        rng = random.Random(seed)
        alphabet = rng.choice([3, 6, 12])
        docs = [[rng.randrange(alphabet) for _ in range(rng.randrange(30, 160))] for _ in range(rng.randrange(1, 4))]
        corpus = SuffixAutomaton()
        for d in docs:
            corpus.add_document(d)
        fa = corpus.freeze()
        text, starts = fa.tokens.tolist(), np.asarray(fa.doc_starts)
        prop = Proposer(corpus=fa, global_cache=False)
        new = _edited_copy(rng, docs[rng.randrange(len(docs))], alphabet)  # "the next release" of a document
        cut = rng.randrange(5, max(6, len(new) // 2))
        s = prop.start(new[:cut])
        want = _brute_start(text, starts, new[:cut])
        assert int(s._cur[0, dk.CUR_ANCHOR]) == want, (seed, "start")
        pos = cut
        while pos < len(new):
            step = rng.randrange(1, 6)
            s.extend(new[pos : pos + step])
            want = _brute_anchor(text, starts, new[: pos + step], want + len(new[pos : pos + step]) if want >= 0 else -1)
            pos += step
            assert int(s._cur[0, dk.CUR_ANCHOR]) == want, (seed, pos)
            checked += 1
            anchored += want >= 0
        s.close()
    assert checked > 50 and anchored > checked // 3


def _first_child(prop, prompt):
    s = prop.start(prompt)
    tree = s.propose(4)
    s.close()
    return int(tree.tokens[np.flatnonzero(tree.parents == -1)[0]])


def test_the_continuation_near_the_anchor_wins_a_tie_whatever_the_document_order():
    """Two documents share a pattern continued differently (once each). A prompt that follows the
    first document, then inserts a token of its own, then the shared pattern: the first document's
    continuation comes first, with either document indexed last; without locality (weight 0) the
    tie falls to the gather order, the same for both orders."""
    rng = random.Random(3)
    mine = [rng.randrange(100, 200) for _ in range(24)]  # only in the first document
    other = [rng.randrange(200, 300) for _ in range(24)]
    shared = [5, 6, 7, 8]
    tail = [rng.randrange(300, 400) for _ in range(2 * (dk.NEAR_BACK + dk.NEAR_AHEAD))]  # documents far apart
    first, second = mine + shared + [30, 31, 32] + tail, other + shared + [20, 21, 22] + tail[::-1]
    prompt = mine + [999] + shared
    for order in ([first, second], [second, first]):
        corpus = SuffixAutomaton()
        for d in order:
            corpus.add_document(d)
        fa = corpus.freeze()
        assert _first_child(Proposer(corpus=fa, global_cache=False), prompt) == 30
        assert _first_child(Proposer(corpus=fa, global_cache=False, corpus_locality=0.0), prompt) == 20
