"""A request's life inside the engine (`Engine`): its stage, its proposer session, its pending close.

Invariants, kept by `Request.move` and `Request.open`/`Request.close` (the only writers):

* `stage` goes WAITING -> RUNNING -> FINISHED, or WAITING -> FINISHED (cancelled while queued, or
  a request with nothing to generate); a WAITING request sits in the engine's queue, a RUNNING one
  is admitted (a row of the running batch, or in its prefill); a FINISHED one keeps its output and
  statistics until the engine releases it.
* `session_state` is OPEN exactly when `session` is not None; DEFERRED means the session opens over
  the prompt when the request first drafts (its prefill could carry no tree), so it is opened on the
  way out (`PendingClose`) when it never drafted; NONE: no session (plain decoding, or closed).
* `context` == prompt + `output`; `unfed` holds the committed tokens an OPEN session has not seen.

`Event` is what a request's life reports outward: the tokens one round committed, or its end.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import Any

from ..draft.prediction import Prediction
from ..errors import InternalError
from .budget import RequestTrust
from .stats import RequestStats

__all__ = ["Stage", "SessionState", "Request", "PendingClose", "CloseQueue", "Event"]

log = logging.getLogger(__name__)


class Stage(enum.Enum):
    WAITING = "waiting"  # queued for admission (FIFO)
    RUNNING = "running"  # admitted: its prefill, then its rows' rounds
    FINISHED = "finished"  # its output is final


class SessionState(enum.Enum):
    NONE = "none"  # no proposer session: plain decoding, or closed
    DEFERRED = "deferred"  # opens over the prompt when the request first drafts
    OPEN = "open"  # `Request.session` drafts for the request


_MOVES = {(Stage.WAITING, Stage.RUNNING), (Stage.WAITING, Stage.FINISHED), (Stage.RUNNING, Stage.FINISHED)}


@dataclass
class PendingClose:
    """A finished request's proposer session, queued to close (its output joins the past responses)."""

    unfed: list[int]  # committed tokens the session has not seen (a deferred one: the whole output)
    session: Any = None  # the open session; None: open one over `prompt` first (it was deferred)
    prompt: list[int] | None = None
    request_id: Any = None
    filter: Any = None


@dataclass
class Event:
    """Tokens request `index` committed in one round, at `time_s`; `finish_reason` once it is done
    ("eos", "stop", "length", "cancelled" or "error", with `error` saying why)."""

    index: int
    tokens: list[int]
    time_s: float
    finish_reason: str = ""
    error: str = ""
    logprobs: list | None = None  # a `logprobs.TokenLogprob` per token, when the request asked for them


@dataclass
class Request:
    """One request inside the engine."""

    index: int
    key: int  # sampling draw key
    max_new: int
    decoding: Any  # its resolved `options.Decoding`
    budget: Any  # "auto" or draft nodes per round (0: plain decoding)
    context: list[int]  # prompt + output
    pending: list[int]  # committed tokens not yet in the cache
    stats: RequestStats = field(default_factory=RequestStats)
    added_s: float = 0.0  # when it was added, on the engine's clock
    stage: Stage = Stage.WAITING
    output: list[int] = field(default_factory=list)
    session_state: SessionState = SessionState.NONE
    session: Any = None  # the proposer session while OPEN
    unfed: list[int] = field(default_factory=list)  # committed tokens an OPEN session has not seen
    filter: Any = None
    request_id: Any = None
    prediction: Prediction | None = None
    trust: RequestTrust = field(default_factory=RequestTrust)
    cancelled: bool = False
    draft_view: list[int] | None = None  # tokens its session sees after the prompt, for drafting only
    recycle: bool = False  # drafts from the model's past predictions too (`recycle.RecycleTable`)

    @property
    def auto(self) -> bool:
        return self.budget == "auto"

    @property
    def speculates(self) -> bool:
        return self.auto or int(self.budget) > 0

    @property
    def prompt(self) -> list[int]:
        return self.context[: len(self.context) - len(self.output)]

    @property
    def drafted_prompt(self) -> list[int]:
        """What its proposer session opens over: the prompt, then the `draft_view` if any."""
        return self.prompt + self.draft_view if self.draft_view else self.prompt

    def move(self, stage: Stage) -> None:
        if (self.stage, stage) not in _MOVES:
            raise InternalError(f"request {self.index}: no move from {self.stage.value} to {stage.value}")
        self.stage = stage

    def defer(self) -> None:
        """Its session opens when it first drafts (or when it closes, if it never drafts)."""
        if self.session_state is SessionState.NONE and self.speculates:
            self.session_state = SessionState.DEFERRED

    def open(self, proposer) -> None:
        """Its proposer session over its prompt (a request that does not speculate has none); tokens
        it committed before (a deferred session's, a retried request's) wait in `unfed`."""
        if self.session_state is not SessionState.OPEN and self.speculates:
            self.session = proposer.start(self.drafted_prompt, request_id=self.request_id, filter=self.filter)
            self.session_state = SessionState.OPEN
            self.unfed = list(self.output)
        elif self.session_state is SessionState.DEFERRED:
            self.session_state = SessionState.NONE

    def catch_up(self) -> None:
        """The open session takes the committed tokens it has not seen (one extend call)."""
        if self.unfed:
            tokens, self.unfed = self.unfed, []
            self.session.extend(tokens)

    def close(self) -> PendingClose | None:
        """Leave its session: what must still close it (over the whole output), or None."""
        pending = None
        if self.session_state is SessionState.DEFERRED:
            pending = PendingClose(list(self.output), prompt=self.drafted_prompt, request_id=self.request_id,
                                   filter=self.filter)
        elif self.session_state is SessionState.OPEN:
            pending = PendingClose(self.unfed, session=self.session)
        self.session, self.unfed, self.session_state = None, [], SessionState.NONE
        return pending


def close_logged(close, *args) -> None:
    """close(*args) for finished requests' sessions: a failure is logged, not raised, since it is a
    finished request's bookkeeping and not a round's failure."""
    try:
        close(*args)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.warning("closing a finished request's proposer session failed: %r", exc)


class CloseQueue:
    """Finished requests' sessions, queued (`add`) until `flush` closes them all at once."""

    def __init__(self):
        self.pending: list[PendingClose] = []

    def __bool__(self) -> bool:
        return bool(self.pending)

    def add(self, rq: Request) -> None:
        """The request's session is queued to close over the whole output (what it closes over joins
        the past responses); a deferred session that never drafted opens at the flush."""
        pending = rq.close()
        if pending is not None:
            self.pending.append(pending)

    def flush(self, proposer) -> None:
        """Close the queued sessions of `proposer`; their outputs join the past responses in one cache
        add. A failure is logged, and no running request pays for it: a session that could not be
        opened or fed keeps what it had (or nothing), a failed add loses that flush's outputs."""
        closing, self.pending = self.pending, []
        if not closing:
            return
        sessions = []
        for pending in closing:
            try:
                session = pending.session
                if session is None:
                    session = proposer.start(pending.prompt, request_id=pending.request_id, filter=pending.filter)
                sessions.append(session)  # closed below even when feeding it fails
                if pending.unfed:
                    session.extend(pending.unfed)
            except Exception as exc:  # noqa: BLE001 - a finished request's bookkeeping, not a round's failure
                log.warning("opening or feeding a finished request's proposer session failed: %r", exc)
        together = getattr(proposer, "close_sessions", None)  # the Proposer's: one cache add for all
        if together is not None:
            close_logged(together, sessions)
        else:
            for session in sessions:
                close_logged(session.close)
