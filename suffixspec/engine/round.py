"""One round of the running batch: its phases, and where their time is charged.

`RoundRunner.run` reads top-down, one `RowRound` per request:

* draft: each row's tree from its proposer session (one batched call), plus its prediction's path and
  the recycled predictions, pruned to its budget and to what it may still commit; a deferred session
  opens here, and finished requests' sessions close just before the proposer drafts;
* size: the budget policy prunes the automatic rows' trees (`BudgetPolicy.size_round`);
* verify: one forward pass over every row's pending tokens and tree, acceptance, cache commit;
* settle: tokens committed up to where `Decoding.take` ends each output; statistics; events;
* feed: committed tokens toward the proposer sessions (taken when they next draft);
* learn: the policy's calibration, the recycled predictions' table (harvested in the pass and
  calibrated only in rounds where some row drafted from it: speculation off costs it nothing).

Contract:

* Phases are charged per `ROUND_CHARGES` (draft and feed to `proposer_s`, size and learn to
  `budget_s`, verify to `verifier_s`; settling nowhere).
* `run` returns the requests that go on, in order, and keeps only their rows of the KV state; the
  finished rows go to `keep_rows` first (the engine's prefix pool).
* A round reads the engine's state through `RoundRunner`'s fields, never the engine itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..draft.prediction import with_path
from ..draft.recycle import harvest_round
from ..draft.tree import DraftTree, prune_tree
from ..verify.batch import RoundBatch
from .budget import DraftCadence, tail_weights
from .lifecycle import CloseQueue, Event, Request, SessionState, Stage
from .stats import GenerationStats, PhaseTimer

__all__ = ["RowRound", "ROUND_CHARGES", "RoundRunner"]


@dataclass
class RowRound:
    """One request's part of one round."""

    request: Request
    limit: int  # most tokens it may commit this round
    proposed: DraftTree = field(default_factory=DraftTree.empty)  # drafted, before the budget policy
    tree: DraftTree = field(default_factory=DraftTree.empty)  # verified
    path: list[int] = field(default_factory=list)  # the prediction's path merged into the tree
    tokens: list[int] = field(default_factory=list)  # committed
    accepted_nodes: list[int] = field(default_factory=list)  # tree nodes whose tokens were committed
    recycled: Any = None  # the `recycle.RecycledDraft` its tree was cut from, when it recycles
    logprobs: list | None = None  # per committed token, when its sampler reports them
    reason: str = ""  # finish reason, "" while the request goes on


# where a round's phases are charged in the run's statistics (settling is charged nowhere)
ROUND_CHARGES = {"draft": "proposer_s", "feed": "proposer_s", "size": "budget_s", "learn": "budget_s",
                 "verify": "verifier_s"}


@dataclass
class RoundRunner:
    """The engine's state that its rounds read and write (shared with the engine, not copied):
    `gen` (its proposer, recycle table), `policy`, `stats`, `clock` and `now` (seconds on the engine's
    clock), `closes` (finished requests' sessions), `stream(index, tokens)`, `min_weight` (the floor
    of `tail_weights`)."""

    gen: Any
    policy: Any
    stats: GenerationStats
    clock: Callable[[], float]
    now: Callable[[], float]
    closes: CloseQueue
    stream: Callable[[int, list[int]], Any] | None = None
    min_weight: float = 0.25
    keep_rows: Callable[[Any, list[int], list[Request]], Any] | None = None  # finished rows, before they go

    def run(self, state, requests: list[Request], events: list[Event], drafts: bool = True,
            cadence: DraftCadence | None = None, waiting: bool = False) -> list[Request]:
        """One round of `requests` (the rows of `state`); returns those that go on, in order. With
        `drafts` False, rows with an automatic budget and no prediction draft nothing. `cadence`
        (the running batch's) observes whether a drafting round verified any automatic row's tree,
        and what its drafting cost against the whole round. `waiting`: requests wait for a slot."""
        rows = [RowRound(rq, rq.max_new - len(rq.output)) for rq in requests]
        timer = PhaseTimer(self.clock)
        closes_s = self.draft(rows, drafts)
        timer.lap("draft")
        batch = self.size(rows, self.batch(rows), waiting)
        observed = cadence is not None and drafts and bool(batch.auto.any())
        verified = observed and any(len(t) for t, a in zip(batch.trees, batch.auto) if a)
        timer.lap("size")
        self.verify(state, rows, batch)
        timer.lap("verify")
        self.settle(rows, events)
        timer.lap("settle")
        self.feed(rows)
        timer.lap("feed")
        self.learn(rows)
        timer.lap("learn")
        if observed:  # what drafting cost this round (the closes are owed anyway), against the round
            cadence.observe(verified, cost_s=timer["draft"] + timer["size"] + timer["learn"] - closes_s,
                            round_s=timer.total() - closes_s)
        stats = self.stats
        timer.charge(stats, ROUND_CHARGES)
        stats.rounds += 1
        stats.plain_rounds += all(len(r.tree) == 0 for r in rows)
        stats.record_budgets([len(r.tree) for r in rows])
        keep = [i for i, r in enumerate(rows) if not r.reason]
        if len(keep) < len(rows):
            if self.keep_rows is not None:
                done = [i for i, r in enumerate(rows) if r.reason]
                self.keep_rows(state, done, [requests[i] for i in done])
            state.select_rows(keep)
        return [requests[i] for i in keep]

    def flush_closes(self) -> None:
        """Close the queued sessions: before the proposer next drafts, and when the engine goes idle
        or closes, so that work is never on a newcomer's time to first token and every proposal
        sees the outputs that finished before it (`CloseQueue.flush`)."""
        self.closes.flush(self.gen.proposer)

    # ---------------------------------------------------------------------------------- phases

    def draft(self, rows: list[RowRound], drafts: bool = True) -> float:
        """Each row's tree from its proposer session (one batched call), plus its prediction's path and,
        when it recycles, the recycled predictions, pruned to its budget and to what it may still
        commit. Without `drafts`, automatic rows
        without a prediction draft nothing. Returns the seconds spent closing finished sessions."""
        budgets = []
        for r in rows:
            rq = r.request
            if rq.auto and not drafts and rq.prediction is None:
                budgets.append(0)
                continue
            want = self.policy.max_budget if rq.auto else int(rq.budget)
            budgets.append(max(0, min(want, r.limit - 1)))
        # a deferred session opens when its request first drafts, never on its prefill (no output yet)
        opening = [i for i, r in enumerate(rows) if budgets[i] > 0 and r.request.output
                   and r.request.session_state is SessionState.DEFERRED]
        live = sorted(opening + [i for i, r in enumerate(rows)
                                 if budgets[i] > 0 and r.request.session_state is SessionState.OPEN])
        closes_s = 0.0
        if live and self.closes:  # the outputs that finished before join the past responses first
            t = self.clock()
            self.flush_closes()
            closes_s = self.clock() - t
        for i in opening:
            rows[i].request.open(self.gen.proposer)
        if live:
            sessions = [rows[i].request.session for i in live]
            for i in live:
                rows[i].request.catch_up()
            wanted = [budgets[i] for i in live]
            batch = getattr(self.gen.proposer, "propose_batch", None)
            if batch is not None and len(live) > 1:  # one session: its own call is the cheaper path
                got = batch(sessions, wanted)
            else:
                got = [s.propose(b) for s, b in zip(sessions, wanted)]
            for i, tree in zip(live, got):
                rows[i].proposed = tree if tree is not None else DraftTree.empty()
        for r, b in zip(rows, budgets):
            pred = r.request.prediction
            if pred is not None and b > 0:
                r.path, scores = pred.draft(b)
                if r.path:
                    r.proposed = with_path(r.proposed, r.path, scores)
            if r.request.recycle and b > 0:  # one best-first tree over the copy drafts and the recycled ones
                r.recycled = self.gen.recycle_table.grow(r.proposed, r.request.context[-2:], b, r.limit - 1)
                r.proposed = r.recycled.tree
            if len(r.proposed):
                r.proposed = prune_tree(r.proposed, b, r.limit - 1)
            grammar = r.request.decoding.grammar
            if grammar is not None and len(r.proposed):  # nodes the grammar forbids can never be accepted
                r.proposed = grammar.prune(r.proposed, r.request.output)
            r.tree = r.proposed
        return closes_s

    @staticmethod
    def batch(rows: list[RowRound]) -> RoundBatch:
        """The round's rows as one `RoundBatch` for the policy and the verifier (sizing fields neutral)."""
        requests = [r.request for r in rows]
        return RoundBatch.build(
            [r.tree for r in rows], [r.limit for r in rows], pending=[rq.pending for rq in requests],
            auto=[rq.auto for rq in requests], samplers=[rq.decoding.sampler for rq in requests],
            eos=[rq.decoding.eos for rq in requests], contexts=[rq.context for rq in requests],
            keys=[rq.key for rq in requests], generated=[len(rq.output) for rq in requests])

    def size(self, rows: list[RowRound], batch: RoundBatch, waiting: bool = False) -> RoundBatch:
        """The budget policy chooses the round's draft size over the rows with an automatic budget;
        returns the batch with the sized trees (each row's `tree` follows)."""
        if not any(a and len(t) for a, t in zip(batch.auto, batch.trees)):
            return batch
        requests = [r.request for r in rows]
        weights = tail_weights([rq.stats.rounds for rq in requests], [len(rq.output) for rq in requests],
                               [rq.max_new for rq in requests], self.min_weight, waiting=waiting)
        lengths, depth = self.policy.lengths, self.policy.max_budget
        # rows without a tree have no node to discount: their entries are never read
        continuing = lengths.continuing_rows([len(rq.output) for rq in requests], depth) if len(lengths) else None
        batch = batch.with_sizing(weights=weights, factors=[rq.trust.factor() for rq in requests],
                                  continuing=continuing)
        batch.trees = self.policy.size_round(batch)
        for r, tree in zip(rows, batch.trees):
            r.tree = tree
        return batch

    def verify(self, state, rows: list[RowRound], batch: RoundBatch) -> None:
        """One forward pass over every row's pending tokens and tree; acceptance; cache commit."""
        from ..verify.accept import accept

        t_pass = self.clock()
        logits, root = state.forward(batch.pending, batch.trees)
        results = accept(logits, root, batch)
        if any(r.recycled is not None for r in rows):  # a round no row drafted from the table leaves it as it is
            harvest_round(self.gen.recycle_table, logits, root, batch, results)
        state.commit([res.accepted_nodes for res in results])
        if batch.width == 1:  # prefills are dominated by the prompt: neither counted nor observed
            fed = len(batch) * (1 + max(len(t) for t in batch.trees))
            self.stats.decode_pass_tokens[fed] += 1
            if batch.auto.any():  # the whole step: a tree's acceptance walk and cache rewrite are part of its cost
                self.policy.observe_pass(len(batch), fed, self.clock() - t_pass)
        for r, res in zip(rows, results):
            r.tokens = res.tokens
            r.accepted_nodes = res.accepted_nodes
            r.logprobs = res.logprobs

    def settle(self, rows: list[RowRound], events: list[Event]) -> None:
        """Commit each row's tokens up to where `Decoding.take` ends its output; statistics; events."""
        now = self.now()
        for r in rows:
            rq = r.request
            rs = rq.stats
            tokens, r.reason = rq.decoding.take(rq.output, r.tokens, rq.max_new)
            rq.context.extend(tokens)
            rq.pending = [tokens[-1]]
            r.tokens = tokens
            n_acc = min(len(r.accepted_nodes), len(tokens))
            if not rs.rounds:
                rs.ttft_s = now - rq.added_s
            rs.rounds += 1
            rs.committed_per_round.append(len(tokens))
            rs.drafted += len(r.tree)
            rs.accepted += n_acc
            for d in range(n_acc):
                if d == len(rs.accepted_by_position):
                    rs.accepted_by_position.append(0)
                rs.accepted_by_position[d] += 1
            rs.new_tokens = len(rq.output)
            rs.e2e_s = now - rq.added_s
            if rq.prediction is not None:
                advance_prediction(r, n_acc)
            if r.reason:
                rs.finish_reason = r.reason
                if rq.auto:  # how long answers run (an output cut at its limit runs on past it)
                    self.policy.lengths.observe(len(rq.output), r.reason != "length")
                rq.move(Stage.FINISHED)
            if self.stream is not None and tokens:
                self.stream(rq.index, list(tokens))
            logprobs = None if r.logprobs is None else r.logprobs[: len(tokens)]
            events.append(Event(rq.index, list(tokens), now, r.reason, logprobs=logprobs))

    def feed(self, rows: list[RowRound]) -> None:
        """Committed tokens toward the proposer sessions (taken when they next draft); finished
        requests' sessions close."""
        for r in rows:
            rq = r.request
            if rq.session_state is SessionState.OPEN:
                rq.unfed.extend(r.tokens)
            if r.reason:
                self.closes.add(rq)

    def learn(self, rows: list[RowRound]) -> None:
        """The policy learns from the round's trees: per request (`RequestTrust`), then across requests."""
        for r in rows:
            if r.recycled is not None:
                self.gen.recycle_table.learn(r.recycled, r.tree, r.tokens)
        auto = [r for r in rows if r.request.auto]
        if not auto:
            return
        calibration = self.policy.calibration
        for r in auto:
            r.request.trust.learn(calibration, r.tree, r.accepted_nodes, r.proposed, r.tokens, r.limit)
        self.policy.learn([r.tree for r in auto], [r.accepted_nodes for r in auto])


def advance_prediction(r: RowRound, n_acc: int) -> None:
    """The row's prediction moves past its committed tokens (`Prediction.advance`)."""
    pred = r.request.prediction
    on_path = 0  # accepted drafts that follow the prediction's path
    while on_path < min(n_acc, len(r.path)) and r.tokens[on_path] == r.path[on_path]:
        on_path += 1
    pred.advance(r.request.output, r.tokens, min(len(r.path), len(r.tree)), on_path)
