"""The round's typed seams: `RoundBatch` (what the engine hands the policy and the verifier),
a request's lifecycle (`lifecycle.Request`: stage and session state), and `PhaseTimer`."""

import numpy as np
import pytest

from suffixspec.draft.tree import DraftTree
from suffixspec.engine.budget import BudgetPolicy, CostModel, RankCalibration
from suffixspec.engine.lifecycle import PendingClose, Request, SessionState, Stage
from suffixspec.engine.stats import GenerationStats, PhaseTimer
from suffixspec.errors import BadInputError, InternalError
from suffixspec.verify.batch import RoundBatch


def test_build_fills_neutral_values_and_broadcasts_single_values():
    trees = [DraftTree.empty(), DraftTree([1], [-1])]
    batch = RoundBatch.build(trees, [3, 4], eos=frozenset([7]), samplers="s")
    assert len(batch) == 2 and batch.width == 1
    assert batch.limits.dtype == np.int64 and batch.limits.tolist() == [3, 4]
    assert batch.auto.tolist() == [True, True]
    assert batch.weights.tolist() == [1.0, 1.0] and batch.factors.tolist() == [1.0, 1.0]
    assert batch.continuing.shape == (2, 1) and (batch.continuing == 1.0).all()
    assert batch.eos == [frozenset([7])] * 2 and batch.samplers == ["s", "s"]
    assert batch.keys.tolist() == [0, 1] and batch.generated.tolist() == [0, 0]
    assert RoundBatch.build(trees, [3, 4], pending=[[1, 2, 3], [4]]).width == 3


def test_build_refuses_rows_that_do_not_line_up():
    with pytest.raises(BadInputError, match="limits: expected 2 rows"):
        RoundBatch.build([DraftTree.empty()] * 2, [3])
    with pytest.raises(BadInputError, match="weights: expected 2 rows, got 3"):
        RoundBatch.build([DraftTree.empty()] * 2, [3, 3], weights=[1, 1, 1])


def test_continuing_rows_read_as_the_kernel_read_them():
    """Unknown rows become chances of 1 and short rows extend with their last entry: at every depth the
    normalised array holds what the row said (brute force over depths)."""
    rng = np.random.default_rng(3)
    for _ in range(100):
        b = int(rng.integers(1, 6))
        rows = [None if rng.uniform() < 0.3 else np.sort(rng.uniform(0, 1, int(rng.integers(1, 8))))[::-1]
                for _ in range(b)]
        cont = RoundBatch.build([DraftTree.empty()] * b, [1] * b, continuing=rows).continuing
        for i, row in enumerate(rows):
            for d in range(cont.shape[1] + 3):
                got = cont[i, min(d, cont.shape[1] - 1)]
                want = 1.0 if row is None else row[min(d, len(row) - 1)]
                assert got == want


def test_size_round_keeps_fixed_budget_rows_as_they_are():
    policy = BudgetPolicy(cost_model=CostModel([1, 2, 4, 8, 16, 32], [1, 1, 1.6, 2.2, 4, 8]),
                          calibration=RankCalibration(prior_ratio=1.0))
    weak = DraftTree(np.arange(1, 9), np.arange(8) - 1, np.full(8, 0.01))
    sized = policy.size_round(RoundBatch.build([weak, weak], [64, 64], auto=[True, False]))
    assert len(sized[0]) == 0  # not worth its pass
    assert sized[1] is weak  # a fixed budget is the caller's choice
    # sizing the automatic row alone decides the same size as with the fixed row's tree left out
    alone = policy.size_round(RoundBatch.build([weak, DraftTree.empty()], [64, 64]))
    assert len(alone[0]) == len(sized[0])


def test_with_sizing_replaces_only_the_sizing_fields():
    batch = RoundBatch.build([DraftTree.empty()] * 2, [3, 4], keys=[5, 6])
    sized = batch.with_sizing(weights=[0.5, 1.0], continuing=[None, [0.5]])
    assert sized.weights.tolist() == [0.5, 1.0] and sized.factors.tolist() == [1.0, 1.0]
    assert sized.continuing.tolist() == [[1.0], [0.5]]
    assert sized.keys.tolist() == [5, 6] and batch.weights.tolist() == [1.0, 1.0]


class FakeSession:
    def __init__(self, prompt):
        self.prompt, self.seen = list(prompt), []

    def extend(self, tokens):
        self.seen.extend(tokens)


class FakeProposer:
    def __init__(self):
        self.started = []

    def start(self, prompt, request_id=None, filter=None):
        self.started.append((list(prompt), request_id, filter))
        return FakeSession(prompt)


def request(budget="auto"):
    return Request(0, 0, 8, None, budget, [1, 2, 3], [1, 2, 3], request_id="r", filter="f")


def test_stages_move_only_forward():
    rq = request()
    assert rq.stage is Stage.WAITING
    rq.move(Stage.RUNNING)
    with pytest.raises(InternalError, match="no move from running to waiting"):
        rq.move(Stage.WAITING)
    rq.move(Stage.FINISHED)
    for stage in Stage:
        with pytest.raises(InternalError):
            rq.move(stage)
    cancelled = request()
    cancelled.move(Stage.FINISHED)  # cancelled while queued
    assert cancelled.stage is Stage.FINISHED


def test_session_states_keep_their_invariant():
    """OPEN exactly when a session exists; a deferred session opens over the prompt when it first
    drafts, or on the way out; a plain request never gets one."""
    proposer = FakeProposer()
    rq = request()
    rq.defer()
    assert rq.session_state is SessionState.DEFERRED and rq.session is None
    rq.output += [4, 5]
    rq.context += [4, 5]
    rq.open(proposer)
    assert rq.session_state is SessionState.OPEN and rq.session is not None
    assert proposer.started == [([1, 2, 3], "r", "f")] and rq.unfed == [4, 5]
    rq.catch_up()
    assert rq.session.seen == [4, 5] and rq.unfed == []
    rq.unfed.append(6)
    pending = rq.close()
    assert pending == PendingClose([6], session=pending.session) and pending.session.seen == [4, 5]
    assert rq.session_state is SessionState.NONE and rq.session is None and rq.unfed == []
    assert rq.close() is None

    never = request()
    never.defer()
    never.output.append(9)
    never.context.append(9)
    out = never.close()
    assert out.session is None and out.prompt == [1, 2, 3] and out.unfed == [9]
    assert (out.request_id, out.filter) == ("r", "f")

    plain = request(budget=0)
    plain.defer()
    plain.open(proposer)
    assert plain.session_state is SessionState.NONE and plain.close() is None


def test_phase_timer_charges_laps_to_named_fields():
    ticks = iter([0.0, 1.0, 1.5, 4.0, 4.25])
    timer = PhaseTimer(lambda: next(ticks))
    timer.lap("draft")
    timer.lap("size")
    timer.lap("verify")
    timer.lap("draft")
    assert (timer["draft"], timer["size"], timer["verify"], timer["settle"]) == (1.25, 0.5, 2.5, 0.0)
    assert timer.total() == 4.25
    stats = GenerationStats(requests=[])
    stats.proposer_s = 1.0
    timer.charge(stats, {"draft": "proposer_s", "verify": "verifier_s"})
    assert (stats.proposer_s, stats.verifier_s, stats.budget_s) == (2.25, 2.5, 0.0)
