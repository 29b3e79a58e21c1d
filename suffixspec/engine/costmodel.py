"""The automatic budget's cost model: seconds per forward pass by the tokens it feeds.

`CostModel` is measured once per model and machine (`measure`, `cached`) or given as a pinned
curve (`from_relative`: tree size -> cost relative to a one-token step, the object `relative()`
returns and `--cost-curve FILE` reads; `check_relative_curve` validates it), interpolated between
measured sizes and extended past the largest along its last segment, and corrected online per batch
size (`observe`). `optimistic` is the curve that exploring assumes for sizes a batch size has not
shown yet.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time

import numpy as np

from ..draft.tree import DraftTree
from ..errors import BadInputError
from ..fileio import atomic_write_json, cache_dir

__all__ = ["CostModel", "check_relative_curve"]

log = logging.getLogger(__name__)


class CostModel:
    """Seconds per forward pass as a function of the new tokens it feeds (all rows together, padding
    included), interpolated linearly between measured sizes and extended along the last measured
    segment beyond them (`_beyond`).

    The measured curve is corrected online per batch size (`observe`), so passes of one batch size
    (longer contexts, more rows) never distort the relative costs another batch size decides on.
    Within a batch size the correction is a speed factor common to every size, which every observed
    pass moves, times a shape factor per observed size, which moves `SHAPE_RATE` times slower and
    keeps a geometric mean of 1 over the observed sizes: the machine's speed shows at once in every
    size, including sizes seldom or never observed, and only a lasting difference in shape stays per size.
    A pass between two measured sizes corrects the one nearer (in log) by the factor that would have
    priced it right, the other held: its error over that size's share of the interpolated cost (else
    a size priced too dear by a few noisy passes stays so through passes beside it, and the monotone
    curve lifts every larger size with it).
    Beyond one row the one-row curve only guesses the shape: b rows' one-token step (b tokens) skips
    the mask a b-token pass of one row builds, so it costs the curve at b times `step_ratio` (the
    one-row step over the one-row 2-token pass), and each tree size's first passes correct its shape
    at once (`GUESS_PASSES`). Observed passes are whole verification steps (the pass, the
    acceptance and the cache commit), so a tree's bookkeeping counts against it."""

    SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
    SHAPE_RATE = 0.2
    GUESS_PASSES = 2
    GUESS_CLIP = 8.0
    NOISE_RATE = 0.05  # of an observed pass's squared log surprise in the batch's noise estimate
    SHAPE_TOLERANCE = 0.05  # log cost error a size's mean of passes may keep before it counts as known
    MAX_KNOWN_PASSES = 16  # the most passes `known` asks of a size, however noisy the machine

    def __init__(self, sizes, seconds):
        order = np.argsort(sizes)
        self.sizes = np.asarray(sizes, np.float64)[order]
        self._measured = np.asarray(seconds, np.float64)[order]
        self._size_list = self.sizes.tolist()
        self._measured_list = self._measured.tolist()
        self._log_sizes = np.log(self.sizes).tolist()
        self._speed: dict[int, float] = {}  # batch size -> factor on every size's measured cost
        self._factors: dict[int, list[float]] = {}  # batch size -> shape factor per size (1 if unobserved)
        self._seen: dict[int, list[int]] = {}  # batch size -> passes observed per size
        self._noise: dict[int, float] = {}  # batch size -> decayed mean squared log(observed / expected)
        self._curves: dict[int, np.ndarray] = {}
        self.unscaled = False  # a pinned curve in steps until the first observed pass (`from_relative`)
        self.seconds = self._curve(1)
        # the part of a one-row pass of 2 tokens that a one-token step (no mask, no tree) skips
        self.step_ratio = float(min(1.0, self.seconds[0] / np.interp(2.0, self.sizes, self.seconds))) \
            if self.sizes[0] == 1 and len(self.sizes) > 1 else 1.0

    def _raw(self, batch: int) -> np.ndarray:
        """The corrected curve of `batch` rows before it is made monotone."""
        factors = self._factors.get(batch)
        return self._measured if factors is None else self._measured * (self._speed[batch] * np.asarray(factors))

    def _curve(self, batch: int) -> np.ndarray:
        curve = self._curves.get(batch)
        if curve is None:
            # never cheaper when bigger, from the largest size a pass of `batch` rows can take (at
            # least one token a row): smaller sizes, never fed, must not lift the rest
            curve = self._raw(batch).copy()
            lo = max(0, int(np.searchsorted(self.sizes, batch, side="right")) - 1)
            curve[lo:] = np.maximum.accumulate(curve[lo:])
            self._curves[batch] = curve
        return curve

    def observe(self, tokens: int, seconds: float, weight: float = 0.1, batch: int = 1) -> None:
        """A pass of `batch` rows feeding `tokens` took `seconds`: the batch's speed moves by at most
        `weight` toward it, the nearest measured size's shape by `weight * SHAPE_RATE` toward what is
        left, so the curve follows the machine as it is now (load, threads). Sizes observed alike
        converge to what they cost, the others to their measured cost times the batch's speed."""
        batch = int(batch)
        if not (tokens > 0 and seconds > 0):
            return
        if self.unscaled:
            self._set_scale(tokens, seconds, batch)
        log_t = math.log(max(tokens, 1))
        i = min(range(len(self._log_sizes)), key=lambda k: abs(self._log_sizes[k] - log_t))
        factors = self._factors.setdefault(batch, [1.0] * len(self._size_list))
        seen = self._seen.setdefault(batch, [0] * len(self._size_list))
        speed = self._speed.setdefault(batch, 1.0)
        # against the curve before it is made monotone: a pass cheaper than a smaller one is matched by
        # its own shape factor instead of driving it (and through the mean, the speed) down without end
        sizes, measured = self._size_list, self._measured_list
        t = float(tokens)
        j = next((k for k, size in enumerate(sizes) if size >= t), len(sizes))  # plain floats: every round
        if j == len(sizes):  # along the last segment, as `_beyond`
            a, b = measured[-2] * speed * factors[-2], measured[-1] * speed * factors[-1]
            slope = (b - a) / (sizes[-1] - sizes[-2])
            expected = b + max(0.0, slope) * (t - sizes[-1])
            part = b * (1.0 + (t - sizes[-1]) / (sizes[-1] - sizes[-2])) if slope > 0 else b
        elif j == 0 or sizes[j] == t:
            expected = part = measured[j] * speed * factors[j]
        else:
            a, b = measured[j - 1] * speed * factors[j - 1], measured[j] * speed * factors[j]
            lam = (t - sizes[j - 1]) / (sizes[j] - sizes[j - 1])
            expected = a + (b - a) * lam
            part = lam * b if i == j else (1.0 - lam) * a
        # how much of `expected` moves with size i's factor (1 at a measured size, less between two):
        # a pass between two sizes shows the nearest one's cost only through its share
        share = max(part / expected, 0.05)
        if batch > 1 and tokens == batch:  # the one-token step (see the class docstring)
            expected *= self.step_ratio
        if tokens == batch or seen[i] >= self.GUESS_PASSES:  # a guess's error is not the machine's noise
            # a stall is one sample, not noise: it counts as a pass 1.5x off, no more
            surprise = min(abs(math.log(seconds / expected)), math.log(1.5)) ** 2
            self._noise[batch] = (1.0 - self.NOISE_RATE) * self._noise.get(batch, surprise) + self.NOISE_RATE * surprise
        # one pass moves the curve by at most `weight`: a load spike is one sample, not a new machine
        step = (1.0 - weight) + weight * min(max(seconds / expected, 0.5), 2.0)
        speed *= step
        rate = weight * self.SHAPE_RATE
        if batch > 1 and tokens != batch:
            # beyond one row the measured curve (one row feeding as many tokens) only guesses the
            # shape of tree passes, which pay for a mask and a tree per row: the first GUESS_PASSES
            # passes of each size replace the guess (below), the next ones move it as a running mean in
            # which the guess counts as GUESS_PASSES passes, later ones as slowly as at one row. The
            # one-token step, seen every plain round, moves the batch's speed as before
            rate = max(rate, 1.0 / (seen[i] + 1 + self.GUESS_PASSES))
        # while a size is still a guess (its first GUESS_PASSES passes), its passes replace the guess
        # (a running mean of what they showed) and may move it further than a load spike could: a
        # guess can be off by more, and a size priced out by its guess is tried only by exploring
        guessing = batch > 1 and tokens != batch and seen[i] < self.GUESS_PASSES
        if guessing:
            rate = 1.0 / (seen[i] + 1)
        clip = self.GUESS_CLIP if guessing else 2.0
        # the factor that would have priced this pass right, the other size's factor held (the running
        # mean's sample): a pass priced `share` by size i and off by r - 1 shows size i off by (r - 1) / share
        implied = 1.0 + (seconds / (expected * step) - 1.0) / share
        factors[i] *= (1.0 - rate) + rate * min(max(implied, 1.0 / clip), clip)
        seen[i] += 1
        # the observed shape factors' geometric mean goes into the speed: an observation of one size
        # leaves the other observed sizes' costs as they are
        mean = math.exp(sum(math.log(f) for f, o in zip(factors, seen) if o) / sum(1 for o in seen if o))
        self._speed[batch] = speed * mean
        for k, o in enumerate(seen):
            if o:
                factors[k] /= mean
        self._curves.pop(batch, None)
        if batch == 1:
            self.seconds = self._curve(1)

    def __call__(self, tokens, batch: int = 1) -> np.ndarray:
        batch = int(batch)
        curve = self._curve(batch)
        tokens = np.asarray(tokens, np.float64)
        inside = np.interp(tokens, self.sizes, curve)
        cost = np.where(tokens > self.sizes[-1], self._beyond(curve, tokens), inside)
        if batch > 1:  # a pass of one token per row is the one-token step: no mask, no tree
            cost = np.where(tokens == batch, cost * self.step_ratio, cost)
        return cost

    def _beyond(self, curve: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Past the largest measured size: along the last measured segment's slope. (Extrapolating in
        proportion to the tokens would make a flat curve steep there: on a GPU a pass of four rows
        of 64 nodes would look twice as dear as one of 128 tokens.)"""
        if len(self.sizes) < 2:
            return curve[-1] * tokens / self.sizes[-1]
        slope = max(0.0, (curve[-1] - curve[-2]) / (self.sizes[-1] - self.sizes[-2]))
        return curve[-1] + slope * (tokens - self.sizes[-1])

    def known(self, batch: int) -> int:
        """How many passes of a size make its cost known at `batch` rows: GUESS_PASSES at one row
        (its passes correct the measured curve, never replace it) and on a quiet machine; beyond
        one row on a noisy one, enough that their mean is within about SHAPE_TOLERANCE (the
        batch's noise variance over the tolerance's square), at most MAX_KNOWN_PASSES: there a
        size's first passes replace the guess, two noisy passes can price it out, and a size priced
        out is seen again only by exploring."""
        if batch == 1:  # one row's passes correct the measured curve slowly, never replace it
            return self.GUESS_PASSES
        var = self._noise.get(int(batch), 0.0)
        return int(min(self.MAX_KNOWN_PASSES, max(self.GUESS_PASSES, math.ceil(var / self.SHAPE_TOLERANCE ** 2))))

    def optimistic(self, tokens, batch: int = 1) -> np.ndarray:
        """`self(tokens, batch)` with every size that passes of `batch` rows have not shown
        `known(batch)` times costed as the largest such size below it (the cheapest curve that stays monotone): what exploring
        assumes those sizes might cost. Equal to `self(...)` once every size is observed."""
        batch = int(batch)
        seen = self._seen.get(batch)
        cost = self(tokens, batch)
        need = self.known(batch)
        if not seen or min(seen) >= need:
            return cost
        curve = self._curve(batch)
        tokens = np.asarray(tokens, np.float64)
        # the cheapest a pass could cost: what the batch's one-token step costs, or a tried size below it
        floor = np.where(tokens >= batch, float(self(batch, batch)), -np.inf)
        for size, c, o in zip(self._size_list, curve.tolist(), seen):
            if o >= need and size > batch:  # at `batch` tokens: the step, costed above
                floor = np.where(tokens >= size, np.maximum(c, floor), floor)
        # a size is untried while the nearest measured size (in log) has had fewer than `need` passes
        unseen = np.asarray(seen)[self.nearest(tokens)] < need
        return np.where(unseen & np.isfinite(floor), np.minimum(cost, floor), cost)

    def nearest(self, tokens) -> np.ndarray:
        """The index of the measured size nearest (in log) to each entry of `tokens`: the size whose
        shape factor a pass of that many tokens corrects."""
        log_t = np.log(np.maximum(np.asarray(tokens, np.float64), 1.0))
        return np.abs(log_t[..., None] - np.asarray(self._log_sizes)).argmin(-1)

    def tried(self, tokens, batch: int) -> np.ndarray:
        """Whether passes of `batch` rows feeding each entry of `tokens` have been seen `known(batch)` times."""
        seen = self._seen.get(int(batch))
        if seen is None:
            return np.zeros(np.shape(tokens), bool)
        return np.asarray(seen)[self.nearest(tokens)] >= self.known(batch)

    def relative(self) -> dict[int, float]:
        """The one-row curve as a pinned-curve object (`from_relative`): tree size -> relative cost."""
        return {int(s): float(c / self.seconds[0]) for s, c in zip(self.sizes, self.seconds)}

    @classmethod
    def from_relative(cls, curve: dict, step_s: float | None = None) -> CostModel:
        """A pinned curve from `relative()`'s object (tree size -> cost relative to a one-token step;
        keys may be strings, as JSON has them), in seconds for a one-token step of `step_s`. Without
        `step_s` the curve is in steps until the first observed pass (`observe`) sets its scale, all
        sizes at once, so the curve's shape stays as given."""
        sizes, costs = check_relative_curve(curve)
        model = cls(sizes, [c * float(step_s or 1.0) for c in costs])
        model.unscaled = step_s is None
        return model

    def _set_scale(self, tokens: int, seconds: float, batch: int) -> None:
        """The first observed pass of an unscaled pinned curve scales every size alike."""
        self.unscaled = False
        expected = float(self(tokens, batch))
        if expected > 0:
            self._measured = self._measured * (seconds / expected)
            self._measured_list = self._measured.tolist()
            self._curves.clear()
            self.seconds = self._curve(1)

    def to_dict(self):
        return {"sizes": self.sizes.tolist(), "seconds": self.seconds.tolist()}

    @classmethod
    def measure(cls, model, sizes=SIZES, past: int = 256, repeats: int = 7) -> CostModel:
        """Time passes of `sizes` new tokens (a linear draft) after a `past`-token prefix (each pass
        keeps its first token, so the context grows by two tokens per size and repeat)."""
        import torch

        from ..verify.kv import KVState

        vocab = int(model.get_input_embeddings().weight.shape[0])
        rng = np.random.default_rng(0)
        state = KVState(model, 1)
        state.forward([rng.integers(0, vocab, past).tolist()], [DraftTree.empty()])
        state.commit([[]])
        cuda = state.device.type == "cuda"
        trees = {1: DraftTree.empty()}  # the one-token step every size is paired with
        for size in sizes:
            if size > 1:
                trees[size] = DraftTree(rng.integers(0, vocab, size - 1), np.arange(size - 1) - 1)

        def timed(size: int) -> float:
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            state.forward([[int(rng.integers(0, vocab))]], [trees[size]])
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t
            state.commit([[]])
            return seconds

        # Each size is timed right after a one-token step and kept as the ratio of the pair, the
        # curve being the median one-token step times the median ratio per size. The machine's speed
        # drifts by tens of percent within seconds on a shared host, and a curve of absolute medians
        # taken through such a drift misjudges what a multi-token pass costs against a step; adjacent
        # pairs see the same machine. Sizes are interleaved round by round, so a load spike hits one
        # sample of one size; the first round warms up.
        steps: list[float] = []
        ratios: dict[int, list[float]] = {size: [] for size in sizes}
        for rep in range(repeats + 1):
            for size in sizes:
                step = timed(1)
                pass_s = timed(size)
                if rep:
                    steps.append(step)
                    ratios[size].append(pass_s / step if size > 1 else 1.0)
        step = float(np.median(steps))
        seconds = [step * float(np.median(ratios[size])) for size in sizes]
        return cls(list(sizes), seconds)

    @classmethod
    def cached(cls, model) -> CostModel:
        """`measure` once per (model, dtype, device, threads); kept in the user cache directory."""
        import torch

        params = sum(p.numel() for p in model.parameters())
        dev = next(model.parameters()).device
        ident = json.dumps([
            "cost-v6",  # bump when `measure` or the model layers change: older curves are then re-measured
            getattr(model.config, "_name_or_path", ""), type(model).__name__, params,
            sorted({type(m).__name__ for m in model.modules()}),  # prepacked or dense layers
            sorted({str(getattr(m, "layout", "")) for m in model.modules()}), torch.__version__,  # their layout
            str(next(model.parameters()).dtype), str(dev),
            torch.cuda.get_device_name(dev) if dev.type == "cuda" else os.cpu_count(), torch.get_num_threads(),
            getattr(model.config, "_attn_implementation", None),
        ])
        path = cache_dir() / "cost" / (hashlib.sha256(ident.encode()).hexdigest()[:16] + ".json")
        try:
            data = json.loads(path.read_text())
            return cls(data["sizes"], data["seconds"])
        except (OSError, ValueError, KeyError):
            pass
        model_cost = cls.measure(model)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, {**model_cost.to_dict(), "identity": ident}, durable=False)
        except OSError as exc:
            log.warning("could not cache the cost curve in %s: %s", path, exc)
        return model_cost


def check_relative_curve(curve, name: str = "cost_curve") -> tuple[list[int], list[float]]:
    """(sizes ascending, relative costs) of a pinned-curve object: a mapping of at least two positive
    integer tree sizes (ints or their strings), one of them 1, to positive finite costs that never
    fall as the size grows. Raises `BadInputError` naming `name`."""
    if not isinstance(curve, dict) or len(curve) < 2:
        raise BadInputError(f"{name}: expected an object of at least two tree sizes -> relative cost "
                            f'(e.g. {{"1": 1.0, "2": 1.06}}), got {_brief(curve)}', param=name)
    pairs = []
    for key, value in curve.items():
        try:
            size = int(key) if isinstance(key, (int, np.integer)) or (isinstance(key, str) and key.isdigit()) else None
        except ValueError:
            size = None
        if size is None or size < 1 or isinstance(key, bool):
            raise BadInputError(f"{name}: expected tree sizes as positive integers, got {key!r}", param=name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise BadInputError(f"{name}: expected a positive number as the cost of size {size}, got {value!r}",
                                param=name)
        pairs.append((size, float(value)))
    pairs.sort()
    sizes = [p[0] for p in pairs]
    if len(set(sizes)) != len(sizes):
        raise BadInputError(f"{name}: tree size {sizes[[a == b for a, b in zip(sizes, sizes[1:])].index(True)]} "
                            "is given twice", param=name)
    if sizes[0] != 1:
        raise BadInputError(f"{name}: expected the cost of tree size 1 (a one-token step), got sizes from "
                            f"{sizes[0]}", param=name)
    costs = [p[1] for p in pairs]
    for (a, ca), (b, cb) in zip(pairs, pairs[1:]):
        if cb < ca:
            raise BadInputError(f"{name}: expected costs that never fall as the size grows, got {ca:g} at {a} "
                                f"and {cb:g} at {b}", param=name)
    return sizes, costs


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
