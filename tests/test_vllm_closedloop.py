"""The vLLM adapter's draft sizing in closed loop (`suffixspec.integrations.vllm_closedloop`): its real
`DraftCore` drafting for a scripted target on a simulated step clock. On every simulated curve, at 8
rows and at 1, its own lengths reach at least 0.95 of the best fixed cap's throughput (committed tokens
over simulated seconds; the outputs are the same at every cap, so this compares simulated time), and
what it learns (the step's cost line, the drafts' acceptance) is what the loop showed it."""

import numpy as np
import pytest

from suffixspec.integrations import vllm_closedloop as vc
from suffixspec.integrations.vllm_drafting import AcceptCalibration, MeasuredStepCost


def ratio(workload, curve, rows, seeds=(0,)):
    runs = [vc.compare(workload, curve, rows=rows, seed=s) for s in seeds]
    arms = ["auto", *vc.FIXED_CAPS]
    pooled = {a: sum(r[a].tokens for r in runs) / sum(r[a].seconds for r in runs) for a in arms}
    best = max(vc.FIXED_CAPS, key=lambda c: pooled[c])
    assert all(r["auto"].tokens == r[best].tokens > 0 for r in runs)  # the same output: only time differs
    return pooled["auto"] / pooled[best], best, runs


@pytest.mark.parametrize("curve", sorted(vc.CURVES))
@pytest.mark.parametrize("rows", [8, 1])
def test_the_adapters_lengths_are_within_5_percent_of_the_best_fixed_cap(curve, rows):
    for workload in vc.WORKLOADS:
        got, best, _ = ratio(workload, curve, rows)
        assert got >= 0.95, (workload, curve, rows, best, got)


def test_flat_drafts_long_proportional_at_eight_rows_not_at_all():
    flat = vc.run_arm("copy", "flat", "auto", rows=8)
    prop = vc.run_arm("copy", "proportional", "auto", rows=8)
    assert flat.drafted > 4 * flat.steps  # most rows draft most of the cap
    assert prop.drafted < prop.steps  # under a token a step of 8 rows: what learning the slope cost


def test_the_target_is_deterministic_and_the_clock_counts_fed_tokens():
    a = vc.run_arm("chat", "proportional", 0, rows=2)
    b = vc.run_arm("chat", "proportional", 4, rows=2)
    assert a.outputs == b.outputs and a.tokens == b.tokens == 16 * 64
    # proportional, no drafts: a step costs a token a running row (prefills are free; the first
    # step, only prefills, costs one token's step)
    wl = vc.WORKLOADS["chat"]
    assert a.seconds == pytest.approx(vc.STEP_S * (wl.requests * (wl.max_new_tokens - 1) + 1))
    assert a.drafted == a.accepted == 0 and b.accepted <= b.drafted


def test_calibration_learns_the_acceptance_the_scores_miss():
    """Drafts whose scores say 0.5 per token, judged by an engine accepting 0.9 of the tokens at depth
    1 and 0.95 after: the calibrated scores follow the engine (per depth group), not the scores."""
    rng = np.random.default_rng(0)
    cal = AcceptCalibration()
    scores = 0.5 ** np.arange(1, 9)
    for _ in range(3000):
        acc = 0
        while acc < 8 and rng.random() < (0.9 if acc == 0 else 0.95):
            acc += 1
        cal.observe(scores, acc)
    parents = np.arange(-1, 7)
    depths = np.arange(1, 9)
    got = cal.scores(parents, depths, scores, np.zeros(1, np.int64), np.array([8]))
    want = 0.9 * 0.95 ** np.arange(8)
    assert np.allclose(got, want, rtol=0.06), (got, want)


def test_a_slope_not_yet_measured_is_explored_not_trusted():
    """Steps that all verify the same tokens leave the slope unmeasured: the planning line is lower
    than the fit (drafts explore); once steps vary, it meets the fit."""
    cost = MeasuredStepCost(k=8)
    for _ in range(40):
        cost.observe(16, 0.1, 8)
    a, c = cost.line(8)
    assert cost.planning_line(8)[1] == pytest.approx(0.5 * c)  # the most exploring lowers it
    rng = np.random.default_rng(0)
    for _ in range(200):
        x = int(rng.integers(0, 65))
        cost.observe(8 + x, 0.1 * (1 + 0.03 * x) * rng.uniform(0.99, 1.01), 8)
    a, c = cost.line(8)
    assert c == pytest.approx(0.003, rel=0.1)
    assert cost.planning_line(8)[1] == pytest.approx(c, rel=0.1)


def test_the_core_calibrates_by_what_the_engine_accepted_of_its_last_draft():
    core = vc._core(8, 1, 64, {"step_cost": vc.FREE})
    seq = [5, 6, 7, 8, 9, 10, 11, 12] * 6
    table = np.array([seq], np.int64)
    draft = core.step([0], [1], [len(seq)], table)[0]
    scores = list(core.scores[0])
    assert len(draft) >= 3 and core.calibration.judged == 0
    accepted = 2  # the engine takes two drafted tokens and its own third
    seq2 = seq + draft[:accepted] + [63]
    core.step([0], [accepted + 1], [len(seq2)], np.array([seq2], np.int64))
    assert core.calibration.judged == accepted + 1  # the rejected token was judged; those after it not
    assert core.calibration.hits.sum() == pytest.approx(accepted)
    chances = np.array(scores[: accepted + 1]) / np.concatenate(([1.0], scores[:accepted]))
    assert core.calibration.expected.sum() == pytest.approx(chances.sum())
