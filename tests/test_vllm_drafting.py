"""The vLLM adapters' draft sizing against brute force: per-row best paths by length, the batch's
lengths by expected tokens per unit of step cost, and the step cost learned from measured steps."""

import itertools

import numpy as np
import pytest

from suffixspec import DraftTree
from suffixspec.integrations.vllm_drafting import MeasuredStepCost, StepCost, path_values, plan_lengths, write_paths


def random_tree(rng, n, vocab=50):
    parents = [-1]
    for i in range(1, n):
        parents.append(int(rng.integers(-1, i)))
    depth = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    scores = []
    for i, p in enumerate(parents):  # scores do not grow along a path
        top = 1.0 if p < 0 else scores[p]
        scores.append(float(top * rng.choice([1.0, rng.random()])))
    return np.array(rng.integers(-1, vocab + 5, n)), np.array(parents), np.array(depth), np.array(scores)


def brute_values(tokens, parents, depths, scores, limit, k, vocab):
    values = np.full(k + 1, -np.inf)
    values[0] = 0.0
    for i in range(len(tokens)):
        path, node = [], i
        while node >= 0:
            path.append(node)
            node = parents[node]
        if len(path) > limit or any(not 0 <= tokens[j] < vocab for j in path):
            continue
        values[len(path)] = max(values[len(path)], sum(scores[j] for j in reversed(path)))
    return values


def test_path_values_are_the_best_path_of_each_length_by_enumeration():
    rng = np.random.default_rng(1)
    k, vocab = 5, 50
    for _ in range(30):
        trees = [random_tree(rng, int(rng.integers(1, 25)), vocab) for _ in range(int(rng.integers(1, 5)))]
        limits = rng.integers(0, k + 1, len(trees))
        counts = np.array([len(t[0]) for t in trees])
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        cat = [np.concatenate([t[f] for t in trees]) for f in range(4)]
        values, nodes = np.empty((len(trees), k + 1)), np.empty((len(trees), k + 1), np.int64)
        path_values(cat[0], cat[1], cat[2], cat[3].astype(np.float64), starts, counts, limits, vocab, values, nodes)
        for r, t in enumerate(trees):
            want = brute_values(*t, limits[r], k, vocab)
            assert np.allclose(values[r], want) and np.array_equal(np.isinf(values[r]), np.isinf(want))
        lengths = np.array([max(L for L in range(k + 1) if np.isfinite(values[r, L])) for r in range(len(trees))])
        out = np.zeros((len(trees), k), np.int64)
        write_paths(cat[0], cat[1], starts, nodes, lengths, out)
        for r, t in enumerate(trees):  # the written path is a root path of that length and value
            node = int(nodes[r, lengths[r]])
            path = []
            while node >= 0:
                path.append(node)
                node = int(t[1][node])
            assert [int(t[0][j]) for j in reversed(path)] == out[r, : lengths[r]].tolist()


@pytest.mark.parametrize("seed", range(4))
def test_plan_lengths_is_the_best_choice_by_enumeration(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        b, k = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        values = np.full((b, k + 1), -np.inf)
        values[:, 0] = 0
        for r in range(b):
            top = int(rng.integers(0, k + 1))
            values[r, 1 : top + 1] = np.cumsum(rng.random(top) * rng.choice([0, 1], top, p=[0.2, 0.8]))
            values[r, 1 : top + 1] = np.maximum.accumulate(values[r, 1 : top + 1] * rng.choice([1.0, 0.7], top))
        curve = [[1, 1.0], [int(rng.integers(2, 12)), float(rng.uniform(1.0, 3.0))], [40, float(rng.uniform(3.0, 9.0))]]
        cost = StepCost(curve)

        def value(ls):
            got = [values[r, L] for r, L in enumerate(ls)]
            return -np.inf if any(np.isinf(got)) else (b + sum(got)) / float(cost(b + sum(ls)))

        best = max(value(c) for c in itertools.product(range(k + 1), repeat=b))
        lengths = plan_lengths(values, lambda t: cost(t))
        assert value(lengths) == pytest.approx(best, rel=1e-12)


def test_a_strong_short_branch_beats_a_long_weak_one_when_tokens_cost():
    # root path A: one sure token then nothing; path B: four middling tokens
    tree = DraftTree(np.array([1, 2, 3, 4, 5]), np.array([-1, -1, 1, 2, 3]), scores=np.array([0.95, 0.6, 0.5, 0.45, 0.4]))
    values, nodes = np.empty((1, 5)), np.empty((1, 5), np.int64)
    path_values(tree.tokens, tree.parents, tree.depths, tree.scores, np.zeros(1, np.int64), np.array([5]), np.array([4]), 10,
                values, nodes)
    steep = StepCost([[1, 1.0], [2, 1.5], [5, 3.0]])
    assert plan_lengths(values, lambda t: steep(t)).tolist() == [1]  # A: 1.95 / 1.5 beats B's best
    flat = StepCost([[1, 1.0], [10**6, 1.0 + 1e-9]])
    assert plan_lengths(values, lambda t: flat(t)).tolist() == [4]  # B: 2.95 tokens for the same cost


def test_measured_cost_learns_the_curve_of_the_machine_per_batch_size():
    rng = np.random.default_rng(0)
    cpu = lambda t: 0.05 * (1 + 0.2 * (t - 1))  # a wider step costs much more
    gpu = lambda t: 0.01 * (1 + 0.001 * (t - 1))  # flat
    for truth, batch in ((cpu, 8), (gpu, 8), (cpu, 1)):
        cost = MeasuredStepCost()
        for _ in range(400):
            t = int(rng.integers(batch, batch * 5))
            cost.observe(t, truth(t) * rng.uniform(0.95, 1.05), batch)
        for t in (2 * batch, 4 * batch):
            want = truth(t) / truth(batch + 1)
            assert float(cost(t, batch) / cost(batch + 1, batch)) == pytest.approx(want, rel=0.15), (batch, t)
    assert cost.observed == 400
