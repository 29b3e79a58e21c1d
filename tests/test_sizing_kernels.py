"""The budget's kernels (`_kernels/sizing`) against the per-row numpy they replaced: bit-identical
gains and pruned trees on random trees, ties and depth limits included."""

import numpy as np
import pytest

from suffixspec._kernels import sizing
from suffixspec._kernels.sizing import round_gains
from suffixspec.draft.tree import DraftTree, prune_tree
from suffixspec.engine.budget import BudgetPolicy, CostModel, OutputLengths, RankCalibration
from suffixspec.verify.batch import RoundBatch


def random_tree(rng, n, tie_levels=None):
    """A valid tree of n nodes: parents earlier, siblings distinct, a child's score at most its parent's;
    `tie_levels` draws scores from that many values (ties)."""
    tokens, parents, scores = [], [], []
    used = set()
    for i in range(n):
        while True:
            p = int(rng.integers(-1, i)) if i else -1
            tok = int(rng.integers(0, 6))
            if (p, tok) not in used:
                break
        used.add((p, tok))
        top = 1.0 if p < 0 else scores[p]
        s = top * (rng.integers(1, tie_levels + 1) / tie_levels if tie_levels else rng.uniform(0.05, 1.0))
        tokens.append(tok), parents.append(p), scores.append(s)
    tree = DraftTree(tokens, parents, scores)
    return tree


def reference_prune(tree, size, max_depth):
    """`prune_tree` as numpy and Python loops (the implementation the kernel replaced)."""
    n = len(tree)
    if n == 0 or size <= 0 or max_depth <= 0:
        return DraftTree.empty()
    if n <= size and int(tree.depths.max()) <= max_depth:
        return tree
    order = np.argsort(-tree.scores, kind="stable").tolist()
    par, depth = tree.parents.tolist(), tree.depths.tolist()
    keep = [False] * n
    count = 0
    for i in order:
        if count >= size:
            break
        if depth[i] <= max_depth and (par[i] < 0 or keep[par[i]]):
            keep[i] = True
            count += 1
    idx = np.flatnonzero(keep)
    remap = -np.ones(n, np.int64)
    remap[idx] = np.arange(len(idx))
    parents = np.where(tree.parents[idx] >= 0, remap[np.maximum(tree.parents[idx], 0)], -1).astype(np.int32)
    return DraftTree.unchecked(tree.tokens[idx], parents, tree.depths[idx], tree.scores[idx])


def reference_gains(calibration, trees, scale, weights, continuing):
    """`size_round`'s gains per row with numpy (the implementation the kernel replaced)."""
    def worth(tree, cont):
        return tree.scores if cont is None else tree.scores * cont[np.minimum(tree.depths, len(cont) - 1)]

    best = [calibration.apply(np.sort(worth(t, c))[::-1], f) if len(t) else np.zeros(0)
            for t, f, c in zip(trees, scale, continuing)]
    kmax = max(len(s) for s in best)
    gains = np.zeros(kmax + 1)
    for wi, s in zip(weights, best):
        c = np.concatenate([[0.0], np.cumsum(s)])
        gains += wi * c[np.minimum(np.arange(kmax + 1), len(s))]
    return gains


@pytest.mark.parametrize("ties", [None, 3])
def test_prune_matches_reference(ties):
    rng = np.random.default_rng(7 if ties else 8)
    for _ in range(300):
        tree = random_tree(rng, int(rng.integers(1, 40)), ties)
        for size, depth in [(int(rng.integers(0, 45)), int(rng.integers(0, 12))), (len(tree) - 1, 99), (5, 2)]:
            got, want = prune_tree(tree, size, depth), reference_prune(tree, size, depth)
            for a in ("tokens", "parents", "depths", "scores"):
                assert np.array_equal(getattr(got, a), getattr(want, a)), (a, size, depth)
            assert got.parents.dtype == np.int32


def test_round_gains_match_reference(monkeypatch):
    """Bit-identical gains, hence the same size chosen, over random rounds (empty rows, continuing
    discounts of several lengths, trained calibration, row factors and weights)."""
    rng = np.random.default_rng(3)
    calibration = RankCalibration()
    for _ in range(20):  # a calibration away from its prior
        trees = [random_tree(rng, int(rng.integers(1, 30))) for _ in range(4)]
        calibration.observe(trees, [np.arange(int(rng.integers(0, len(t) + 1))) for t in trees])
    lengths = OutputLengths()
    for n in rng.integers(5, 60, 40):
        lengths.observe(int(n), bool(rng.integers(0, 2)))
    policy = BudgetPolicy(cost_model=CostModel([1, 4096], [1.0, 3.0]), calibration=calibration)
    captured = {}

    def spy(*args):
        captured["gains"] = round_gains(*args)
        return captured["gains"]

    monkeypatch.setattr(sizing, "round_gains", spy)

    for trial in range(200):
        b = int(rng.integers(1, 9))
        trees = [random_tree(rng, int(rng.integers(1, 50)), 4 if trial % 3 == 0 else None)
                 if rng.uniform() < 0.8 else DraftTree.empty() for _ in range(b)]
        if not any(len(t) for t in trees):
            continue
        scale = rng.uniform(0.05, 3.0, b)
        weights = rng.uniform(0.25, 1.0, b)
        mode = trial % 3
        if mode == 0:
            continuing = None
            listed = [None] * b
        elif mode == 1:  # the engine's form: one row per request, all of one depth
            continuing = lengths.continuing_rows(rng.integers(0, 50, b), 16)
            listed = list(continuing)
        else:  # a list of several lengths and absent entries
            listed = [lengths.continuing(int(rng.integers(0, 50)), int(rng.integers(0, 20)))
                      if rng.uniform() < 0.7 else None for _ in range(b)]
            continuing = listed
        want = reference_gains(calibration, trees, scale, weights, listed)
        policy.size_round(RoundBatch.build(trees, [64] * b, weights=weights, factors=scale, continuing=continuing))
        assert np.array_equal(captured["gains"], want), trial


def test_continuing_rows_equal_continuing():
    lengths = OutputLengths()
    for n, ended in [(3, True), (9, True), (9, False), (20, True), (40, False)]:
        lengths.observe(n, ended)
    done = [0, 3, 8, 19, 45, 60]
    rows = lengths.continuing_rows(done, 12)
    assert rows.shape == (len(done), 13)
    for i, d in enumerate(done):
        assert np.array_equal(rows[i], lengths.continuing(d, 12))
