"""The draft kernel (`_kernels/draft.expand`) against its plain-Python reference (`naive.draft_tree`).

Random small-alphabet texts and corpora, proposed round after round while the session commits
tokens (so learned confidences, the sibling calibration and the group table fill in): every tree
must be the reference's exactly, node for node (tokens, parents, groups; scores, shares and steps
within float tolerance). The reference reads the automata through their public queries, the own
automaton's children in its edge-list order (the order the kernel gathers them: it breaks ties).
"""

import random

import pytest

from suffixspec import Proposer, SuffixAutomaton
from suffixspec._kernels import draft as dk
from suffixspec._kernels import sam as sk

from support import naive


def _own_children(sam):
    """children(-1, state) of the session's own automaton, in edge-list order."""
    S, E = sam._S, sam._E

    def kids(v):
        out = []
        e = S[v, sk.HEAD]
        while e != -1:
            w = int(E[e, sk.TO])
            out.append((int(E[e, sk.TOK]), w, sam.state_count(w), sam.state_last_end(w)))
            e = E[e, sk.NEXT]
        if len(out) == 1:  # a lone child's share is 1: the kernel reads no count
            out = [(out[0][0], out[0][1], 1, 0)]
        return out
    return kids


def _frozen_children(fa, v):
    c = fa.continuations(v)
    return [(int(t), int(w), int(n), int(last)) for t, w, n, last in zip(c.tokens, c.states, c.counts, c.last_ends)]


def _parts(session, prop):
    """The session's parts as `propose.py` lists them: (source, class, state, length)."""
    sam, out = session._sam, []
    last = sam.last_state
    state = sam.state_link(last) if last > 0 else 0
    length = sam.state_length(state) if state > 0 else 0
    for _ in range(prop.match_levels):
        if length < prop.min_match:
            break
        out.append((-1, naive.CLS_OWN, state, length, -1))
        state = sam.state_link(state) if state > 0 else 0
        length = sam.state_length(state) if state > 0 else 0
    for j, fa in enumerate(session._automata):
        state, length, anchor = (int(x) for x in session._cur[j])
        if state < 0:
            continue
        for _ in range(prop.match_levels):
            if length < prop.min_match:
                break
            out.append((j, int(session._cls[j]), state, length, anchor))
            state = fa.state_link(state)
            length = fa.state_length(state) if state > 0 else 0
    return out


def _reference(session, prop, budget):
    p = prop.params
    knobs = dict(match_prior=p[dk.P_MATCH_PRIOR], recency=p[dk.P_RECENCY], min_prob=p[dk.P_MIN_PROB],
                 max_depth=p[dk.P_MAX_DEPTH], max_children=int(p[dk.P_MAX_CHILDREN]),
                 prior_strength=p[dk.P_PRIOR_STRENGTH], session_strength=p[dk.P_SESSION_STRENGTH],
                 cal_strength=p[dk.P_CAL_STRENGTH], locality=p[dk.P_CORPUS_LOCALITY],
                 near_back=p[dk.P_NEAR_BACK], near_ahead=p[dk.P_NEAR_AHEAD])
    own = _own_children(session._sam)

    def children(src, v):
        return own(v) if src < 0 else _frozen_children(session._automata[src], v)
    return naive.draft_tree(_parts(session, prop), children, knobs, session._stats.tolist(), prop._learned.tolist(),
                            prop._calibration.tolist(), prop._group_cal.tolist(), budget)


def _check(session, prop, budget, what):
    ref = _reference(session, prop, budget)
    tree = session.propose(budget)
    assert len(tree) == len(ref), what
    if not len(ref):
        return 0
    (tokens, parents, _depths, _scores, shares, groups, steps), a, e = session._judged
    assert tree.tokens.tolist() == [n["token"] for n in ref], what
    assert tree.parents.tolist() == [n["parent"] for n in ref], what
    assert groups[a:e].tolist() == [n["group"] for n in ref], what
    assert tree.scores.tolist() == pytest.approx([n["prob"] for n in ref], rel=1e-12, abs=1e-300), what
    assert shares[a:e].tolist() == pytest.approx([n["share"] for n in ref], rel=1e-12), what
    assert steps[a:e].tolist() == pytest.approx([n["step"] for n in ref], rel=1e-12), what
    return len(ref)


def _text(rng, alphabet, n):
    """A text of repeated, lightly edited blocks (copies, so trees are deep and counts differ)."""
    out = [rng.randrange(alphabet) for _ in range(8)]
    while len(out) < n:
        a = rng.randrange(len(out))
        block = out[a : a + rng.randrange(2, 12)]
        out += [t if rng.random() > 0.1 else rng.randrange(alphabet) for t in block]
    return out[:n]


@pytest.mark.parametrize("seed", range(6))
def test_kernel_trees_equal_the_reference_round_after_round(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5, 8])
    corpus = SuffixAutomaton()
    for _ in range(rng.randrange(0, 4)):
        corpus.add_document(_text(rng, alphabet, rng.randrange(10, 80)))
    kw = dict(max_children=rng.choice([1, 2, 4, 8]), max_depth=rng.choice([0, 3, 8]), recency=rng.choice([0.0, 0.5, 2.0]),
              match_prior=rng.choice([0.5, 1.0, 3.0]), corpus_locality=rng.choice([0.0, 1.0, 4.0]), min_prob=rng.choice([0.0, 1e-3, 0.05]),
              match_levels=rng.choice([1, 2, 3]), min_match=rng.choice([1, 2]), global_cache=False, learn=True)
    prop = Proposer(corpus=corpus.freeze() if len(corpus) else None, **kw)
    text = _text(rng, alphabet, 400)
    session = prop.start(text[:40])
    nodes = anchored = 0
    pos = 40
    while pos < len(text):
        budget = rng.choice([1, 3, 8, 24, 64])
        nodes += _check(session, prop, budget, (seed, pos, budget, kw))
        anchored += int((session._cur[:, dk.CUR_ANCHOR] >= 0).any())
        step = rng.randrange(1, 6)
        session.extend(text[pos : pos + step])
        pos += step
    assert nodes > 0
    if len(corpus):
        assert anchored > 0  # corpus rows had anchors, so the locality bonus was in play
        assert prop._group_cal[:, 2].sum() > 0  # groups were judged, so their factors applied
    assert prop._calibration[:, :, 2].sum() > 0


def test_reference_children_are_the_brute_force_continuations():
    """The reference reads what a brute force over the text counts (count, most recent end)."""
    rng = random.Random(7)
    text = _text(rng, 3, 120)
    sam = SuffixAutomaton(text)
    kids = _own_children(sam)
    for ctx_len in range(1, 6):
        ctx = text[-ctx_len:]
        state = sam.locate(ctx)
        if state < 0:
            continue
        got = {t: (n, last) for t, _, n, last in kids(state)}
        want = naive.continuations([text], ctx)
        if len(want) == 1:
            assert set(got) == set(want)
        else:
            assert got == want, ctx
