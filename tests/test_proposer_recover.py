"""Recovery past a replaced or inserted token (`_kernels/recover.py`, the proposer's `recover` knob):
the recovery row and the trees with its two parts against a brute force over the text."""

import random

import numpy as np
import pytest

from suffixspec import Proposer
from suffixspec._kernels import recover as rk
from suffixspec.draft.session import RECOVER_MIN

from support import naive
from support.trees import check_tree_invariants, naive_part_candidates, tree_paths


def _brute_row(text):
    """(context, y) of the recovery of `text` by brute force, None when there is none: the longest
    suffix s of the text but its last token x that also ends earlier, at least RECOVER_MIN long,
    never followed by x there; y the token after its most recent earlier end."""
    before, x = text[:-1], text[-1]
    m = max([0] + [k for k in range(1, len(before)) if naive.count([before], before[len(before) - k :]) >= 2])
    if m < RECOVER_MIN:
        return None
    s = before[len(before) - m :]
    cont = naive.continuations([before], s)
    if x in cont or not cont:
        return None
    y = max(cont, key=lambda t: cont[t][1])
    return s + [y], y


def _brute_paths(text, recover, max_depth, levels=3, match_prior=1.0, recency=0.5):
    """Every draft path of the request's own text (its parts and, after a mismatch, the recovery's)
    with its probability, a path scoring its best over the parts."""
    out = naive_part_candidates([text], text, 2, levels, match_prior, recency, max_depth)
    row = _brute_row(text)
    if row is None or recover <= 0:
        return out
    ctx0, y = row

    def expand(ctx, path, prob, depth):
        if depth >= max_depth:
            return
        cont = naive.continuations([text], ctx)
        if not cont:
            return
        total = sum(c for c, _ in cont.values())
        recent = max(cont, key=lambda t: cont[t][1])
        conf = len(ctx) / (len(ctx) + match_prior)
        for tok, (c, _) in cont.items():
            p = prob * conf * (c + (recency * total if tok == recent else 0)) / (total * (1 + recency))
            key = tuple(path + [tok])
            out[key] = max(out.get(key, 0.0), p)
            expand(ctx + [tok], path + [tok], p, depth + 1)

    expand(ctx0, [], recover, 0)  # substitution: what followed s y
    out[(y,)] = max(out.get((y,), 0.0), recover)  # insertion: y itself, then the same
    expand(ctx0, [y], recover, 1)
    return out


def _periodic(rng, alphabet, n):
    """A text that repeats a block with random replaced and inserted tokens (recoveries happen)."""
    block = [rng.randrange(alphabet) for _ in range(rng.randrange(6, 12))]
    out = []
    while len(out) < n:
        for t in block:
            r = rng.random()
            if r < 0.08:
                out.append(rng.randrange(alphabet))  # replaced
            elif r < 0.14:
                out.extend([rng.randrange(alphabet), t])  # inserted before
            else:
                out.append(t)
    return out[:n]


@pytest.mark.parametrize("alphabet", [3, 5, 8])
def test_recovery_row_equals_brute_force(alphabet):
    rng = random.Random(alphabet)
    found = 0
    for _ in range(6):
        text = _periodic(rng, alphabet, 90)
        session = Proposer(global_cache=False, recover=0.3).start(text[:10])
        for i in range(10, len(text)):
            session.extend([text[i]])
            row = _brute_row(text[: i + 1])
            got = session._rec
            if row is None:
                assert got[rk.RROW_STATE] == -1, text[: i + 1]
                continue
            found += 1
            ctx, y = row
            assert got[rk.RROW_STATE] > 0 and got[rk.RROW_TOK] == y and got[rk.RROW_LEN] == len(ctx), text[: i + 1]
    assert found > 20  # the texts made recoveries to check


@pytest.mark.parametrize("alphabet", [3, 5])
def test_trees_with_recovery_equal_brute_force(alphabet):
    """Token by token and in chunks (the row is taken before a commit's last token), single and
    batched proposals: the tree is the best `budget` paths over the own parts and the recovery's."""
    rng = random.Random(10 + alphabet)
    depth = 5
    recovered = 0
    for trial in range(4):
        text = _periodic(rng, alphabet, 70)
        prop = Proposer(global_cache=False, max_children=64, max_depth=depth, match_prior=1.0, recency=0.5,
                        learn=False, recover=0.35)
        session = prop.start(text[:8])
        i = 8
        while i < len(text):
            step = rng.choice([1, 1, 2, 3])
            session.extend(text[i : i + step])
            i = min(len(text), i + step)
            budget = rng.randrange(1, 14)
            tree = session.propose(budget) if rng.random() < 0.5 else prop.propose_batch([session], budget)[0]
            check_tree_invariants(tree)
            ref = _brute_paths(text[:i], 0.35, depth)
            got = tree_paths(tree)
            for path, score in got.items():
                assert path in ref and score == pytest.approx(ref[path]), (text[:i], path)
            assert sorted(got.values(), reverse=True) == pytest.approx(sorted(ref.values(), reverse=True)[:budget])
            recovered += session._rec[rk.RROW_STATE] > 0
    assert recovered > 10


def test_recover_zero_keeps_the_trees_and_the_knob_is_checked():
    """With `recover` 0 no row is kept and the trees are those without recovery; the knob refuses
    values outside [0, 1] by name."""
    rng = random.Random(7)
    text = _periodic(rng, 4, 120)
    on, off = Proposer(global_cache=False, recover=0.3), Proposer(global_cache=False, recover=0.0)
    a, b = on.start(text[:10]), off.start(text[:10])
    differ = 0
    for i in range(10, len(text)):
        a.extend([text[i]])
        b.extend([text[i]])
        assert b._rec[rk.RROW_STATE] == -1
        ta, tb = tree_paths(a.propose(16)), tree_paths(b.propose(16))
        differ += ta != tb
    assert differ > 0
    with pytest.raises(Exception, match="recover"):
        Proposer(recover=1.5)
    assert np.all(off.start(text[:20])._rec == -1)
