"""The automatic budget: how many draft nodes each round verifies.

A round's pass costs time as a function of the tokens it feeds (`CostModel` in `costmodel.py`, measured
on the running hardware or pinned, corrected online, its untried sizes explored within a bounded
share of the time); its drafts are worth their calibrated acceptance estimates
(`RankCalibration`: observed acceptance over the proposer's scores, by rank in the tree, learned
across requests; `RequestTrust`: how one request's own drafts fare, including trees proposed but not
verified, followed as `Shadow`s; `OutputLengths`: how likely an output still runs d tokens on, from
finished requests, which discounts deep drafts of answers likely to end). `BudgetPolicy.size_round`
picks the one draft size k for the round that maximises expected committed tokens per second, which
is 0 (plain decoding) when speculation would not pay; `tail_weights` weighs rows by how long they keep the batch busy. `DraftCadence` spaces
out the proposals of a batch that keeps choosing plain decoding. The policy only reads trees and
statistics and returns pruned trees: it never touches the model or the proposer.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from .._kernels import sizing
from ..draft.tree import DraftTree, prune_tree
from ..verify.batch import RoundBatch
from .costmodel import CostModel, check_relative_curve

__all__ = ["CostModel", "RankCalibration", "RequestTrust", "Shadow", "BudgetPolicy", "DraftCadence", "OutputLengths",
           "tail_weights", "check_relative_curve",
           "DEFAULT_MAX_BUDGET"]

DEFAULT_MAX_BUDGET = 64
SHADOW_NODES = 8  # the best nodes of an unverified tree that are checked against what followed
REQUEST_PRIOR = 4.0  # pseudo-count (in estimated accepted nodes) behind every request's factor ...
REQUEST_PRIOR_RATIO = 1.0  # ... at this factor: a new request is taken to draft as well as the others (`RequestTrust`)
REQUEST_DECAY = 0.95  # per round: a request that changes phase (prose, then copying) is re-evaluated
RISK_PER_ROW = 2.0  # times batch_margin: the weight of a tree's extra pass time per row beyond the first
EXPLORE_SHARE = 0.05  # of the predicted decode time that exploring untried sizes may lose (`_explore`)
EXPLORE_CAP = 8.0  # one-token steps: the most exploring allowance kept unspent
CADENCE_MAX_SHARE = 0.004  # of a quiet batch's rounds that drafting may take (see DraftCadence)


class RankCalibration:
    """Observed acceptance of draft nodes relative to their scores, by the node's rank in its tree.

    A tree's scores are the proposer's estimates of each node's acceptance; how far they are off
    depends on the workload and on the rank, so the ratio is kept per rank bucket (1, 2, 3-4, 5-6,
    7-8, 9-12, ... geometric), as exponentially decayed sums of scores and of accepted nodes. The
    pooled ratio of every bucket, over `prior` units of score at ratio `prior_ratio`, stands behind
    each bucket as `pool` units of score: the nodes of one tree stand or fall together along a path,
    so a deep bucket's few trees are few samples, and a bucket that an unlucky tree or two put low
    would stay low (the policy then stops short of those ranks, so no later tree corrects it, and
    decay moves both sums alike). The prior ratio is below 1 on purpose: a workload whose drafts beat
    their scores proves it within a few rounds, while one whose drafts fall short would pay for every
    wrong draft's padded pass until it had."""

    EDGES = np.array([1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024], np.int64)

    def __init__(self, decay: float = 0.995, prior: float = 2.0, prior_ratio: float = 0.7, low: float = 0.05,
                 high: float = 3.0, pool: float = 8.0):
        self.decay, self.prior, self.low, self.high = float(decay), float(prior), float(low), float(high)
        self.pool = float(pool)
        self.prior_ratio = float(prior_ratio)
        n = len(self.EDGES) + 1
        self.scored = np.zeros(n)  # decayed sum of drafted nodes' scores, per rank bucket
        self.accepted = np.zeros(n)  # decayed count of accepted nodes, per rank bucket
        self._factors: np.ndarray | None = None  # per bucket, until the next observation

    _RANK_BUCKETS = np.searchsorted(EDGES, np.arange(1, 2 * int(EDGES[-1]) + 1), side="left")

    def buckets(self, n: int) -> np.ndarray:
        """The bucket of ranks 1..n."""
        if n <= self._RANK_BUCKETS.shape[0]:
            return self._RANK_BUCKETS[:n]
        return np.searchsorted(self.EDGES, np.arange(1, n + 1), side="left")

    def factors(self, n: int) -> np.ndarray:
        """Multipliers for the scores of ranks 1..n."""
        if self._factors is None:
            self._factors = np.clip(self._ratio(), self.low, self.high)
        return self._factors[self.buckets(n)]

    def _ratio(self) -> np.ndarray:
        """Accepted nodes over their scores per bucket, behind the pooled ratio (before clipping)."""
        pooled = (self.accepted.sum() + self.prior * self.prior_ratio) / (self.scored.sum() + self.prior)
        return (self.accepted + self.pool * pooled) / (self.scored + self.pool)

    def apply(self, sorted_scores: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """Calibrated acceptance estimates of a tree's scores sorted best first (times `scale`), each at most 1."""
        return np.minimum(sorted_scores * (self.factors(len(sorted_scores)) * scale), 1.0)

    def observe(self, trees, accepted_nodes) -> None:
        """One round: every verified tree with the indices of its accepted nodes."""
        self.scored *= self.decay
        self.accepted *= self.decay
        self._factors = None
        for tree, acc in zip(trees, accepted_nodes):
            if not len(tree):
                continue
            order = np.argsort(-tree.scores, kind="stable")  # rank r holds node order[r]
            bucket = self.buckets(len(tree))
            np.add.at(self.scored, bucket, tree.scores[order])
            if len(acc):
                rank = np.empty(len(tree), np.int64)
                rank[order] = np.arange(len(tree))
                np.add.at(self.accepted, bucket[rank[np.asarray(acc, np.int64)]], 1.0)

    def to_dict(self) -> dict:
        edges = [1, *(int(e) + 1 for e in self.EDGES)]
        return {f"rank>={lo}": round(float(r), 3) for lo, r, w in zip(edges, self._ratio(), self.scored) if w > 0}


class Shadow:
    """A tree a round proposed but did not verify (the auto budget chose plain decoding), followed
    along the tokens committed after it: the nodes it would have had accepted. Greedy verification
    accepts exactly that path; under sampling the same draws would have, since the lossless rule
    follows the child that matches the sampled token. So a request learns how its drafts fare on
    every round, not only on the rounds that pay for a tree in the pass."""

    __slots__ = ("tokens", "parents", "node", "hits")

    def __init__(self, tree):
        self.tokens = tree.tokens.tolist()
        self.parents = tree.parents.tolist()
        self.node = -1  # the deepest node matched so far (-1: none yet)
        self.hits = 0  # nodes matched

    def feed(self, tokens) -> bool:
        """Follow newly committed tokens; True once resolved (a token left the tree, or a leaf was reached)."""
        for t in tokens:
            nxt = -1
            for i, (tok, par) in enumerate(zip(self.tokens, self.parents)):
                if par == self.node and tok == t:
                    nxt = i
                    break
            if nxt < 0:
                return True
            self.node = nxt
            self.hits += 1
        return self.node not in self.parents


class RequestTrust:
    """How one request's drafts fare against the calibrated estimates: decayed sums of the estimates of
    its verified trees and of the shadows of trees it proposed but did not verify (`predicted`), and of
    the nodes accepted or matched (`hits`), over a prior of `REQUEST_PRIOR` at `REQUEST_PRIOR_RATIO`.
    The calibration already learns what drafts are worth across requests, so the prior is that
    (ratio 1), and it weighs several nodes: a tree's nodes stand or fall together along a path, so
    one tree is nearly one sample, and a request of a few rounds would otherwise be judged by its
    first tree or two."""

    __slots__ = ("predicted", "hits", "shadows")

    def __init__(self):
        self.predicted = 0.0
        self.hits = 0.0
        self.shadows: list[Shadow] = []

    def factor(self) -> float:
        return min(max((self.hits + REQUEST_PRIOR * REQUEST_PRIOR_RATIO) / (self.predicted + REQUEST_PRIOR), 0.05), 3.0)

    def learn(self, calibration: RankCalibration, verified: DraftTree, accepted_nodes, proposed: DraftTree,
              committed: list[int], limit: int) -> None:
        """One round of this request: the tree it verified with its accepted nodes, the tree it had
        proposed before the budget pruned it, the tokens it committed and its token limit."""
        self.predicted *= REQUEST_DECAY
        self.hits *= REQUEST_DECAY
        if len(verified):
            self.predicted += float(calibration.apply(np.sort(verified.scores)[::-1]).sum())
            self.hits += len(accepted_nodes)
        elif len(proposed):
            shadow = prune_tree(proposed, SHADOW_NODES, limit - 1)
            if len(shadow):
                self.predicted += float(calibration.apply(np.sort(shadow.scores)[::-1]).sum())
                self.shadows.append(Shadow(shadow))
        if self.shadows:
            pending = []
            for sh in self.shadows:
                if sh.feed(committed):
                    self.hits += sh.hits
                else:
                    pending.append(sh)
            self.shadows = pending


def tail_weights(rounds, done, max_new, min_weight: float = 0.25, waiting: bool = False):
    """Weights of the rows' tokens for the auto budget: with nobody waiting, the batch lasts as long
    as its slowest request, so a row counts by its expected remaining rounds relative to the longest
    (remaining tokens / tokens per round so far, one token a round before any); with requests waiting
    (`waiting`), a freed slot is refilled at once and every token counts alike (None: all 1)."""
    if waiting or len(rounds) == 1:
        return None
    rounds = np.asarray(rounds, np.float64)
    done = np.asarray(done, np.float64)
    remaining = np.asarray(max_new, np.float64) - done
    expected_rounds = remaining * (rounds + 1.0) / (done + 1.0)
    return np.maximum(expected_rounds / expected_rounds.max(), min_weight)


class OutputLengths:
    """How long outputs run: the product-limit (Kaplan-Meier) estimate over the last `window` finished
    requests. An output that ended on its own (EOS, a stop sequence) is an event at its length; one
    cut at its token limit only shows that it runs past that length (censored). `prior` pseudo-outputs
    that never end sit in every risk set, so no estimate reaches 0 and, before any request finished,
    or past every length seen, nothing is discounted."""

    def __init__(self, window: int = 256, prior: float = 1.0):
        self.prior = float(prior)
        self._seen: deque[tuple[int, bool]] = deque(maxlen=int(window))
        self._survival: np.ndarray | None = None  # [x] = P(length > x), x = 0 .. longest seen + 1

    def __len__(self) -> int:
        return len(self._seen)

    def observe(self, length: int, ended: bool) -> None:
        self._seen.append((int(length), bool(ended)))
        self._survival = None

    def survival(self) -> np.ndarray:
        """P(length > x) for x = 0 .. the longest length seen + 1 (beyond: the last value)."""
        if self._survival is None:
            n = max((length for length, _ in self._seen), default=0) + 2
            lengths = np.fromiter((length for length, _ in self._seen), np.int64, len(self._seen))
            ended = np.fromiter((e for _, e in self._seen), bool, len(self._seen))
            events = np.bincount(lengths[ended], minlength=n).astype(np.float64)
            at_risk = np.cumsum(np.bincount(lengths, minlength=n)[::-1])[::-1] + self.prior  # length >= x
            self._survival = np.cumprod(1.0 - events / at_risk)
        return self._survival

    def continuing(self, done: int, depth: int) -> np.ndarray:
        """[d] = P(length > done + d | length > done), d = 0 .. `depth`: the chance that a draft node d
        deep in a request with `done` output tokens still saves a round (the output goes on past it)."""
        s = self.survival()
        at = s[np.minimum(np.arange(done, done + depth + 1), len(s) - 1)]
        return at / at[0]

    def continuing_rows(self, done, depth: int) -> np.ndarray:
        """`continuing(done[i], depth)` for every entry of `done`, as float64[len(done), depth + 1]."""
        s = self.survival()
        at = s[np.minimum(np.asarray(done, np.int64)[:, None] + np.arange(depth + 1), len(s) - 1)]
        return at / at[:, :1]


class DraftCadence:
    """How often a running batch whose automatic budget keeps choosing plain decoding drafts at all.

    Each round that drafted and verified no tree for any of its automatic rows lengthens a quiet
    streak; once `memory` rounds have passed since the batch last verified a tree (before that its
    quiet rounds are a pause between copies, not speculation switched off), the batch skips drafting
    for min(streak, `max_skip`, needed) rounds, so a batch that stays off proposes (and learns from
    shadows) once every `max_skip` + 1 rounds at the sparsest.
    `needed` is the fewest skips that keep drafting within `max_share` of the batch's rounds: the
    share is a decayed average of what drafting rounds spent drafting (`cost_s`: proposals, sizing,
    learning) over their whole time (`round_s`). Where drafting is cheap next to the model's pass (one
    row of a slow model) every round drafts, so no copy the proposer would find is missed; rounds
    observed without timings skip as far as the streak allows. A round that verifies a tree ends the
    streak; `wake()` (a newcomer joined) makes the next round draft without ending it. Rows with a
    fixed budget or a prediction always draft."""

    __slots__ = ("max_skip", "max_share", "memory", "streak", "skip", "share", "since_verified")

    def __init__(self, max_skip: int = 3, max_share: float | None = None, memory: int = 16):
        self.max_skip = int(max_skip)
        self.max_share = float(CADENCE_MAX_SHARE if max_share is None else max_share)
        self.memory = int(memory)
        self.streak = 0
        self.skip = 0
        self.since_verified = self.memory  # rounds since a tree was last verified (none yet: long ago)
        self.share: float | None = None  # drafting's share of a drafting round, decayed

    def drafts(self) -> bool:
        """Whether this round drafts; a round that does not uses up one skipped round."""
        self.since_verified += 1
        if self.skip > 0:
            self.skip -= 1
            return False
        return True

    def observe(self, verified: bool, cost_s: float | None = None, round_s: float | None = None) -> None:
        """After a drafting round: whether any automatic row verified a tree; what drafting cost in
        it and the round's whole time, in seconds."""
        if cost_s is not None and round_s is not None and round_s > 0:
            # beyond (max_skip + 1) x max_share the skips are capped anyway: a one-off spike (a first
            # call, a stall) weighs no more than that
            x = min(max(cost_s / round_s, 0.0), (self.max_skip + 1) * self.max_share)
            self.share = x if self.share is None else 0.75 * self.share + 0.25 * x
        if verified:
            self.streak = self.skip = self.since_verified = 0
        else:
            self.streak += 1
            recent = self.since_verified < self.memory
            self.skip = 0 if recent else min(self.streak, self.max_skip, self.needed())

    def needed(self) -> int:
        """The fewest skips after each drafting round that keep drafting within `max_share` (drafting
        one round in k costs share / k); `max_skip` before any timed round."""
        if self.share is None:
            return self.max_skip
        return max(0, math.ceil(self.share / self.max_share - 1e-9) - 1)

    def wake(self) -> None:
        self.skip = 0


class BudgetPolicy:
    """The automatic budget's state and decisions (one per generator, shared by its engines).

    `max_budget`: most draft nodes a request proposes. `min_gain`: a round speculates only when its
    predicted committed tokens per second beat plain decoding by this factor. `batch_margin`: per row
    beyond the first, how much more a tree's extra pass time weighs (`_risk`: a wrong guess costs
    every row that time; the margin scales with what the tree adds, so a nearly free tree on a flat
    curve needs nearly no gain). `learn_cost`: correct the cost curve online and explore sizes it
    has not shown (`_explore`); False keeps the curve as given. `prefill_margin`: drafts ride
    along a prompt's first pass only when their predicted tokens exceed this many times the decode
    steps their extra pass time would buy, and only while they make that pass at most `prefill_slack`
    dearer (a prompt's pass is every newcomer's time to first token). `cost_model`: measured on first
    use when None."""

    def __init__(self, *, max_budget: int = DEFAULT_MAX_BUDGET, cost_model: CostModel | None = None,
                 min_gain: float = 1.0, batch_margin: float = 0.06, prefill_margin: float = 2.0,
                 prefill_slack: float = 0.1, calibration: RankCalibration | None = None,
                 learn_cost: bool = True):
        self.max_budget = int(max_budget)
        self.learn_cost = bool(learn_cost)
        self.min_gain = float(min_gain)
        self.batch_margin = float(batch_margin)
        self.prefill_margin = float(prefill_margin)
        self.prefill_slack = float(prefill_slack)
        self.cost_model = cost_model
        self.calibration = RankCalibration() if calibration is None else calibration
        self.lengths = OutputLengths()
        self._allowance = 0.0  # seconds of predicted loss exploring may still spend (`_explore`)
        self.explored = 0  # rounds that explored a size
        self.explore_earned = self.explore_spent = 0.0  # seconds of allowance accrued, of predicted loss spent

    def ensure_cost_model(self, model) -> CostModel:
        if self.cost_model is None:
            self.cost_model = CostModel.cached(model)
        return self.cost_model

    def size_round(self, batch: RoundBatch) -> list[DraftTree]:
        """Choose one draft size k for the round; each automatic row (`batch.auto`) keeps its best k
        nodes, the others keep their trees. Returns the round's trees, one per row.

        The pass is left-padded to a common width (`batch.width` pending tokens + k nodes per row), so
        one k for all rows costs the same as per-row sizes whose largest is k. A decode round (width 1)
        maximises expected committed tokens per second, each row's tokens counted with its `weights`
        entry. Scores are calibrated by rank (`RankCalibration`) and scaled by the row's `factors`
        entry (how the request's own drafts fared so far). A prefill round (width > 1, dominated by
        the prompts) takes k nodes only when their expected tokens beat
        `prefill_margin` times what their extra pass time buys in plain decode rounds, and only up to
        `prefill_slack` of the pass's cost: that time delays every row's first token (TTFT), so it
        counts more than time spent later. A row's `continuing` entry ([d]: the chance its output runs
        past a node d deep, `OutputLengths.continuing`) discounts its deep nodes, so an answer likely
        to end soon does not draft wider than it can repay."""
        # rows with a fixed budget keep their trees; the round is sized for all rows alike
        trees = [t if a else DraftTree.empty() for t, a in zip(batch.trees, batch.auto)]
        b = len(trees)
        kmax = max((len(t) for t in trees), default=0)
        if kmax == 0:
            return list(batch.trees)
        width, w = batch.width, batch.weights
        offsets = np.zeros(b + 1, np.int64)
        np.cumsum([len(t) for t in trees], out=offsets[1:])
        scores = np.concatenate([t.scores for t in trees])
        depths = np.concatenate([t.depths for t in trees])
        gains = sizing.round_gains(scores, depths, offsets, batch.factors, w, batch.continuing, np.ones(b, np.bool_),
                               np.ascontiguousarray(self.calibration.factors(kmax), np.float64), kmax)
        cost = self.cost_model(b * (np.arange(kmax + 1) + width), batch=b)
        if width > 1:
            plain_rate = float(w.sum()) / float(self.cost_model(b, batch=b))
            value = gains - self.prefill_margin * plain_rate * (cost - cost[0])
            value[cost > (1.0 + self.prefill_slack) * cost[0]] = -np.inf
            k = int(np.argmax(value))
            if value[k] <= 0:
                k = 0
        else:
            k = self._decode_size(gains, cost, float(w.sum()), b, width)
        return [(prune_tree(t, k, int(lim) - 1) if len(t) > k else t) if a else kept
                for t, lim, a, kept in zip(trees, batch.limits, batch.auto, batch.trees)]

    def _risk(self, cost: np.ndarray, b: int) -> np.ndarray:
        """The pass costs the decision weighs: a tree's extra time over the plain step counts
        (1 + RISK_PER_ROW x batch_margin x (rows - 1)) times, since a wrong guess costs every row
        of the batch its share of the padded pass. The margin scales with what the tree adds to
        the pass, never with the pass itself: where a tree is nearly free (a flat curve), nearly any
        predicted gain pays for it."""
        return cost + (cost - cost[0]) * (RISK_PER_ROW * self.batch_margin * (b - 1))

    def _decode_size(self, gains: np.ndarray, cost: np.ndarray, weight: float, b: int, width: int) -> int:
        """The draft size of a decode round: the most expected committed tokens per risk-weighted
        second (`_risk`), 0 unless that beats plain decoding by `min_gain`; then, within the
        exploring allowance, a size the curve has not shown for this batch size yet (`_explore`)."""
        rate = (weight + gains) / self._risk(cost, b)
        k = int(np.argmax(rate))
        if rate[k] < self.min_gain * rate[0]:
            k = 0  # a predicted gain within the model's error is not worth the risk of a loss
        if self.learn_cost:
            k = self._explore(k, rate, gains, cost, weight, b, width)
        return k

    def _explore(self, k: int, rate: np.ndarray, gains: np.ndarray, cost: np.ndarray, weight: float, b: int,
                 width: int) -> int:
        """Bounded exploration of the cost curve. Sizes no pass of this batch size has shown keep the
        one-row curve's guess, and a guess too dear would never be tried, so never corrected. Each
        decode round adds `EXPLORE_SHARE` of its predicted cost to an allowance (at most
        `EXPLORE_CAP` one-token steps); a round whose best size under the optimistic curve
        (`CostModel.optimistic`) differs from `k` takes the nearest such size when the predicted loss (its extra time over
        what its tokens are worth at `k`'s rate) fits the allowance, and spends it. So exploring
        costs at most `EXPLORE_SHARE` of the predicted time, and nothing once every size is seen."""
        self.explore_earned += EXPLORE_SHARE * float(cost[k])
        self._allowance = min(self._allowance + EXPLORE_SHARE * float(cost[k]), EXPLORE_CAP * float(cost[0]))
        tokens = b * (np.arange(len(cost)) + width)
        opt = self.cost_model.optimistic(tokens, batch=b)
        rate_o = (weight + gains) / self._risk(opt, b)
        # the nearest untried size that would beat k if it cost what the optimistic curve says: a
        # step at a time, so each exploring pass is cheap and the next one sees what it taught
        better = np.flatnonzero((rate_o > rate[k]) & ~self.cost_model.tried(tokens, b)
                                & (rate_o >= self.min_gain * rate_o[0]))
        if not len(better):
            return k
        ke = int(better[np.argmin(np.abs(better - k))])
        loss = float(cost[ke]) * max(0.0, 1.0 - float(rate[ke] / rate[k]))
        if loss > self._allowance:
            return k
        self._allowance -= loss
        self.explore_spent += loss
        self.explored += 1
        return ke

    def prefill_may_draft(self, rows: int, width: int) -> bool:
        """Whether a prefill of `rows` rows `width` tokens wide could carry a tree within `prefill_slack`
        (`size_round` never takes more; the cost curve never falls, so one node decides). True while
        there is no cost model."""
        if self.cost_model is None:
            return True
        cost = self.cost_model([rows * width, rows * (width + 1)], batch=rows)
        return bool(cost[1] <= (1.0 + self.prefill_slack) * cost[0])

    def observe_pass(self, rows: int, tokens: int, seconds: float) -> None:
        """A decode pass of `rows` rows feeding `tokens` (padding included) took `seconds` (ignored
        without `learn_cost`: a pinned curve stays as given)."""
        if self.cost_model is not None and self.learn_cost:
            self.cost_model.observe(tokens, seconds, batch=rows)

    def learn(self, trees: list[DraftTree], accepted_nodes) -> None:
        """The round's verified trees and their accepted nodes (rank calibration across requests)."""
        if any(len(tr) and float(tr.scores.sum()) > 0 for tr in trees):
            self.calibration.observe(trees, accepted_nodes)
