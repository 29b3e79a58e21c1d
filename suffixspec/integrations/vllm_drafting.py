"""From a batch of draft trees to one linear draft per row, sized by expected accepted tokens per
unit of the step's cost (vLLM verifies linear drafts only).

Terms: a row's tree has nodes whose `score` is the expected number of accepted tokens it adds (the
chance it is reached and accepted, so scores do not grow along a path). `path_values` gives, per
row and draft length L, the best root path of exactly L nodes (`values[r, L]`, the sum of its
scores; -inf where the row has no draftable path that long) and its last node. `plan_lengths`
picks one length per row maximising the step's expected tokens per unit of its cost,

    (rows + sum_r values[r, L_r]) / cost(rows + sum_r L_r)

(every drafting row yields its bonus token whatever its draft): exactly, by a group knapsack over
the step's total draft tokens T (the best sum of values per T), then the best T; ties go to fewer
tokens. So a row's draft may follow a different path than the longest one (a strong short branch
beats a long weak one when tokens cost), and it is empty when no draft pays.

The step's cost is measured (`MeasuredStepCost`: suffixspec's `CostModel`, corrected online per
batch size from the time between the adapter's calls and the tokens each step verified, starting
from a conservative prior) unless the `step_cost` option fixes it (`StepCost`).
"""

from __future__ import annotations

import numba
import numpy as np

from .. import BadInputError
from ..budget import CostModel

# The prior before any step is measured: a step verifying t tokens costs 1 + 0.03 (t - 1) one-token
# steps (conservative: an engine where a wider step costs more, like a CPU engine; a memory-bound
# accelerator's flat curve is learned from its steps). Its scale is irrelevant: drafts are sized by
# costs relative to one another within a batch size.
PRIOR_SLOPE = 0.03
PRIOR_STEP_SECONDS = 0.02


class StepCost:
    """A fixed relative cost of a target step as a piecewise-linear function of the tokens it verifies,
    extrapolated with the last segment's slope (a single point: cost proportional to tokens). The
    same for every batch size (the `step_cost` option)."""

    def __init__(self, points):
        try:
            pts = sorted((float(t), float(c)) for t, c in points)
        except (TypeError, ValueError):
            raise BadInputError(f"step_cost: expected [[tokens, cost], ...] pairs of numbers, got {points!r}", param="step_cost") from None
        if not pts or any(t <= 0 or c <= 0 for t, c in pts) or len({t for t, _ in pts}) != len(pts):
            raise BadInputError(f"step_cost: expected pairs of positive tokens (distinct) and positive cost, got {points!r}", param="step_cost")
        if any(b[1] < a[1] for a, b in zip(pts, pts[1:])):
            raise BadInputError(f"step_cost: cost must not fall as tokens grow, got {points!r}", param="step_cost")
        if len(pts) == 1:
            pts.append((2 * pts[0][0], 2 * pts[0][1]))
        self.tokens = np.array([t for t, _ in pts])
        self.costs = np.array([c for _, c in pts])
        self._slope = (self.costs[-1] - self.costs[-2]) / (self.tokens[-1] - self.tokens[-2])

    def __call__(self, tokens, batch: int = 1) -> np.ndarray:
        t = np.asarray(tokens, np.float64)
        inside = np.interp(t, self.tokens, self.costs)
        beyond = self.costs[-1] + self._slope * (t - self.tokens[-1])
        below = self.costs[0] * t / self.tokens[0]
        return np.where(t > self.tokens[-1], beyond, np.where(t < self.tokens[0], below, inside))

    def observe(self, tokens: int, seconds: float, batch: int) -> None:
        """A fixed cost learns nothing."""

    def to_dict(self) -> dict:
        return {"fixed": [[float(t), float(c)] for t, c in zip(self.tokens, self.costs)]}


class MeasuredStepCost:
    """The step's cost learned online: a `CostModel` (seconds per step by tokens verified, corrected
    per batch size) started from the conservative prior above. `observe` takes one measured step."""

    def __init__(self, weight: float = 0.1):
        sizes = np.array(CostModel.SIZES, np.float64)
        self.model = CostModel(sizes, PRIOR_STEP_SECONDS * (1.0 + PRIOR_SLOPE * (sizes - 1.0)))
        self.weight = weight
        self.observed = 0

    def __call__(self, tokens, batch: int = 1) -> np.ndarray:
        return self.model(tokens, batch=max(int(batch), 1))

    def observe(self, tokens: int, seconds: float, batch: int) -> None:
        if tokens >= batch >= 1 and seconds > 0:
            self.model.observe(int(tokens), float(seconds), weight=self.weight, batch=int(batch))
            self.observed += 1

    def to_dict(self) -> dict:
        """Measured steps, and per batch size seen the learned cost of a step verifying t tokens
        relative to one verifying one token a row (t in `CostModel.SIZES`, at least the batch)."""
        curves = {}
        for batch in sorted(self.model._speed):
            sizes = [s for s in CostModel.SIZES if s >= batch] or [batch]
            costs = np.asarray(self.model(np.array(sizes, np.float64), batch=batch), np.float64)
            base = float(np.asarray(self.model(float(batch), batch=batch)))
            curves[str(batch)] = {str(s): round(float(c) / base, 3) for s, c in zip(sizes, costs)}
        return {"measured_steps": self.observed, "relative_by_batch": curves, **self.model.to_dict()}


def step_cost_from(points) -> StepCost | MeasuredStepCost:
    """The `step_cost` option's cost, or the measured one when it is not given."""
    return MeasuredStepCost() if points is None else StepCost(points)


@numba.njit(cache=True, nogil=True)
def path_values(tokens, parents, depths, scores, starts, counts, limits, vocab, values, nodes):
    """Row r's tree is nodes [starts[r], starts[r] + counts[r]) of the flat arrays (parents before
    children). For L in 1..limits[r], values[r, L] is the largest sum of scores over root paths of
    exactly L draftable nodes (a token in [0, vocab); a node below an undraftable one is not
    draftable) and nodes[r, L] the path's last node (the first in index order on ties); -inf / -1
    where there is none. values[r, 0] = 0; values[r, L > limits[r]] = -inf."""
    cum = np.empty(0, np.float64)
    for r in range(starts.shape[0]):
        a, n, limit = starts[r], counts[r], limits[r]
        values[r, 0] = 0.0
        nodes[r, 0] = -1
        for L in range(1, values.shape[1]):
            values[r, L] = -np.inf
            nodes[r, L] = -1
        if cum.shape[0] < n:
            cum = np.empty(max(n, 2 * cum.shape[0]), np.float64)
        for i in range(n):
            p = parents[a + i]
            base = 0.0 if p < 0 else cum[p]
            t = tokens[a + i]
            d = depths[a + i]
            if base < 0.0 or t < 0 or t >= vocab or d > limit or d >= values.shape[1]:
                cum[i] = -1.0  # not draftable, nor anything below it
                continue
            cum[i] = base + scores[a + i]
            if cum[i] > values[r, d]:
                values[r, d] = cum[i]
                nodes[r, d] = i


@numba.njit(cache=True, nogil=True)
def best_sums(values, max_total):
    """Group knapsack: sums[T] = the largest sum over rows of values[r, L_r] with sum_r L_r = T
    (-inf where no choice reaches T), and choice[r, T] = the L_r of row r in the best choice of rows
    0..r totalling T (ties: the smaller L_r)."""
    b, width = values.shape
    sums = np.full(max_total + 1, -np.inf)
    sums[0] = 0.0
    nxt = np.empty(max_total + 1)
    choice = np.zeros((b, max_total + 1), np.int16)
    reach = 0
    for r in range(b):
        nxt[:] = -np.inf
        top = 0
        for L in range(width):
            if values[r, L] > -np.inf:
                top = L
        for T in range(min(reach + top, max_total) + 1):
            for L in range(min(top, T) + 1):
                v = values[r, L]
                base = sums[T - L]
                if v == -np.inf or base == -np.inf:
                    continue
                if v + base > nxt[T]:
                    nxt[T] = v + base
                    choice[r, T] = L
        reach = min(reach + top, max_total)
        sums[:] = nxt
    return sums, choice


def plan_lengths(values: np.ndarray, cost) -> np.ndarray:
    """Draft length per row: the choice maximising (rows + sum of values) / cost(rows + tokens) for
    `values` [rows, k + 1] (`path_values`); `cost(tokens)` is the step's cost of that many tokens."""
    b = values.shape[0]
    lengths = np.zeros(b, np.int64)
    if b == 0:
        return lengths
    avail = np.where(np.isfinite(values), np.arange(values.shape[1])[None, :], 0).max(axis=1)
    max_total = int(avail.sum())
    if max_total == 0:
        return lengths
    sums, choice = best_sums(values, max_total)
    totals = np.arange(max_total + 1)
    value = np.where(np.isfinite(sums), (b + sums) / np.asarray(cost(b + totals), np.float64), -np.inf)
    T = int(np.argmax(value))  # the first maximum: no token that does not pay for itself
    for r in range(b - 1, -1, -1):
        lengths[r] = choice[r, T]
        T -= int(lengths[r])
    return lengths


def write_paths(tokens, parents, starts, nodes, lengths, out_tokens, out_scores=None, scores=None) -> None:
    """Row r's draft: the root path ending at nodes[r, lengths[r]], into out_tokens[r, :lengths[r]]."""
    for r in np.flatnonzero(lengths).tolist():
        node = int(nodes[r, lengths[r]])
        a = int(starts[r])
        for j in range(int(lengths[r]) - 1, -1, -1):
            out_tokens[r, j] = tokens[a + node]
            if out_scores is not None:
                out_scores[r, j] = scores[a + node]
            node = int(parents[a + node])
