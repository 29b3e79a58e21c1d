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

A request's scores are trusted as far as its record bears them out (`trust_factors`): each node's
score is planned as score * f ** depth, f in (0, 1] the factor at which the request's verified drafts
would have promised what the engine accepted of them (a prior of `CALIBRATION_TOKENS` tokens at
f = 1), so a request whose drafts keep failing, an edit whose copies the model departs from, drafts
short, and one whose drafts are accepted keeps its scores.

The step's cost is measured (`MeasuredStepCost`: per batch size, a line in the drafted tokens fitted
online to the time between the adapter's calls and the tokens each step verified, pulled toward a
conservative prior where the steps do not vary enough to show the slope) unless the `step_cost`
option fixes it (`StepCost`).
"""

from __future__ import annotations

import numba
import numpy as np

from .. import BadInputError

# The prior before a batch size's steps are measured: a step of b rows verifying b + x tokens (x of
# them drafts) costs 1 + PRIOR_SLOPE (b - 1 + x) one-token steps (conservative: an engine where a
# wider step costs more, like a CPU engine). Only its shape matters, drafts being sized by costs
# relative to one another within a batch size; measured steps replace it (`MeasuredStepCost`).
PRIOR_SLOPE = 0.03
PRIOR_STEP_SECONDS = 0.02
# `trust_factors`' prior: a request's scores count as borne out by this many accepted tokens
# before its own record (so its first drafts go by the scores and its record takes over as it grows)
CALIBRATION_TOKENS = 8.0


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
    """The step's cost learned online, per batch size b: seconds = a_b + c_b x for a step verifying
    b + x tokens (x drafted), a weighted least-squares line over the measured steps, older steps
    forgotten geometrically (`forget` per step: the line follows load and context growth), with a
    ridge pull of the relative slope c_b / a_b toward the prior's (worth about `prior_steps` steps
    at a full draft of `k` tokens a row): steps that all verify the same number of tokens leave the
    prior's slope, steps that vary measure it. Lines are kept monotone (c >= 0, a > 0); after
    `warm_steps` steps of a batch size, one step moves its fit by at most a factor 2 of its
    prediction (a load spike is one sample). A batch size never measured takes the nearest measured
    one's line. Drafts are sized at the operating point, where a line is what matters: the marginal
    cost of a drafted token against the step's fixed part."""

    def __init__(self, k: int = 8, forget: float = 0.98, prior_steps: float = 0.01, warm_steps: int = 8):
        self.k = max(int(k), 1)
        self.forget = float(forget)
        self.prior_steps = float(prior_steps)
        self.warm_steps = int(warm_steps)
        self._sums: dict[int, np.ndarray] = {}  # batch -> decayed [sum w, w x, w x^2, w y, w x y]
        self._seen: dict[int, int] = {}
        self._lines: dict[int, tuple[float, float]] = {}
        self.observed = 0

    @staticmethod
    def prior_slope(batch: int) -> float:
        return PRIOR_SLOPE / (1.0 + PRIOR_SLOPE * (batch - 1))

    def line(self, batch: int) -> tuple[float, float]:
        """(a, c): a step of `batch` rows with x drafted tokens costs a + c x seconds (for a batch
        size never measured: the nearest measured one's line; none measured: the prior, in units
        of PRIOR_STEP_SECONDS)."""
        batch = max(int(batch), 1)
        if batch not in self._sums:
            if not self._sums:
                a = PRIOR_STEP_SECONDS * (1.0 + PRIOR_SLOPE * (batch - 1))
                return a, a * self.prior_slope(batch)
            batch = min(self._sums, key=lambda b: (abs(b - batch), b))
        line = self._lines.get(batch)
        if line is None:
            line = self._lines[batch] = self._fit(batch)
        return line

    def _fit(self, batch: int) -> tuple[float, float]:
        s0, s1, s2, sy, sxy = self._sums[batch].tolist()
        rho = self.prior_slope(batch)
        xr = float(self.k * batch)
        mu = self.prior_steps * xr * xr
        # minimise sum w (y - a - c x)^2 + mu (c - rho a)^2 over (a, c)
        m11, m12, m22 = s0 + mu * rho * rho, s1 - mu * rho, s2 + mu
        det = m11 * m22 - m12 * m12
        mean = sy / s0
        if det <= 0.0:  # no spread and no prior weight: the mean at the prior's slope
            return mean, mean * rho
        a = (sy * m22 - m12 * sxy) / det
        c = (m11 * sxy - m12 * sy) / det
        floor = 0.02 * mean
        if c < 0.0 or a < floor:  # keep it monotone and positive: refit with the bound held
            if c < 0.0:
                c = 0.0
                a = sy / s0
            if a < floor:
                a = floor
                c = max((sxy - a * s1 + mu * rho * a) / m22, 0.0)
        return a, c

    def __call__(self, tokens, batch: int = 1) -> np.ndarray:
        batch = max(int(batch), 1)
        a, c = self.line(batch)
        return a + c * np.maximum(np.asarray(tokens, np.float64) - batch, 0.0)

    def observe(self, tokens: int, seconds: float, batch: int) -> None:
        """One measured step of `batch` rows that verified `tokens` tokens in `seconds`."""
        if not (tokens >= batch >= 1 and seconds > 0 and np.isfinite(seconds)):
            return
        batch, x, y = int(batch), float(tokens - batch), float(seconds)
        sums = self._sums.get(batch)
        if sums is None:
            sums = self._sums[batch] = np.zeros(5)
            self._seen[batch] = 0
        elif self._seen[batch] >= self.warm_steps:
            a, c = self.line(batch)
            expected = a + c * x
            y = min(max(y, 0.5 * expected), 2.0 * expected)
        sums *= self.forget
        sums += (1.0, x, x * x, y, x * y)
        self._seen[batch] += 1
        self._lines.pop(batch, None)
        self.observed += 1

    def to_dict(self) -> dict:
        """Measured steps; per batch size measured, its line (seconds at no draft, seconds per drafted
        token, steps) and the cost relative to the one-token step at 1, 2, 4 and 8 drafted tokens a row."""
        lines, curves = {}, {}
        for batch in sorted(self._sums):
            a, c = self.line(batch)
            lines[str(batch)] = {"a": round(a, 6), "c": round(c, 7), "steps": self._seen[batch]}
            curves[str(batch)] = {str(batch * (1 + d)): round(1.0 + c * batch * d / a, 3) for d in (1, 2, 4, 8)}
        return {"measured_steps": self.observed, "lines": lines, "relative_by_batch": curves}


def step_cost_from(points, k: int = 8) -> StepCost | MeasuredStepCost:
    """The `step_cost` option's cost, or the measured one when it is not given."""
    return MeasuredStepCost(k) if points is None else StepCost(points)


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


def trust_factors(promised: np.ndarray, accepted: np.ndarray, prior: float | None = None) -> np.ndarray:
    """Per request, how far its drafts' scores are to be trusted: the f in (0, 1] at which its verified
    drafts, each node's score taken as score * f ** depth, would have promised what it accepted, with
    `prior` (default `CALIBRATION_TOKENS`) accepted tokens of depth 1 promised at f = 1 added:

        sum_d promised[r, d - 1] f ** d + prior f = accepted[r] + prior

    `promised` [rows, k]: per depth, the summed scores of the request's verified draft tokens;
    `accepted` [rows]: the tokens of those drafts the engine accepted. A request that accepts what its
    scores promised, or more, keeps f = 1; the conditional chance of each further token is scaled by
    f, so a request whose long drafts fail loses its long drafts first."""
    prior = CALIBRATION_TOKENS if prior is None else float(prior)
    w = np.asarray(promised, np.float64)
    a = np.asarray(accepted, np.float64)
    if w.ndim != 2 or a.shape != (w.shape[0],):
        raise ValueError(f"trust_factors: expected promised [rows, k] and accepted [rows], got {w.shape} and {a.shape}")
    powers = np.arange(1, w.shape[1] + 1, dtype=np.float64)
    out = np.ones(a.shape[0])
    # rows whose record bears their scores out keep f = 1: only the others are searched (every step)
    need = np.flatnonzero(w.sum(axis=1) - a > 0)
    if not need.size:
        return out
    w, a = w[need], a[need]

    def excess(f):  # increasing in f
        return (w * f[:, None] ** powers).sum(axis=1) + prior * f - a - prior

    lo, hi = np.zeros(need.size), np.ones(need.size)
    for _ in range(24):  # to 2 ** -24
        mid = 0.5 * (lo + hi)
        over = excess(mid) > 0
        hi = np.where(over, mid, hi)
        lo = np.where(over, lo, mid)
    out[need] = np.maximum(hi, 1e-6)
    return out


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
