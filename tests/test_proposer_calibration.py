"""Sibling and source calibration (`_kernels/learn.py`: `count_tree`, `rank_factor`,
`group_factor`; `_kernels/draft.py`): the judged drafts against a brute-force judge of the trees,
the factors against their formulas, the counts a proposer collects from its own rounds, and
calibrated trees against a brute-force check of their definition (every node scores its best
part's calibrated path probability at the rank it holds among its siblings, with its part's group
factor, and nothing left out scores more than what the tree kept)."""

import bisect
import random

import numpy as np
import pytest

from suffixspec import Proposer, SuffixAutomaton
from suffixspec._kernels import learn as lk

from support import naive
from support.naive import learned_conf
from support.trees import check_tree_invariants, corpus_rule, naive_part_candidates

EDGES = [0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]


def _share_bucket(share):
    return bisect.bisect_right(EDGES, share)


def _factor(cal, rank, share, strength):
    """min over ranks r' <= rank (3+ one cell) of min(1, (hits + s) / (expected + s)), cells with trials."""
    b = _share_bucket(share)
    f = 1.0
    for r in range(min(rank, 3) + 1):
        hits, expected, trials = cal[r, b]
        if trials > 0:
            f = min(f, (hits + strength) / (expected + strength))
    return f


def _group_factor(gcal, g, strength):
    if g < 0:
        return 1.0
    hits, expected, trials = gcal[g]
    return 1.0 if trials <= 0 else min(lk.GROUP_MAX, (hits + strength) / (expected + strength))


def _group(cls, agree):
    """Corpus parts only; -1: no group (factor 1)."""
    return cls * lk.N_AGREE + min(agree, lk.N_AGREE - 1) if cls == lk.CLS_CORPUS else -1


def _judge(tokens, parents, shares, committed, cal, groups=None, steps=None, gcal=None):
    """Brute force: a node is judged when its parent's path equals the committed tokens' prefix
    and the committed tokens reach its depth; a hit when its path equals that prefix too. With
    `gcal`, its group's row counts it too, expecting its step."""
    paths, hits = [], 0
    for i in range(len(tokens)):
        p = parents[i]
        paths.append((paths[p] if p >= 0 else ()) + (int(tokens[i]),))
        path = paths[i]
        if len(path) > len(committed) or list(path[:-1]) != list(committed[: len(path) - 1]):
            continue
        rank = sum(1 for j in range(i) if parents[j] == p)
        cell = cal[min(rank, 3), _share_bucket(shares[i])]
        cell += (0.0, shares[i], 1.0)
        hit = path[-1] == committed[len(path) - 1]
        if gcal is not None and groups[i] >= 0:
            gcal[groups[i]] += (float(hit), steps[i], 1.0)
        if hit:
            cell[0] += 1.0
            hits += 1
    return hits


def _random_tree(rng, n, alphabet):
    tokens, parents = [], []
    for i in range(n):
        while True:
            p = rng.randrange(-1, i)
            t = rng.randrange(alphabet)
            if all(not (parents[j] == p and tokens[j] == t) for j in range(i)):
                break
        tokens.append(t)
        parents.append(p)
    return np.array(tokens, np.int32), np.array(parents, np.int32), np.array([rng.random() for _ in range(n)])


def test_share_buckets_and_factor_equal_their_definition():
    for share in [0.0, 0.01, 0.02, 0.0499, 0.05, 0.3, 0.95, 0.9499, 1.0] + [i / 997 for i in range(998)]:
        assert lk.share_bucket(share) == _share_bucket(share), share
    rng = np.random.default_rng(7)
    empty = lk.new_calibration()
    for _ in range(300):
        cal = lk.new_calibration()
        cal[..., lk.CAL_TRIALS] = rng.integers(0, 3, cal.shape[:2])
        cal[..., lk.CAL_EXPECT] = rng.random(cal.shape[:2]) * cal[..., lk.CAL_TRIALS]
        cal[..., lk.CAL_HITS] = np.minimum(cal[..., lk.CAL_TRIALS], rng.integers(0, 3, cal.shape[:2]))
        rank, share, strength = int(rng.integers(0, 6)), float(rng.random()), float(rng.choice([0.5, 4.0, 16.0]))
        got = lk.rank_factor(cal, rank, share, strength)
        assert got == pytest.approx(_factor(cal, rank, share, strength))
        assert 0 < got <= 1 and got <= lk.rank_factor(cal, max(rank - 1, 0), share, strength)  # never more for a later sibling
        assert lk.rank_factor(empty, rank, share, strength) == 1.0
    empty = lk.new_group_calibration()
    for _ in range(300):
        gcal = lk.new_group_calibration()
        gcal[:, lk.CAL_TRIALS] = rng.integers(0, 3, lk.N_GROUPS)
        gcal[:, lk.CAL_EXPECT] = rng.random(lk.N_GROUPS) * 3
        gcal[:, lk.CAL_HITS] = rng.random(lk.N_GROUPS) * 3
        g, strength = int(rng.integers(-1, lk.N_GROUPS)), float(rng.choice([0.5, 4.0, 16.0]))
        got = lk.group_factor(gcal, g, strength)
        assert got == pytest.approx(_group_factor(gcal, g, strength)) and 0 < got <= lk.GROUP_MAX
        assert lk.group_factor(empty, g, strength) == 1.0
    for cls in range(lk.N_CLASSES):
        for agree in range(6):
            assert lk.group(cls, agree) == _group(cls, agree) < lk.N_GROUPS
    assert lk.group(lk.CLS_CORPUS, 1) >= 0 and lk.group(lk.CLS_OWN, 1) == lk.group(lk.CLS_CACHE, 0) == -1


def test_count_tree_equals_a_brute_force_judge():
    rng = random.Random(3)
    for trial in range(300):
        n, alphabet = rng.randrange(1, 25), rng.randrange(1, 4)
        tokens, parents, shares = _random_tree(rng, n, alphabet)
        committed = np.array([rng.randrange(alphabet) for _ in range(rng.randrange(0, 8))], np.int32)
        cal = np.random.default_rng(trial).random((lk.N_RANKS, lk.N_SHARES, lk.CAL_COLS))
        gcal = np.random.default_rng(trial + 1000).random((lk.N_GROUPS, lk.CAL_COLS))
        groups = np.array([rng.randrange(-1, lk.N_GROUPS) for _ in range(n)], np.int32)
        steps = np.array([rng.random() for _ in range(n)])
        expect, gexpect = cal.copy(), gcal.copy()
        pad = rng.randrange(0, 5)  # the tree at [pad, pad + n) of the arena blocks
        blocks = [np.concatenate([np.full(pad, -7, a.dtype), a, np.full(3, -7, a.dtype)])
                  for a in (tokens, parents, shares, groups, steps)]
        hits = lk.count_tree(*blocks, pad, pad + n, committed, cal, gcal)
        assert hits == _judge(tokens, parents, shares, committed, expect, groups, steps, gexpect), trial
        assert np.allclose(cal, expect) and np.allclose(gcal, gexpect), trial


def test_calibration_counts_the_proposers_own_rounds():
    """Whatever proposes (one session, a batch), the next extension judges that tree: the
    proposer's table equals the brute-force judge over every tree it handed out."""
    rng = random.Random(11)
    docs = [[rng.randrange(3) for _ in range(60)]]
    sam = SuffixAutomaton()
    sam.add_document(docs[0])
    prop = Proposer(corpus=sam.freeze(), global_cache=False)
    expect, gexpect = lk.new_calibration(), lk.new_group_calibration()
    for request in range(3):
        s = prop.start([rng.randrange(3) for _ in range(8)])
        for round_ in range(12):
            budget = rng.randrange(1, 12)
            tree = s.propose(budget) if round_ % 2 else prop.propose_batch([s], budget)[0]
            committed = [rng.randrange(3) for _ in range(rng.randrange(1, 5))]
            if len(tree):
                (tokens, parents, _depths, _scores, shares, groups, steps), a, e = s._judged
                assert np.array_equal(tokens[a:e], tree.tokens) and np.array_equal(parents[a:e], tree.parents)
                _judge(tree.tokens, tree.parents, shares[a:e], committed, expect, groups[a:e], steps[a:e], gexpect)
            s.extend(committed)
            assert np.allclose(prop.calibration(), expect), (request, round_)
            assert np.allclose(prop.group_calibration(), gexpect), (request, round_)
        s.close()
    assert expect[..., lk.CAL_TRIALS].sum() > 20  # the check saw judged drafts
    assert (gexpect[:, lk.CAL_TRIALS] > 0).sum() >= 2  # of several groups (corpus parts only)
    off = Proposer(learn=False, global_cache=False)
    s = off.start([1, 2, 1, 2, 1])
    s.propose(8)
    s.extend([2, 1])
    assert not off.calibration().any() and not off.group_calibration().any()


def _level_lengths(docs, text, min_count, levels):
    """The matched lengths of a source's parts: the longest suffix occurring >= min_count times,
    then shorter ones occurring more often (as `naive_part_candidates` walks them)."""
    n = max([0] + [k for k in range(1, len(text) + 1) if naive.count(docs, text[len(text) - k :]) >= min_count])
    out = []
    for _ in range(levels):
        if n < 1:
            break
        out.append(n)
        here = naive.count(docs, text[len(text) - n :])
        n = max([0] + [k for k in range(1, n) if naive.count(docs, text[len(text) - k :]) > here])
    return out


def _check_calibrated_tree(tree, parts, cal, strength, budget, classes, gcal):
    """`parts`: one dict per part, path -> uncalibrated path probability (exhaustive), of source
    class `classes[q]`. A node's step share in a part is its probability over its parent's; the
    part's calibrated probability multiplies each step by min(1, share times the group factor of
    its class and, at the root, of the number of parts proposing the token), then by `_factor` at
    the rank the node holds (its index among siblings).
    Checks: every node scores the max over parts of that; nodes come best first; and no child left
    out (at the rank it would take) scores more than the tree's last node, or exists at all when
    the tree is not full."""
    check_tree_invariants(tree)
    n = len(tree)
    paths, rank, kids = [], [], {}
    reach = [dict() for _ in parts]  # part -> node -> calibrated probability
    agree = {}
    for part in parts:
        for path in part:
            if len(path) == 1:
                agree[path] = agree.get(path, 0) + 1

    def step(q, path, share):
        g = _group(classes[q], agree[path] if len(path) == 1 else 0)
        return min(1.0, share * _group_factor(gcal, g, strength))
    for i in range(n):
        p = int(tree.parents[i])
        path = (paths[p] if p >= 0 else ()) + (int(tree.tokens[i]),)
        paths.append(path)
        rank.append(kids.get(p, 0))
        kids[p] = rank[i] + 1
        best = 0.0
        for q, part in enumerate(parts):
            if path not in part or (p >= 0 and p not in reach[q]):
                continue
            share = part[path] / (part[path[:-1]] if p >= 0 else 1.0)
            reach[q][i] = (reach[q][p] if p >= 0 else 1.0) * step(q, path, share) * _factor(cal, rank[i], share, strength)
            best = max(best, reach[q][i])
        assert tree.scores[i] == pytest.approx(best), (i, path)
        if i:
            assert tree.scores[i] <= tree.scores[i - 1] + 1e-12  # created best first
    floor = float(tree.scores[-1]) if n == budget else 0.0
    node_of = {path: i for i, path in enumerate(paths)}
    for q, part in enumerate(parts):
        for path, prob in part.items():
            if path in node_of:
                continue
            p = node_of.get(path[:-1], -1 if len(path) == 1 else None)
            if p is None or (p >= 0 and p not in reach[q]):
                continue
            share = prob / (part[path[:-1]] if p >= 0 else 1.0)
            value = (reach[q][p] if p >= 0 else 1.0) * step(q, path, share) * _factor(cal, kids.get(p, 0), share, strength)
            assert value <= floor + 1e-9, (path, value, floor)


@pytest.mark.parametrize("alphabet", [2, 3])
def test_calibrated_trees_equal_their_brute_force_definition(alphabet):
    rng = random.Random(70 + alphabet)
    np_rng = np.random.default_rng(alphabet)
    checked = 0
    for trial in range(20):
        corpus_docs = [[rng.randrange(alphabet) for _ in range(rng.randrange(3, 25))] for _ in range(2)]
        sam = SuffixAutomaton()
        for d in corpus_docs:
            sam.add_document(d)
        strength = rng.choice([0.5, 4.0])
        # match_prior 1.37: no share lands on a bucket edge exactly (the check divides probabilities)
        prop = Proposer(corpus=sam.freeze(), global_cache=False, max_children=64, max_depth=5, match_prior=1.37,
                        recency=0.5, calibration_strength=strength)
        text = [rng.randrange(alphabet) for _ in range(rng.randrange(2, 12))]
        session = prop.start(text)
        for step in range(3):
            more = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 6))]
            session.extend(more)
            text += more
            cal = lk.new_calibration()
            cal[..., lk.CAL_TRIALS] = np_rng.integers(0, 3, cal.shape[:2])
            cal[..., lk.CAL_EXPECT] = np_rng.random(cal.shape[:2]) * 3
            cal[..., lk.CAL_HITS] = np_rng.random(cal.shape[:2])
            prop._calibration[...] = cal  # the tables the kernels read (in place: frames name them)
            gcal = lk.new_group_calibration()
            gcal[:, lk.CAL_TRIALS] = np_rng.integers(0, 2, lk.N_GROUPS)
            gcal[:, lk.CAL_EXPECT] = np_rng.random(lk.N_GROUPS) * 8
            gcal[:, lk.CAL_HITS] = np_rng.random(lk.N_GROUPS) * 8
            prop._group_cal[...] = gcal
            local, glob = session._stats.copy(), prop.learned()
            budget = rng.randrange(1, 20)
            tree = session.propose(budget)
            parts, classes = [], []
            for docs, min_count, cls in (([text], 2, lk.CLS_OWN), (corpus_docs, 1, lk.CLS_CORPUS)):
                for length in _level_lengths(docs, text, min_count, prop.match_levels):
                    classes.append(cls)
                    rule = corpus_rule(session, 0) if cls == lk.CLS_CORPUS else None
                    parts.append(naive_part_candidates(docs, text[len(text) - length :], min_count, 1, 1.37, 0.5, 5,
                                                       lambda m, cls=cls: learned_conf(local, glob, cls, m, 1.37),
                                                       corpus=rule))
            _check_calibrated_tree(tree, parts, cal, strength, budget, classes, gcal)
            checked += len(tree)
    assert checked > 100


def test_top_children_equal_a_sort_of_every_child():
    """`frozen.top_children` against sorting each state's children: the width - 1 most frequent
    (ties: lower edge first) and the most recent, in edge order, and their parent's count total."""
    from suffixspec._kernels import frozen as fk

    rng = random.Random(9)
    for trial in range(30):
        alphabet = rng.choice([3, 8, 30])
        sam = SuffixAutomaton()
        for _ in range(rng.randrange(1, 4)):
            sam.add_document([rng.randrange(alphabet) for _ in range(rng.randrange(5, 400))])
        fa = sam.freeze()
        offsets, etok, eto, counts, lasts, _links, _lens = fa.kernel_arrays()
        width, min_children = rng.randrange(2, 6), rng.randrange(0, 6)
        row_of, tops, totals = fk.top_children(offsets, etok, eto, counts, fa.count_escapes, lasts, 0, width, min_children)
        rows = 0
        for v in range(len(offsets) - 1):
            edges = list(range(offsets[v], offsets[v + 1]))
            if len(edges) <= min_children:
                assert row_of[v] == -1
                continue
            r = row_of[v]
            assert r == rows, (trial, v)
            rows += 1
            best = sorted(edges, key=lambda e: (-counts[eto[e]], e))[: width - 1]
            recent = max(edges, key=lambda e: lasts[eto[e]])
            expect = sorted(set(best) | {recent})
            got = [int(e) for e in tops[r * width : (r + 1) * width] if e >= 0]
            assert got == expect, (trial, v)
            assert totals[r] == sum(int(counts[eto[e]]) for e in edges)


def test_top_rows_hold_each_rows_total_and_its_edges_records():
    """`frozen.top_rows` against `top_children` and `edge_records`: per row the total, then the
    records of its edges in order, padded; an edge outside the records reads as damaged (TO -1)."""
    from suffixspec._kernels import frozen as fk

    rng = random.Random(11)
    for _trial in range(20):
        sam = SuffixAutomaton()
        sam.add_document([rng.randrange(rng.choice([3, 8])) for _ in range(rng.randrange(20, 300))])
        fa = sam.freeze()
        offsets, etok, eto, counts, lasts, _links, _lens = fa.kernel_arrays()
        records = fa.edge_records()
        width = rng.randrange(2, 6)
        row_of, tops, totals = fk.top_children(offsets, etok, eto, counts, fa.count_escapes, lasts, 0, width, 0)
        rows = fk.top_rows(tops, totals, records, width)
        stride = fk.top_row_len(width)
        assert rows.shape == (totals.shape[0] * stride,)
        for r in range(totals.shape[0]):
            row = rows[r * stride : (r + 1) * stride]
            assert row[0] == totals[r]
            for i in range(width):
                rec = row[1 + i * fk.REC_COLS : 1 + (i + 1) * fk.REC_COLS]
                e = int(tops[r * width + i])
                if e < 0:
                    assert rec[fk.REC_TOK] == fk.TOP_PAD
                else:
                    assert rec.tolist() == records[fk.REC_COLS * e : fk.REC_COLS * (e + 1)].tolist()
        if totals.shape[0]:
            bad = tops.copy()
            bad[0] = records.shape[0] // fk.REC_COLS  # one past the last edge
            row = fk.top_rows(bad, totals, records, width)[:stride]
            assert row[1 + fk.REC_TO] == -1


@pytest.mark.parametrize("max_children", [1, 2, 4])
def test_trees_with_precomputed_best_children_equal_full_scans(max_children):
    """A corpus whose states have many children: trees read through the precomputed best children
    equal the trees of a full scan of every child (the table blanked in place). Without locality:
    the table holds the most frequent children and the most recent one, every child a tree of the
    recency rule can take; a corpus part's locality bonus looks for the child near the anchor
    among the children it reads, so with a table it may miss one a full scan finds (the test
    after this one)."""
    rng = random.Random(40 + max_children)
    for trial in range(6):
        alphabet = rng.choice([20, 60])
        sam = SuffixAutomaton()
        for _ in range(3):
            sam.add_document([rng.randrange(alphabet) for _ in range(600)])
        prop = Proposer(corpus=sam.freeze(), max_children=max_children, global_cache=False, corpus_locality=0.0)
        blank = Proposer(corpus=sam.freeze(), max_children=max_children, global_cache=False, corpus_locality=0.0)
        blank._current_sources().tops[...] = 0  # no table: every child is read
        for request in range(3):
            text = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 6))]
            a, b = prop.start(text), blank.start(text)
            for _ in range(15):
                budget = rng.randrange(1, 40)
                ta, tb = a.propose(budget), b.propose(budget)
                assert ta.tokens.tolist() == tb.tokens.tolist() and ta.parents.tolist() == tb.parents.tolist()
                assert np.allclose(ta.scores, tb.scores)
                more = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 4))]
                a.extend(more)
                b.extend(more)
            a.close()
            b.close()
        assert not blank._current_sources().tops.any()
        assert max(int(tops[0].max()) for tops in prop._current_sources().held_tops) >= 0  # states with a row


def test_with_locality_a_table_changes_trees_only_where_the_session_has_an_anchor():
    """With locality on, trees through the table are well-formed, and equal a full scan's while
    the session has no anchor in the corpus (no bonus at all: nothing the table could miss)."""
    from suffixspec._kernels import draft as dk

    rng = random.Random(77)
    same = anchored = 0
    for trial in range(4):
        sam = SuffixAutomaton()
        for _ in range(3):
            sam.add_document([rng.randrange(30) for _ in range(600)])
        prop = Proposer(corpus=sam.freeze(), max_children=2, global_cache=False)
        blank = Proposer(corpus=sam.freeze(), max_children=2, global_cache=False)
        blank._current_sources().tops[...] = 0
        text = [rng.randrange(30) for _ in range(3)]
        a, b = prop.start(text), blank.start(text)
        for _ in range(20):
            budget = rng.randrange(1, 40)
            ta, tb = a.propose(budget), b.propose(budget)
            check_tree_invariants(ta)
            if int(a._cur[0, dk.CUR_ANCHOR]) < 0:
                assert ta.tokens.tolist() == tb.tokens.tolist() and np.allclose(ta.scores, tb.scores)
                same += 1
            else:
                anchored += 1
            more = sam.tokens[rng.randrange(1000) :][:4].tolist() if rng.random() < 0.5 else [rng.randrange(30)]
            a.extend(more)
            b.extend(more)
    assert same > 0 and anchored > 0


def test_a_corpus_whose_lone_guesses_fail_is_discounted():
    """A stale corpus that always continues a context with another token than the request does:
    its lone root guesses are judged misses, its group's factor falls below 1, and a later tree
    scores that guess lower than the same session's tree with the group table emptied."""
    from suffixspec._kernels import draft as dk

    rng = np.random.default_rng(3)
    words = [rng.integers(10, 60, 6).tolist() for _ in range(40)]
    stale = SuffixAutomaton()
    stale.add_document([t for w in words for t in w + [7]])  # the corpus: every word then 7
    prop = Proposer(corpus=stale.freeze(), global_cache=False)
    for w in words[:30]:  # the requests: every word then 8
        s = prop.start(w)
        for _ in range(3):
            s.propose(16)
            s.extend([8])
            s.propose(16)
            s.extend(w)
        s.close()
    lone = lk.group(lk.CLS_CORPUS, 1)
    table = prop.group_calibration()
    assert table[lone, lk.CAL_TRIALS] > 20 and table[lone, lk.CAL_HITS] == 0
    assert lk.group_factor(table, lone, prop.params[dk.P_CAL_STRENGTH]) < 0.6

    def root_scores(tree):
        return {int(t): float(x) for t, x, p in zip(tree.tokens, tree.scores, tree.parents) if p < 0}

    lowered = 0
    for w in words[30:]:
        s = prop.start(w)
        with_table = root_scores(s.propose(16))
        prop._group_cal[...] = 0.0  # in place: the frames name the table
        without = root_scores(s.propose(16))
        prop._group_cal[...] = table
        s.close()
        assert 7 in without and with_table.get(7, 0.0) < without[7]
        lowered += 1
    assert lowered == 10
