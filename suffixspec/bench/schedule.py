"""Arrival processes and the loop that drives an engine through one run, timing every request.

Contract: `poisson_arrivals(n, rate, seed)` gives seeded Poisson arrival times; `serve_schedule(engine,
prompts, concurrency, arrivals, limits)` (or `schedule_steps`, the same loop as a generator that yields
after every step, so that several engines can take turns) drives any object with the engine interface of
`suffixspec.engine.engine.Engine` (`add(prompt, max_new_tokens=, key=)`, `step() -> Step`, `idle`, `now()`,
events carrying `index`, `time_s`, `finish_reason`) under a closed loop (`arrivals=None`: `concurrency`
clients, each sends its next request when its previous one completes) or the given arrival times, and
returns one `Served` per finished request plus the makespan. Times are the engine's clock plus the
idle gaps skipped while waiting for the next arrival (nothing sleeps). Request q is added with
`key=q`, so sampling draws follow the request, not the order of admission. `TurnClocks` gives engines
that take turns on one machine clocks that each run only during their own engine's turns.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Generator, Iterator, Sequence

import numpy as np

from ..errors import BadInputError

__all__ = ["poisson_arrivals", "Served", "serve_schedule", "schedule_steps", "TurnClocks"]


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> np.ndarray:
    """Arrival times (seconds, increasing, the first one after 0) of `n` requests of a Poisson process
    at `rate` requests per second: cumulative sums of exponential inter-arrival times (mean 1/rate)."""
    if rate <= 0:
        raise BadInputError(f"--qps: expected > 0, got {rate}")
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


@dataclass
class Served:
    """One request as served: times in seconds on the run's clock (0 = start of the run)."""

    index: int
    arrival: float
    start: float  # admitted into the running batch
    ttft: float  # from arrival (queueing included)
    e2e: float  # from arrival (queueing included)
    engine_index: int = -1  # the index `engine.add` returned


def serve_schedule(engine, prompts: list[list[int]], concurrency: int, arrivals: Sequence[float] | None = None,
                   limits: Sequence[int | None] | None = None,
                   on_done: Callable[[int], None] | None = None, split=None) -> tuple[list[Served], float]:
    """`schedule_steps` run to its end: the finished requests and the makespan."""
    steps = schedule_steps(engine, prompts, concurrency, arrivals, limits, on_done, split)
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def schedule_steps(engine, prompts: list[list[int]], concurrency: int, arrivals: Sequence[float] | None = None,
                   limits: Sequence[int | None] | None = None, on_done: Callable[[int], None] | None = None,
                   split=None) -> Generator[int, None, tuple[list[Served], float]]:
    """Drive a continuous-batching `engine` (`add`, `step`, `idle`, `now`; see `suffixspec.engine`)
    through one run and time every request on the run's clock: the engine's clock plus the idle gaps
    skipped while waiting for the next Poisson arrival (nothing sleeps).

    `arrivals=None`: closed loop: `concurrency` clients; request q + concurrency arrives when a client's
    request completes (the first `concurrency` arrive at 0). Otherwise request q arrives at
    `arrivals[q]`. The engine itself bounds the running batch (its `max_batch`) and queues the rest.
    An exception from the engine ends the run; requests not finished by then are left out. `split`
    (a `timesplit.StepSplit`) watches every step.
    Yields after every `engine.step()` (nothing runs between two `next` calls) the number of requests
    added to the engine so far; returns, as the generator's value, the finished requests (in index
    order) and the makespan (first arrival to last completion).
    """
    n = len(prompts)
    if concurrency <= 0:
        raise BadInputError(f"--concurrency: expected > 0, got {concurrency}")
    order = list(range(n)) if arrivals is None else sorted(range(n), key=lambda q: (float(arrivals[q]), q))
    arrival = [0.0] * n
    start: dict[int, float] = {}
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    of_index: dict[int, int] = {}
    offset = -engine.now()  # run clock = engine clock + offset
    nxt = 0

    def submit(at: float) -> None:
        nonlocal nxt
        q = order[nxt]
        nxt += 1
        arrival[q] = at
        limit = limits[q] if limits is not None else None
        of_index[engine.add(prompts[q], max_new_tokens=limit, key=q)] = q

    if arrivals is None:
        while nxt < min(concurrency, n):
            submit(0.0)
    while True:
        now = engine.now() + offset
        while arrivals is not None and nxt < n and float(arrivals[order[nxt]]) <= now:
            submit(float(arrivals[order[nxt]]))
        if engine.idle:
            if arrivals is not None and nxt < n:
                offset += float(arrivals[order[nxt]]) - now  # idle until the next arrival
                continue
            break
        mark = split.before(engine) if split is not None else None
        step = engine.step()
        if split is not None:
            split.after(engine, step, mark)
        for i in step.admitted:
            start[of_index[i]] = step.start_s + offset
        for ev in step.events:
            q = of_index[ev.index]
            first.setdefault(q, ev.time_s + offset)
            if ev.finish_reason:
                done[q] = ev.time_s + offset
                if on_done is not None:
                    on_done(q)
                if arrivals is None and nxt < n:
                    submit(done[q])
        yield nxt
    engine_index = {q: i for i, q in of_index.items()}
    served = [Served(q, arrival[q], start[q], first[q] - arrival[q], done[q] - arrival[q], engine_index[q])
              for q in range(n) if q in done]
    t0 = min((s.arrival for s in served), default=0.0)
    last = max((s.arrival + s.e2e for s in served), default=0.0)
    return served, max(0.0, last - t0)


class TurnClocks:
    """Clocks for engines that take turns on one machine (`turn(lane)` around each of a lane's
    steps): lane i's clock (`clock(i)`, seconds) runs only while no other lane has its turn, so the
    time another engine's steps take never shows in this one's figures, and a drift of the machine
    between two steps hits every lane alike. Time outside every turn counts for all lanes but those
    held (`hold`: a lane waiting for the others, whose clock stands still until `release`)."""

    def __init__(self, lanes: int, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._away = [0.0] * int(lanes)  # per lane: seconds spent in the other lanes' turns
        self._held: list[float | None] = [None] * int(lanes)  # per lane: its clock's reading while held

    def clock(self, lane: int) -> Callable[[], float]:
        away, held = self._away, self._held
        return lambda: self._clock() - away[lane] if held[lane] is None else held[lane]

    def hold(self, lane: int) -> None:
        """The lane waits for the others: its clock stands still, even between turns, until `release`."""
        if self._held[lane] is None:
            self._held[lane] = self._clock() - self._away[lane]

    def release(self, lane: int) -> None:
        """The lane's clock runs on from where `hold` stopped it."""
        held = self._held[lane]
        if held is not None:
            self._away[lane] = self._clock() - held
            self._held[lane] = None

    @contextmanager
    def turn(self, lane: int) -> Iterator[None]:
        t0 = self._clock()
        try:
            yield
        finally:
            spent = self._clock() - t0
            for other in range(len(self._away)):
                if other != lane:
                    self._away[other] += spent
