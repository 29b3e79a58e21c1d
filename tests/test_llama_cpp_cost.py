"""SuffixSpecDraftModel's measured evaluation cost (`RecentStepCost`) and its tries of refused long drafts,
against a fake of llama-cpp-python's calling convention and a fake clock (no llama_cpp needed)."""

import numpy as np
import pytest
from test_integration_llama_cpp import Clock, FakeLlama, copy_edit, draft_class

from suffixspec.integrations import llama_cpp as adapter


def reference_line(times, prior_slope):
    """The fit by brute force: least squares over a grid of (a, c) on each length's fastest recent step."""
    pts = [(x, float(min(t)), len(t)) for x, t in enumerate(times) if t]
    if len(pts) == 1:
        x, y, _ = pts[0]
        a = y / (1 + prior_slope * x)
        return a, a * prior_slope
    best = None
    for a in np.linspace(0.0, 0.1, 401):
        for c in np.linspace(0.0, 0.02, 401):
            err = sum(w * (y - a - c * x) ** 2 for x, y, w in pts)
            if best is None or err < best[0]:
                best = (err, a, c)
    return best[1], best[2]


def test_the_line_is_the_weighted_fit_to_the_fastest_recent_steps():
    rng = np.random.default_rng(0)
    cost = adapter.RecentStepCost(k=10, window=5)
    assert cost.line() == pytest.approx((adapter.PRIOR_STEP_SECONDS, adapter.PRIOR_STEP_SECONDS * adapter.PRIOR_SLOPE))
    cost.observe(1, 0.02, 1)  # one length measured: the prior's slope through it
    assert cost.line() == pytest.approx((0.02, 0.02 * adapter.PRIOR_SLOPE))
    for _ in range(40):
        x = int(rng.integers(0, 11))
        cost.observe(1 + x, 0.02 + 0.005 * x + rng.normal(0, 0.002), 1)
    a, c = cost.line()
    ra, rc = reference_line(cost.times, adapter.PRIOR_SLOPE)
    assert a == pytest.approx(ra, abs=2.5e-4) and c == pytest.approx(rc, abs=5e-5)
    assert cost([1, 11]).tolist() == pytest.approx([a, a + 10 * c])


def test_one_stall_free_step_outvotes_stalls():
    cost = adapter.RecentStepCost(k=10, window=5)
    for _ in range(5):
        cost.observe(1, 0.02, 1)
    for _ in range(4):
        cost.observe(11, 6.0, 1)  # evaluations stalled for seconds
    assert cost.line()[1] > 0.5
    cost.observe(11, 0.08, 1)
    a, c = cost.line()
    assert a == pytest.approx(0.02, rel=0.05) and c == pytest.approx(0.006, rel=0.05)


class StallClock(Clock):
    """A fake clock whose first `stalls` evaluations that advance it by more than `over` seconds take
    `extra` seconds more (llama.cpp stalled by something else on the machine)."""

    def __init__(self, stalls, over, extra):
        self._now, self.stalls, self.over, self.extra = 0.0, stalls, over, extra

    @property
    def now(self):
        return self._now

    @now.setter
    def now(self, value):
        if value - self._now > self.over and self.stalls > 0:
            value += self.extra
            self.stalls -= 1
        self._now = value


def run(model, clock, per_token, rounds, seed):
    real = adapter.time
    adapter.time = clock
    try:
        lengths = []
        for r in range(rounds):
            prompt, answer = copy_edit(seed=seed + r)
            llama = FakeLlama(clock=clock, base=0.02, per_token=per_token)
            out, _ = llama.generate(model, prompt, answer)
            assert out == answer
            lengths.append([len(d) for d in llama.drafts])
    finally:
        adapter.time = real
    return lengths


def test_drafts_come_back_after_early_stalls():
    """Long drafts stall at first: the line refuses them; tried again later, they pay and return."""
    clock = StallClock(stalls=4, over=0.03, extra=3.0)
    model = draft_class()(max_draft=8)
    lengths = run(model, clock, per_token=0.002, rounds=4, seed=20)
    assert clock.stalls == 0 and model.stats["explored"] >= 1
    assert np.mean(lengths[-1]) > 4  # drafting long again by the last sequence
    assert model.cost.line()[1] < 0.005


def test_tries_of_refused_drafts_grow_rare_where_drafts_never_pay():
    model = draft_class()(max_draft=8)
    clock = Clock()
    lengths = run(model, clock, per_token=0.03, rounds=4, seed=30)  # a drafted token costs 150% of an evaluation
    tries = [sum(1 for n in seq if n > 0) for seq in lengths]
    assert sum(len(seq) for seq in lengths) > 400
    assert model.stats["explored"] <= 8 and tries[-1] <= 2
    assert model.cost.line()[1] > 0.02


def test_the_response_cache_takes_a_finished_sequence_inline_by_default():
    assert draft_class()().config.cache_upkeep == "inline"
    assert draft_class()(cache_upkeep="background").config.cache_upkeep == "background"


def test_the_chosen_length_is_the_planners_choice_for_one_row():
    """The one-row shortcut picks what `plan_lengths` (checked by enumeration in test_vllm_drafting)
    picks: the first length of the best (1 + expected tokens) / evaluation cost."""
    from suffixspec.integrations.vllm_drafting import plan_lengths

    rng = np.random.default_rng(3)
    model = draft_class()(max_draft=10)
    for trial in range(300):
        model.cost = adapter.RecentStepCost(k=10, window=5)
        for _ in range(int(rng.integers(0, 12))):
            model.cost.observe(int(rng.integers(1, 12)), float(rng.uniform(0.01, 0.1)), 1)
        avail = int(rng.integers(0, 11))
        steps = rng.uniform(0.0, 1.0, 11) if trial % 3 else np.where(rng.random(11) < 0.5, 0.25, 0.0)
        values = np.cumsum(steps)
        values[0] = 0.0
        values[avail + 1:] = -np.inf
        want = int(plan_lengths(values[None, :], lambda t: model.cost(t, 1))[0])
        assert model._best_length(values.tolist()) == want
