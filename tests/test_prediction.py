"""`Prediction`: the cursor follows the output along the predicted tokens and re-anchors after an
edit; `with_path` merges a path into a tree (checked against the set of root paths)."""

import numpy as np

from suffixspec.draft.prediction import Prediction, with_path
from suffixspec.draft.tree import DraftTree


def feed(pred, output, tokens, accepted=0):
    output.extend(tokens)
    pred.advance(output, tokens, drafted=len(tokens), accepted=accepted)


def test_the_cursor_follows_agreement_and_reanchors_forward_after_an_edit():
    text = list(range(100, 140)) + list(range(100, 140))  # the prediction repeats itself
    pred = Prediction(text)
    out: list[int] = []
    assert pred.draft(4)[0] == text[:4]
    feed(pred, out, text[:10], accepted=9)
    assert pred.cursor == 10 and pred.draft(3)[0] == text[10:13]
    # an insertion the prediction does not hold: lost until the output's tail is found again
    feed(pred, out, [7, 7, 7])
    assert pred.cursor is None and pred.draft(4)[0] == []
    feed(pred, out, text[10:30])
    # the first occurrence ahead of where the output stood, not the later repeat
    assert pred.cursor == 30 and pred.draft(2)[0] == text[30:32]
    # scores fall with depth and with the prediction's record
    _, good = pred.draft(3)
    assert np.all(np.diff(good) < 0) and good[0] < 1


def test_short_tails_do_not_anchor():
    pred = Prediction([1, 2, 3, 4, 5, 6, 7, 8, 9])
    out = [50]
    feed(pred, out, [60, 3, 4, 5])  # three tokens of the prediction: too short to trust
    assert pred.cursor is None


def paths(tree):
    return {tuple(int(t) for t in tree.tokens[p]) for p in tree.paths()}


def prefixes(ps):
    return {p[:i] for p in ps for i in range(1, len(p) + 1)}


def test_with_path_is_the_union_of_root_paths():
    rng = np.random.default_rng(3)
    for _ in range(200):
        tree_paths = [tuple(rng.integers(0, 4, rng.integers(1, 6)).tolist()) for _ in range(rng.integers(0, 4))]
        tree = DraftTree.from_paths([list(p) for p in tree_paths], rng.random(len(tree_paths))) if tree_paths \
            else DraftTree.empty()
        path = rng.integers(0, 4, rng.integers(1, 7)).tolist()
        scores = 0.9 ** np.arange(1, len(path) + 1)
        merged = with_path(tree, path, scores)
        assert prefixes(paths(merged)) == prefixes(paths(tree) | {tuple(path)}) if len(tree) else \
            prefixes(paths(merged)) == prefixes({tuple(path)})
        assert merged.tokens[: len(path)].tolist() == path  # the path's nodes come first
        par = merged.parents
        assert np.all(merged.scores[par[par >= 0]] >= merged.scores[par >= 0])  # never above a parent


def test_prediction_counts_as_openai_defines_them():
    from suffixspec.draft.prediction import prediction_counts

    answer = list(range(200, 240))
    assert prediction_counts(answer, answer) == (40, 0)  # all accepted
    assert prediction_counts(list(range(10, 50)), answer) == (0, 40)  # disjoint: all rejected
    half = answer[:20] + list(range(900, 920))  # half right, half wrong
    assert prediction_counts(half, answer) == (20, 20)
    assert prediction_counts(answer, answer + [7] * 5) == (40, 0)  # extra output costs the prediction nothing
    assert prediction_counts([], answer) == (0, 0)
    edit = answer[:10] + [1, 2, 3] + answer[10:]  # an edit that drops three predicted tokens
    assert prediction_counts(edit, answer) == (40, 3)
