"""The engine thread: the one owner of an `Engine`, and the request handles HTTP handlers hold.

Contract:

* `EngineLoop(engine, max_queue=..., metrics=None, stall_s=...)`; `start()` runs one daemon thread that
  alone calls the engine (`add`, `cancel`, `step`, `release`, stats). Handlers put messages on a
  thread-safe inbox (`submit`, `cancel`), read between rounds: a new request joins the running batch
  at the next round. Requests that arrive together (within `gather_s` of each other, at most
  `gather_max_s` in all, counting handlers still reading their bodies) are admitted in one prefill.
* `submit` answers at once with `APIError` 503 while draining or after the thread died, and 429 (with
  `Retry-After`) when `max_queue` requests already wait for a slot; a submitted request is never
  dropped by the bound.
* `Handle`: `await handle.wait_accepted()` raises the `APIError` of a request the engine refused (400,
  the error's `param` named); then `handle.events()` yields `Tokens(ids)` once per round that
  committed tokens and finally the `Final`. Events cross with `loop.call_soon_threadsafe`, never
  blocking on a slow client.
* `cancel(handle)` drops the request at the engine's next step; finished requests are released at once.
* A request that fails inside a round finishes with reason "error" alone; if the thread itself dies,
  every live handle finishes with "error" and `health()` reports it.
* `health() -> (ok, reason)`: not ok after the thread died, while draining, or while one step has run
  for more than `stall_s` seconds.
* Usage per request (`Final.stats`): rounds, tokens per round, drafted, accepted, TTFT and queueing
  milliseconds, and each step's proposer and verifier time shared equally among its requests."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field, fields
from typing import AsyncIterator

from ..engine.engine import Event
from ..errors import BadInputError, BadInputTypeError
from .protocol import APIError, GenerationRequest

__all__ = ["EngineLoop", "Handle", "Final", "Tokens"]

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
IDLE_WAIT_S = 0.25
GATHER_S = 0.003  # from idle: requests this close behind the previous one join its admission
GATHER_MAX_S = 0.05  # the most a first request waits for others
ARRIVAL_POLL_S = 0.001


# ----------------------------------------------------------------------------------- events (engine -> handler)


@dataclass(frozen=True)
class Tokens:
    """The tokens one round committed to a request that goes on."""

    ids: list[int]
    logprobs: list | None = None  # a `logprobs.TokenLogprob` per token, when the request asked for them


@dataclass(frozen=True)
class Final:
    """How a request ended: its last event."""

    reason: str  # the engine's: "eos", "stop", "length", "cancelled" or "error"
    error: str
    completion_tokens: int
    prediction: tuple[int, int] | None  # (accepted, rejected) prediction tokens, None without a prediction
    stats: dict = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)  # the last round's tokens
    logprobs: list | None = None  # the last round's tokens' logprobs
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache


# ----------------------------------------------------------------------------------- messages (handler -> engine)


@dataclass(frozen=True)
class AddRequest:
    """A submitted request, for the engine's next admission."""

    handle: Handle


@dataclass(frozen=True)
class CancelRequest:
    """A request whose client went away: the engine drops it at its next step."""

    handle: Handle


@dataclass(frozen=True)
class CancelAll:
    """Every live request cancelled (shutdown past its grace period)."""


@dataclass(frozen=True)
class Wake:
    """Nothing to do: wakes a thread sleeping on the inbox (to see `stop`)."""


Message = AddRequest | CancelRequest | CancelAll | Wake


@dataclass(frozen=True)
class _Totals:
    """The engine's running totals that a step's usage is the difference of."""

    rounds: int = 0
    plain_rounds: int = 0
    proposer_s: float = 0.0
    budget_s: float = 0.0
    verifier_s: float = 0.0
    prefill_tokens: int = 0
    prefill_chunks: int = 0

    @classmethod
    def of(cls, stats) -> _Totals:
        return cls(*(getattr(stats, f.name, 0) for f in fields(cls)))

    def __sub__(self, other: _Totals) -> _Totals:
        return _Totals(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


class Handle:
    """One engine request of an HTTP request (one choice: `job`, a `choices.ChoiceJob`; None: the
    request's one prompt, sample 0), made on the handler's event loop. Its events go to `sink` as
    `(handle, event)` pairs when one is given (several choices share one), else to its own queue.
    `first`: the handle of sample 0 of the same prompt (its siblings share its prefill). `score_prompt`:
    the number of top alternatives for the prompt's own logprobs (None: not scored), which the
    engine thread sets in `prompt_logprobs` before the handle is accepted."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None, *, job=None,
                 sink: asyncio.Queue | None = None, first: Handle | None = None, score_prompt: int | None = None):
        self.request = request
        self.loop = loop or asyncio.get_running_loop()
        self.job = job
        self.first = first
        self.score_prompt = score_prompt
        self.prompt_logprobs: list | None = None
        self._sink = sink
        self._events: asyncio.Queue = asyncio.Queue()
        self._accepted = self.loop.create_future()
        self.index: int | None = None
        self.final: Final | None = None
        # engine-thread state
        self.queued = False
        self.proposer_s = 0.0  # proposer (budget included) seconds charged to it
        self.verifier_s = 0.0
        self.finished = False

    # ---------------------------------------------------------------- engine side (any thread)

    def _call(self, fn, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the handler's loop is closed: nobody is listening any more
            pass

    def accept(self, index: int) -> None:
        self.index = index
        self._call(_set_result, self._accepted, index)

    def reject(self, error: APIError) -> None:
        self.finished = True
        self._call(_set_exception, self._accepted, error)

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_ids if self.job is None else self.job.input.ids

    @property
    def sample(self) -> int:
        return 0 if self.job is None else self.job.sample

    def _post(self, event) -> None:
        if self._sink is not None:
            self._call(self._sink.put_nowait, (self, event))
        else:
            self._call(self._events.put_nowait, event)

    def post_tokens(self, tokens: list[int], logprobs=None) -> None:
        self._post(Tokens(tokens, logprobs))

    def post_final(self, final: Final) -> None:
        self.finished = True
        self.final = final
        self._post(final)

    # ---------------------------------------------------------------- handler side (its loop)

    async def wait_accepted(self) -> int:
        return await self._accepted

    async def events(self) -> AsyncIterator[Tokens | Final]:
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, Final):
                return


class EngineLoop:
    def __init__(self, engine, *, max_queue: int = 256, metrics=None, stall_s: float = 120.0,
                 gather_s: float = GATHER_S, gather_max_s: float = GATHER_MAX_S):
        self.engine = engine
        self.max_queue = int(max_queue)
        self.gather_s, self.gather_max_s = float(gather_s), float(gather_max_s)
        self.metrics = metrics
        self.stall_s = float(stall_s)
        self.draining = False
        self.aborted = False  # cancel_all ran: a cancelled request was aborted by the server, not its client
        self.dead: str | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0  # submitted, not yet admitted (guarded by _lock)
        self._live = 0  # submitted, not yet finished (guarded by _lock)
        self._arriving = 0  # requests in handlers, not yet submitted (guarded by _lock; read without)
        self._handles: dict[int, Handle] = {}  # engine thread only
        self._step_started: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="suffixspec-engine", daemon=True)

    # ---------------------------------------------------------------- any thread

    def start(self) -> None:
        self._thread.start()

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def live(self) -> int:
        """Requests submitted and not finished yet."""
        return self._live

    def submit(self, handle: Handle) -> None:
        if self.dead is not None:
            raise APIError(503, f"the engine stopped: {self.dead}", code="engine_dead")
        if self.draining:
            raise APIError(503, "the server is shutting down and takes no new requests", code="draining")
        with self._lock:
            if self._waiting >= self.max_queue:
                raise APIError(429, f"too many requests waiting ({self._waiting}, the limit is {self.max_queue}); "
                               f"retry later", code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
            self._waiting += 1
            self._live += 1
            handle.queued = True
        self._inbox.put(AddRequest(handle))

    def cancel(self, handle: Handle) -> None:
        if not handle.finished:
            self._inbox.put(CancelRequest(handle))

    def cancel_all(self) -> None:
        """Cancel every live request (the drain's grace period is over): their handlers answer "aborted"."""
        self.aborted = True
        self._inbox.put(CancelAll())

    def health(self) -> tuple[bool, str]:
        if self.dead is not None:
            return False, f"engine stopped: {self.dead}"
        if not self._thread.is_alive():
            return False, "engine thread not running"
        if self.draining:
            return False, "draining"
        started = self._step_started
        if started is not None and time.monotonic() - started > self.stall_s:
            return False, f"one step has run for {time.monotonic() - started:.0f} s (stall limit {self.stall_s:.0f} s)"
        return True, "ok"

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        self._inbox.put(Wake())
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---------------------------------------------------------------- the engine thread

    def _unqueue(self, handle: Handle) -> None:
        with self._lock:
            if handle.queued:
                handle.queued = False
                self._waiting -= 1

    def _done(self, handle: Handle) -> None:
        self._unqueue(handle)
        with self._lock:
            self._live -= 1

    def _take_inbox(self, block: bool) -> None:
        """Every message in the inbox; `block` (the engine is idle): wait for one first, then for
        those that follow within `gather_s` of the previous one or while handlers are still between
        a request's arrival and its `submit` (`expect`), up to `gather_max_s` after the first."""
        try:
            message = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        deadline = time.monotonic() + self.gather_max_s if block else None
        while message is not None:
            self._handle_message(message)
            message = self._next_message(deadline)

    def _next_message(self, deadline: float | None) -> Message | None:
        """The next message, or None once none came in time (at once without a `deadline`)."""
        while True:
            left = 0.0 if deadline is None else deadline - time.monotonic()
            wait = min(left, self.gather_s)
            try:
                return self._inbox.get(timeout=wait) if wait > 0 else self._inbox.get_nowait()
            except queue.Empty:
                if left <= 0 or self._arriving <= 0:
                    return None
                # a request is on its way (its handler is parsing it): wait for it in short steps
                try:
                    return self._inbox.get(timeout=min(left, ARRIVAL_POLL_S))
                except queue.Empty:
                    continue

    def expect(self) -> None:
        """A request reached a handler (call `arrived` once it is submitted or refused)."""
        with self._lock:
            self._arriving += 1

    def arrived(self) -> None:
        with self._lock:
            self._arriving -= 1

    def _handle_message(self, message: Message) -> None:
        if isinstance(message, AddRequest):
            self._add(message.handle)
        elif isinstance(message, CancelRequest):
            handle = message.handle
            if handle.index is not None and handle.index in self._handles:
                self.engine.cancel(handle.index)
        elif isinstance(message, CancelAll):
            for index in list(self._handles):
                self.engine.cancel(index)

    def _add(self, handle: Handle) -> None:
        rq = handle.request
        engine = self.engine
        first = handle.first
        sibling = first.index if first is not None and first.index in self._handles else None
        try:
            index = engine.add(handle.prompt_ids, max_new_tokens=rq.max_tokens, key=handle.sample, filter=rq.filter,
                               options=rq.options, prediction=rq.prediction_ids, sibling=sibling)
            if handle.score_prompt is not None:
                handle.prompt_logprobs = engine.score_prompt(handle.prompt_ids, handle.score_prompt)
        except (BadInputError, BadInputTypeError) as exc:
            self._done(handle)
            handle.reject(APIError(400, str(exc), param=exc.param))
            return
        except Exception as exc:  # noqa: BLE001 - this request's own failure
            log.exception("adding a request failed")
            self._done(handle)
            handle.reject(APIError(500, f"the engine could not take the request: {type(exc).__name__}: {exc}"))
            return
        self._handles[index] = handle
        handle.accept(index)
        if engine.finished(index):  # nothing to generate (max_tokens 0): it ends at once
            self._finish(handle, Event(index, [], engine.now(), engine.request_stats(index).finish_reason))

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                if engine.idle:
                    engine.upkeep()  # finished requests' sessions close here, not on a newcomer's time
                self._take_inbox(block=engine.idle)
                if engine.idle:
                    if self._stop.is_set():
                        return
                    self._observe(None, _Totals())
                    continue
                before = _Totals.of(engine.stats)
                self._step_started = time.monotonic()
                step = engine.step()
                self._step_started = None
                self._dispatch(step, before)
        except BaseException as exc:  # noqa: BLE001 - the thread must say why it died
            self._step_started = None
            self.dead = f"{type(exc).__name__}: {exc}"
            log.exception("the engine thread died")
            for index, handle in list(self._handles.items()):
                self._done(handle)
                handle.post_final(Final("error", self.dead, 0, None))
            self._handles.clear()
            self._refuse_inbox()

    def _refuse_inbox(self) -> None:
        """After the thread died: answer every request still in the inbox (503)."""
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, AddRequest):
                self._done(message.handle)
                message.handle.reject(APIError(503, f"the engine stopped: {self.dead}", code="engine_dead"))

    def _dispatch(self, step, before: _Totals) -> None:
        delta = _Totals.of(self.engine.stats) - before
        for index in step.admitted:
            handle = self._handles.get(index)
            if handle is not None:
                self._unqueue(handle)
        took_part = {ev.index for ev in step.events if ev.tokens}
        if took_part:
            proposer_share = (delta.proposer_s + delta.budget_s) / len(took_part)
            verifier_share = delta.verifier_s / len(took_part)
            for index in took_part:
                handle = self._handles.get(index)
                if handle is not None:
                    handle.proposer_s += proposer_share
                    handle.verifier_s += verifier_share
        for ev in step.events:
            handle = self._handles.get(ev.index)
            if handle is None:
                continue
            if ev.finish_reason:
                self._finish(handle, ev)  # the last tokens come with the end
            elif ev.tokens:
                handle.post_tokens(list(ev.tokens), ev.logprobs)
        self._observe(step, delta)

    def _finish(self, handle: Handle, ev) -> None:
        engine = self.engine
        rs = engine.request_stats(ev.index)
        prediction = engine.prediction_counts(ev.index) if handle.request.prediction_ids is not None else None
        stats = {
            "rounds": rs.rounds,
            "tokens_per_round": round(rs.tokens_per_round, 4),
            "drafted": rs.drafted,
            "accepted": rs.accepted,
            "acceptance_rate": round(rs.accepted / rs.drafted, 4) if rs.drafted else 0.0,
            "proposer_ms": round(handle.proposer_s * 1e3, 3),
            "verifier_ms": round(handle.verifier_s * 1e3, 3),
            "ttft_ms": round(rs.ttft_s * 1e3, 3),
            "queue_ms": round(rs.queue_s * 1e3, 3),
        }
        final = Final(ev.finish_reason, ev.error, rs.new_tokens, prediction, stats, list(ev.tokens),
                      getattr(ev, "logprobs", None), rs.cached_tokens)
        if self.metrics is not None:
            self.metrics.observe_finished(ev.finish_reason, rs)
        del self._handles[ev.index]
        engine.release(ev.index)
        self._done(handle)
        handle.post_final(final)

    def _observe(self, step, delta: _Totals) -> None:
        if self.metrics is None:
            return
        self.metrics.observe_step(waiting=self._waiting, running=self.engine.running, rounds=delta.rounds,
                                  plain_rounds=delta.plain_rounds, proposer_s=delta.proposer_s,
                                  budget_s=delta.budget_s, verifier_s=delta.verifier_s,
                                  admitted=len(step.admitted) if step is not None else 0)
        self.metrics.observe_prefill(prefilling=getattr(self.engine, "prefilling", 0),
                                     tokens=delta.prefill_tokens, chunks=delta.prefill_chunks)
