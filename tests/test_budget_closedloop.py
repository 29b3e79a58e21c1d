"""The automatic budget in closed loop (`suffixspec.engine.closedloop`): the real engine and proposer,
a scripted tiny model and a simulated clock driven by a cost curve. On every simulated curve and both
workloads, the automatic budget reaches at least 0.95 of the best fixed budget's throughput
(committed tokens over simulated seconds; the committed tokens are the same for every budget, so
this is a comparison of simulated time), and the exploring of untried sizes stays bounded."""

import dataclasses

import numpy as np
import pytest

from suffixspec.engine import closedloop as cl
from suffixspec.engine.budget import EXPLORE_CAP, EXPLORE_SHARE, BudgetPolicy
from suffixspec.engine.costmodel import CostModel

import support.tiny_models  # noqa: F401  (one torch thread: tiny models run much faster so)


@pytest.mark.parametrize("curve", sorted(cl.CURVES))
@pytest.mark.parametrize("workload", sorted(cl.WORKLOADS))
def test_auto_is_within_5_percent_of_the_best_fixed_budget(workload, curve):
    got = cl.compare(workload, curve, rows=4)
    tokens = {a.tokens for k, a in got.items() if k != "ratio"}
    assert len(tokens) == 1  # the same committed tokens at every budget (identical greedy output)
    best = max(cl.FIXED_BUDGETS, key=lambda b: got[b].throughput)
    assert got["auto"].seconds <= got[best].seconds / 0.95, (workload, curve, best, got["ratio"])


@pytest.mark.parametrize("curve", ["flat", "steep", "proportional"])
def test_auto_at_one_request(curve):
    got = cl.compare("copy", curve, rows=1, budgets=(0, 4, 16, 64))
    assert got["ratio"] >= 0.95, got["ratio"]


def test_a_flat_curve_drafts_wide_a_proportional_one_not_at_all():
    flat = cl.run_arm("copy", "flat", "auto", rows=4)
    assert flat.drafted_per_round >= 8  # the old margin stopped a flat curve's chat workload at ~2.4 nodes
    prop = cl.run_arm("copy", "proportional", "auto", rows=4)
    assert prop.drafted_per_round < 0.5


def test_a_wrong_start_curve_is_corrected_online_not_trapped():
    """Started from a proportional curve (speculation looks hopeless) on flat hardware, the policy
    explores the sizes the guess priced out and learns what they cost; pinned (`learn_cost=False`)
    it keeps the guess and never speculates."""
    wl = dataclasses.replace(cl.WORKLOADS["copy"], name="copy16", requests=16)
    wrong = cl.CURVES["proportional"].relative()
    learning = cl.run_arm(wl, "flat", "auto", rows=4, cost_curve=wrong)
    pinned = cl.run_arm(wl, "flat", "auto", rows=4, cost_curve=wrong, learn_cost=False)
    assert pinned.drafted_per_round == 0
    assert learning.drafted_per_round > 0.5 and learning.throughput > 1.4 * pinned.throughput


def test_exploring_costs_at_most_its_share():
    """A policy whose curve is right but has not been observed explores the sizes it would price
    out only within its allowance: the predicted loss of all exploring rounds stays within
    EXPLORE_SHARE of the predicted decode time, plus the allowance's cap; and once every size it
    explored was seen, it stops."""
    from suffixspec.draft.tree import DraftTree
    from suffixspec.verify.batch import RoundBatch

    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    cost = CostModel(sizes, [1.0 + 0.3 * (s - 1) for s in sizes])
    policy = BudgetPolicy(cost_model=cost)
    rng = np.random.default_rng(0)
    n = 32
    tree = DraftTree(rng.integers(0, 50, n), np.arange(n) - 1, scores=np.linspace(0.9, 0.3, n))
    batch = RoundBatch.build([tree] * 2, [100, 100], pending=[[1], [1]]).with_sizing()
    chosen = []
    for _ in range(600):
        k = len(policy.size_round(batch)[0])
        chosen.append(k)
        cost.observe(2 * (k + 1), float(cost(2 * (k + 1), batch=2)), batch=2)  # the hardware is as the curve says
    assert 1 <= policy.explored <= CostModel.GUESS_PASSES * len(CostModel.SIZES)  # each size at most twice
    assert policy.explore_spent <= policy.explore_earned + EXPLORE_CAP * float(cost(2, batch=2))
    assert policy.explore_earned <= EXPLORE_SHARE * sum(float(cost(2 * (k + 1), batch=2)) for k in chosen) + 1e-9
    assert len(set(chosen[-100:])) == 1  # settled: every size it explored was seen
