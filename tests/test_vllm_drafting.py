"""The vLLM adapters' draft sizing against brute force: per-row best paths by length, the batch's
lengths by expected tokens per unit of step cost, and the step cost learned from measured steps."""

import itertools

import numpy as np
import pytest

from suffixspec import DraftTree
from suffixspec.integrations.vllm_drafting import (
    MeasuredStepCost,
    StepCost,
    path_values,
    plan_lengths,
    trust_factors,
    write_paths,
)


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


def brute_line(xs, ys, ws, rho, mu):
    """argmin over (a, c) of sum w (y - a - c x)^2 + mu (c - rho a)^2, by least squares on rows."""
    rows = [[np.sqrt(w), np.sqrt(w) * x] for x, w in zip(xs, ws)] + [[-np.sqrt(mu) * rho, np.sqrt(mu)]]
    rhs = [np.sqrt(w) * y for y, w in zip(ys, ws)] + [0.0]
    (a, c), *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    return a, c


@pytest.mark.parametrize("seed", range(20))
def test_measured_cost_is_the_weighted_ridge_line_of_its_steps(seed):
    rng = np.random.default_rng(seed)
    batch = int(rng.integers(1, 16))
    cost = MeasuredStepCost(k=8, warm_steps=10**9)  # no clipping: the fit alone
    a0, c0 = rng.uniform(0.01, 0.2), rng.uniform(0.0, 0.01)
    xs, ys = [], []
    for _ in range(int(rng.integers(1, 60))):
        x = int(rng.integers(0, 8 * batch + 1))
        y = (a0 + c0 * x) * rng.uniform(0.8, 1.2)
        cost.observe(batch + x, y, batch)
        xs.append(x)
        ys.append(y)
    n = len(xs)
    ws = [cost.forget ** (n - 1 - i) for i in range(n)]
    a, c = brute_line(xs, ys, ws, cost.prior_slope(batch), cost.prior_steps * (8.0 * batch) ** 2)
    got_a, got_c = cost.line(batch)
    if c >= 0 and a >= 0.02 * np.dot(ws, ys) / sum(ws):  # inside the bounds: exactly the least-squares line
        assert (got_a, got_c) == pytest.approx((a, c), rel=1e-6, abs=1e-12)
    assert got_a > 0 and got_c >= 0
    assert float(cost(batch + 5, batch)) == pytest.approx(got_a + 5 * got_c)


def test_measured_cost_stays_monotone_and_clips_a_spike():
    cost = MeasuredStepCost(k=8)
    for x in range(0, 64, 4):  # cheaper when wider (noise): flat, never falling
        cost.observe(8 + x, 0.1 - 0.0005 * x, 8)
    a, c = cost.line(8)
    assert c == 0.0 and a == pytest.approx(np.mean([0.1 - 0.0005 * x for x in range(0, 64, 4)]), rel=0.05)
    before = float(cost(40, 8))
    cost.observe(40, 100 * before, 8)  # a load spike after warm-up counts as at most twice the prediction
    assert float(cost(40, 8)) < 1.2 * before
    # a batch size never measured takes the nearest measured one's line; nothing measured: the prior
    assert cost.line(9) == cost.line(8)
    assert MeasuredStepCost().line(8)[1] / MeasuredStepCost().line(8)[0] == pytest.approx(MeasuredStepCost.prior_slope(8))


def closed_loop(truth, steps=300, seed=0, b=8, k=8):
    """Draft with the measured cost, the engine answering with `truth`'s cost: the achieved expected
    tokens per second over the best choice's under the true cost (after 50 steps), and the mean
    drafted tokens per step."""
    rng = np.random.default_rng(seed)
    cost = MeasuredStepCost(k=k)
    got, best, drafted = [], [], []
    for step in range(steps):
        p = rng.uniform(0.3, 0.97, size=b)
        values = np.full((b, k + 1), -np.inf)
        values[:, 0] = 0.0
        values[:, 1:] = np.cumsum(p[:, None] ** np.arange(1, k + 1)[None, :], axis=1)
        lengths = plan_lengths(values, lambda t: cost(t, b))
        ideal = plan_lengths(values, lambda t: truth(np.asarray(t, np.float64)))
        t = b + int(lengths.sum())
        if step >= 50:
            got.append((b + values[np.arange(b), lengths].sum()) / truth(t))
            best.append((b + values[np.arange(b), ideal].sum()) / truth(b + int(ideal.sum())))
            drafted.append(int(lengths.sum()))
        cost.observe(t, truth(t) * rng.uniform(0.9, 1.1), b)
    return np.mean(got) / np.mean(best), np.mean(drafted)


def test_drafts_follow_the_engines_measured_cost_flat_or_steep():
    """The same adapter drafts long where a step's cost is flat (a memory-bound GPU) and short where
    it grows with the tokens verified (this CPU engine), near the best choice under the true cost
    in both, having seen only the steps its own drafts made."""
    flat = lambda t: 0.01 * (1 + 0.001 * (t - 1))
    proportional = lambda t: 0.0143 * t
    steep = lambda t: 0.05 * (1 + 0.2 * (t - 1))
    eff_flat, n_flat = closed_loop(flat)
    eff_prop, n_prop = closed_loop(proportional)
    eff_steep, n_steep = closed_loop(steep)
    assert min(eff_flat, eff_prop, eff_steep) >= 0.95, (eff_flat, eff_prop, eff_steep)
    assert n_flat > 40 and n_prop < 12 and n_flat > 3 * n_steep, (n_flat, n_prop, n_steep)


def brute_trust(promised, accepted, prior):
    """The largest f on a fine grid of (0, 1] at which the trusted promise does not exceed what was accepted."""
    grid = np.linspace(1e-6, 1.0, 200001)
    powers = np.arange(1, promised.shape[0] + 1)
    excess = (promised[None, :] * grid[:, None] ** powers).sum(axis=1) + prior * grid - accepted - prior
    return grid[np.flatnonzero(excess <= 0)[-1]]


@pytest.mark.parametrize("seed", range(3))
def test_trust_is_the_factor_at_which_a_requests_drafts_promised_what_it_accepted(seed):
    rng = np.random.default_rng(seed)
    k, rows = 6, 12
    promised = rng.random((rows, k)) * rng.integers(0, 20, (rows, 1)) * np.sort(rng.random(k))[::-1]
    accepted = promised.sum(axis=1) * rng.uniform(0.0, 1.3, rows)
    accepted[0] = 0.0  # every draft failed
    accepted[1] = promised[1].sum()  # as promised: full trust
    for prior in (0.5, 8.0):
        f = trust_factors(promised, accepted, prior)
        want = np.array([brute_trust(promised[r], accepted[r], prior) for r in range(rows)])
        assert np.allclose(f, want, atol=2e-5), (f, want)
        assert f[1] == 1.0 and np.all(f[accepted >= promised.sum(axis=1)] == 1.0)
        assert np.all((f > 0) & (f <= 1.0))
    # a request with no record keeps its scores; one whose drafts failed more trusts them less
    assert trust_factors(np.zeros((1, k)), np.zeros(1))[0] == 1.0
    worse = trust_factors(promised, accepted * 0.5, 8.0)
    assert np.all(worse <= trust_factors(promised, accepted, 8.0) + 1e-12)
    with pytest.raises(ValueError, match="promised"):
        trust_factors(np.zeros(3), np.zeros(3))


def test_one_failed_copy_after_a_record_borne_out_shortens_less_than_failures_in_a_row():
    """Records kept as the core keeps them (`TRUST_MEMORY`): a long copy that fails once after drafts the
    engine accepted in full (a type hint inserted into a function being copied) trusts its scores more than
    the same failure with no record, or three in a row."""
    from suffixspec.integrations.vllm_core import TRUST_MEMORY

    k = 8
    long_copy = np.full(k, 0.9)  # a confident 8-token draft

    def record(outcomes):
        promised, accepted = np.zeros(k), 0.0
        for got in outcomes:
            promised = TRUST_MEMORY * promised + long_copy
            accepted = TRUST_MEMORY * accepted + got
        return trust_factors(promised[None, :], np.array([accepted]))[0]

    after_record = record([8] * 10 + [0])
    assert record([8] * 10) == 1.0 and after_record < 1.0
    assert record([0]) < after_record and record([8] * 10 + [0, 0, 0]) < after_record
    assert record([0, 0, 0]) < record([0])


def make_core(k=4, step_cost=None, **opts):
    from suffixspec.integrations.vllm_core import DraftCore
    from suffixspec.integrations.vllm_options import VllmSetup

    opts = {"close_in_background": False, **opts}
    if step_cost is not None:
        opts["step_cost"] = step_cost
    return DraftCore(VllmSetup(k, 512, 1000, 4, opts))


def test_trusted_drafts_are_planned_on_scores_scaled_by_trust_to_the_depth():
    """`linear_drafts` with per-row trust plans what `plan_lengths` plans on the same trees whose node
    scores were multiplied by trust ** depth, and hands back the trees' own scores."""
    k = 5
    core = make_core(k, step_cost=[[1, 1.0], [40, 3.0]])
    rng = np.random.default_rng(7)
    for _ in range(20):
        trees = []
        for _ in range(int(rng.integers(1, 5))):
            _, parents, _, scores = random_tree(rng, int(rng.integers(1, 20)), vocab=900)
            trees.append(DraftTree(rng.permutation(900)[: len(parents)] + 1, parents, scores))  # siblings distinct
        trust = rng.uniform(0.2, 1.0, len(trees))
        limits = [k] * len(trees)
        tok, sc, lengths = core.linear_drafts(trees, limits, len(trees), trust=trust)
        scaled = [DraftTree(t.tokens, t.parents, t.scores * trust[i] ** t.depths) for i, t in enumerate(trees)]
        counts = np.array([len(t) for t in scaled])
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        cat = [np.concatenate([getattr(t, f) for t in scaled]) for f in ("tokens", "parents", "depths", "scores")]
        values, nodes = np.empty((len(trees), k + 1)), np.empty((len(trees), k + 1), np.int64)
        path_values(cat[0], cat[1], cat[2], cat[3], starts, counts, np.array(limits), 1000, values, nodes)
        want = plan_lengths(values, lambda t: core.cost(np.asarray(t), len(trees)))
        assert np.array_equal(lengths, want)
        for r, t in enumerate(trees):  # the path's own scores, unscaled
            node, path = int(nodes[r, lengths[r]]), []
            while node >= 0:
                path.append(node)
                node = int(t.parents[node])
            assert np.allclose(sc[r, : lengths[r]], t.scores[path[::-1]])
            assert np.array_equal(tok[r, : lengths[r]], t.tokens[path[::-1]])


def test_a_requests_record_is_what_its_verified_drafts_promised_and_got():
    """Per request the core keeps, per depth, the summed scores of its verified drafts and the tokens the
    engine accepted of them, keeping TRUST_MEMORY of the older record at each verified draft."""
    from suffixspec.integrations.vllm_core import TRUST_MEMORY

    k = 4
    core = make_core(k, step_cost=[[1, 1.0], [40, 1.5]])  # a pinned line: the drafts do not follow wall time
    rng = np.random.default_rng(5)
    base = list(rng.integers(1, 900, 12))
    content = base * 4  # repeats: the proposer drafts
    promised, accepted, sampled, drafted = np.zeros(k), 0.0, 1, 0
    for _ in range(25):
        table = np.zeros((1, 512), np.int64)
        table[0, : len(content)] = content
        drafts = core.step([0], [sampled], [len(content)], table)
        t = core._by_key[0]
        assert np.allclose(t.promised, promised) and t.accepted == pytest.approx(accepted)
        draft, scores = drafts[0], core.scores[0]
        drafted += len(draft)
        j = int(rng.integers(0, len(draft) + 1))  # the engine accepts the first j, then samples its own
        sampled = j + 1
        content = content + draft[:j]
        content.append(base[len(content) % 12] if rng.random() < 0.8 else int(rng.integers(1, 900)))  # mostly the pattern
        if draft:
            promised = TRUST_MEMORY * promised + np.pad(scores, (0, k - len(scores)))
            accepted = TRUST_MEMORY * accepted + j
    assert drafted > 20 and accepted < promised.sum()  # random acceptance: the record shows it, and the trust follows
    assert trust_factors(core._by_key[0].promised[None, :], np.array([core._by_key[0].accepted]))[0] < 1.0
