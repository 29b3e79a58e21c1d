"""The automatic budget in closed loop (`suffixspec.engine.closedloop`): the real engine and proposer,
a scripted tiny model and a simulated clock driven by a cost curve. On every simulated curve and both
workloads, the automatic budget reaches at least 0.95 of the best fixed budget's throughput pooled
over three seeds, compared seed by seed on the same law, prompts, noise and spikes (committed
tokens over simulated seconds; the committed tokens are the same for every budget, so this is a
comparison of simulated time), with recycled predictions as the product decides them on the curve
(on where it is flat) and, where that is on, off too; and the exploring of untried sizes stays
bounded."""

import dataclasses

import numpy as np
import pytest

from suffixspec.engine import closedloop as cl
from suffixspec.engine.budget import EXPLORE_CAP, EXPLORE_SHARE, BudgetPolicy
from suffixspec.engine.costmodel import CostModel

import support.tiny_models  # noqa: F401  (one torch thread: tiny models run much faster so)

SEEDS = (0, 1, 2)  # each budget runs every seed's same law, prompts, noise and spikes (paired)


# every curve as the product runs it (recycling by its rule), and where that recycles, without too
CELLS = [(curve, None) for curve in sorted(cl.CURVES)] + [(c, False) for c in sorted(cl.CURVES) if cl.recycles(c)]


@pytest.mark.parametrize("curve,recycle", CELLS, ids=[f"{c}-{'product' if r is None else 'off'}" for c, r in CELLS])
@pytest.mark.parametrize("workload", sorted(cl.WORKLOADS))
def test_auto_is_within_5_percent_of_the_best_fixed_budget(workload, curve, recycle):
    """Pooled over seeds (one seed's run has a few requests, so its ratio moves by several percent
    with where the novel tokens fall); `compare` checks the outputs are the same at every budget, so
    the committed tokens are too and this compares simulated time. Every fixed budget runs under
    the same recycling setting as auto."""
    got = cl.compare_seeds(workload, curve, rows=4, seeds=SEEDS, recycle=recycle)
    assert got.recycle == (cl.recycles(curve) if recycle is None else recycle)
    assert got.ratio >= 0.95, (workload, curve, got.recycle, got.best, got.ratio, got.paired)
    assert got.worst >= 0.9, (workload, curve, got.recycle, got.best, got.paired)  # no seed far off


def test_the_product_recycles_on_the_flat_curves_only():
    assert {c for c in cl.CURVES if cl.recycles(c)} == {"flat", "noisy"}
    assert not cl.recycles("flat", cost_curve=cl.CURVES["steep"].relative())  # decided on the start curve


@pytest.mark.parametrize("curve", ["flat", "steep", "proportional", "concave", "spiky"])
def test_auto_at_one_request(curve):
    got = cl.compare_seeds("copy", curve, rows=1, budgets=(0, 4, 8, 16, 32, 64), seeds=SEEDS)
    assert got.ratio >= 0.95, (curve, got.best, got.ratio, got.paired)


def test_a_flat_curve_drafts_wide_a_proportional_one_not_at_all():
    flat = cl.run_arm("copy", "flat", "auto", rows=4)
    assert flat.drafted_per_round >= 8  # the old margin stopped a flat curve's chat workload at ~2.4 nodes
    prop = cl.run_arm("copy", "proportional", "auto", rows=4)
    assert prop.drafted_per_round < 0.5
    assert flat.recycle and not prop.recycle  # the product's rule on each curve


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
    chosen, explored_at = [], []
    for _ in range(600):
        before = policy.explored
        k = len(policy.size_round(batch)[0])
        chosen.append(k)
        if policy.explored > before:
            explored_at.append(int(cost.nearest(2 * (k + 1))))
        cost.observe(2 * (k + 1), float(cost(2 * (k + 1), batch=2)), batch=2)  # the hardware is as the curve says
    # the guess at two rows prices sizes above what this curve's one-token step shows, so exploring
    # tries some; a size is explored only until GUESS_PASSES passes showed it
    assert policy.explored == len(explored_at) >= 1
    assert max(np.bincount(explored_at)) <= CostModel.GUESS_PASSES
    assert policy.explore_spent <= policy.explore_earned + EXPLORE_CAP * float(cost(2, batch=2))
    assert policy.explore_earned <= EXPLORE_SHARE * sum(float(cost(2 * (k + 1), batch=2)) for k in chosen) + 1e-9
    assert len(set(chosen[-100:])) == 1  # settled: every size it explored was seen


def _slow_at(stalls_periods, x):
    return any(s <= x < e for s, e in stalls_periods)


def test_stalls_match_a_brute_force_clock():
    """`Stalls.finish` against stepping the clock in small increments through the same slow periods,
    and additive: work split into pieces ends when it ends whole (so every budget of a seed meets the
    same spikes at the same simulated times, however its passes cut the work)."""
    curve = cl.SimCurve("s", "flat", spike_p=0.2, spike_factor=4.0, spike_len=2.0)
    stalls = cl.Stalls(curve, 3)
    periods = []
    probe = cl.Stalls(curve, 3)
    while probe._start < 60:  # the same seed draws the same periods
        periods.append((probe._start, probe._end))
        probe._next()
    assert len(periods) >= 5
    dt = 1e-3
    t, done, ends = 0.0, 0.0, []
    works = [0.3, 1.7, 2.0, 0.05, 4.0, 1.0, 3.3, 0.9, 2.5, 1.25]
    target = np.cumsum(works)
    while len(ends) < len(works):  # brute force: work advances dt per dt of time, dt / factor when slow
        done += dt / (4.0 if _slow_at(periods, t + dt / 2) else 1.0)
        t += dt
        if done >= target[len(ends)] - 1e-9:
            ends.append(t)
    got, t = [], 0.0
    for w in works:
        t = stalls.finish(t, w)
        got.append(t)
    assert np.allclose(got, ends, atol=5e-3)
    whole = cl.Stalls(curve, 3).finish(0.0, float(target[-1]))
    assert whole == pytest.approx(got[-1])
    assert cl.Stalls(cl.CURVES["concave"], 3).finish(5.0, 2.5) == 7.5  # no spikes: work is time
