"""The editor workload's runs: sessions typed against an engine, superseded requests cancelled.

Contract: `editor_steps(engine, sessions, submit, timing, users)` drives any engine with the interface
of `suffixspec.engine.engine.Engine` plus `cancel(index)` (in process, or `remote.HTTPEngine`) through
`users` editor sessions at once (the next session starts when one ends), as a generator that yields
after every step the number of requests added (so engines can take turns, as `runs` interleaves
them) and returns one `Sent` per request. A session's request at keystroke i is sent when the user
has typed up to it and the debounce has passed; a `waits` keystroke's completion is awaited, then the
user thinks (`think_s`) and types on (`char_s` per character, then `debounce_s`); a mid-line keystroke
is superseded `type_on_s` after it was sent: still running then, it is cancelled (`engine.cancel`).
Times are the engine's clock plus the idle gaps skipped (nothing sleeps), from the request's sending.
`submit(engine, keystroke, key)` adds one request and returns its engine index. `run_editor` runs
every mode at every `users` count x repeat (modes of one count together, taking turns step by step,
where every backend takes a clock; reversed every other repeat) and returns `EditorRun`s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .editor import EditorSession, Keystroke
from .runs import BenchSettings, close_engine, interleaves, open_engine, run_order, settled
from .schedule import TurnClocks
from .timesplit import StepSplit

__all__ = ["EditorTiming", "Sent", "EditorRun", "editor_steps", "run_editor"]


@dataclass(frozen=True)
class EditorTiming:
    debounce_s: float = 0.15  # quiet time after the last keystroke before the editor sends a request
    char_s: float = 0.08  # the user's time per typed character
    think_s: float = 0.5  # after a completion shows, before the user types on
    type_on_s: float = 0.3  # a mid-line pause: the next keystroke comes this long after the request


@dataclass
class Sent:
    """One request as the editor saw it: times in seconds from its sending."""

    session: int
    keystroke: Keystroke
    index: int  # the engine's index
    sent_s: float
    ttft_s: float | None = None
    e2e_s: float | None = None  # None: superseded and cancelled before it finished
    cancelled_s: float | None = None  # when the editor cancelled it (from sending)
    finish_reason: str = ""
    error: str = ""


@dataclass
class EditorRun:
    mode: str
    users: int
    repeat: int
    sent: list[Sent]
    texts: list[str]  # per request, its completion as text (cut at its first stop sequence)
    requests: list[dict]  # per request: the engine's statistics (rounds, drafted, accepted, new_tokens)
    makespan_s: float
    time_split: dict | None = None
    errors: list[str] = field(default_factory=list)


def _typed(a: Keystroke, b: Keystroke) -> int:
    """Characters the user types from keystroke a to keystroke b of the same session."""
    return max(1, len(a.expected) - len(b.expected))


def editor_steps(engine, sessions: list[EditorSession], submit: Callable[[Any, Keystroke, int], int],
                 timing: EditorTiming, users: int = 1, split: StepSplit | None = None):
    """See the module docstring. Returns (sent requests in sending order, makespan)."""
    offset = -engine.now()
    sent: list[Sent] = []
    by_index: dict[int, Sent] = {}
    started = 0
    # per live session: [session number, next keystroke, time it is sent (None: waiting for a completion)]
    live: list[list] = []
    superseding: dict[int, float] = {}  # engine index -> when the next keystroke supersedes it

    def begin(at: float) -> None:
        nonlocal started
        if started < len(sessions):
            live.append([started, 0, at])
            started += 1

    def advance(entry: list, at: float) -> None:
        """The user goes on from keystroke entry[1] (sent or answered at `at`) to the next one."""
        s, i = entry[0], entry[1]
        strokes = sessions[s].keystrokes
        if i + 1 >= len(strokes):
            live.remove(entry)
            begin(at)
            return
        entry[1], entry[2] = i + 1, at + timing.char_s * _typed(strokes[i], strokes[i + 1]) + timing.debounce_s

    for _ in range(min(users, len(sessions))):
        begin(0.0)
    while True:
        now = engine.now() + offset
        for index, at in sorted(superseding.items(), key=lambda x: x[1]):
            if at <= now:
                del superseding[index]
                r = by_index[index]
                if r.e2e_s is None and engine.cancel(index):
                    r.cancelled_s = at - r.sent_s
        for entry in list(live):
            if entry[2] is not None and entry[2] <= now:
                s, i, at = entry
                ks = sessions[s].keystrokes[i]
                index = submit(engine, ks, len(sent))
                r = Sent(s, ks, index, at)
                sent.append(r)
                by_index[index] = r
                if ks.waits:
                    entry[2] = None
                else:
                    superseding[index] = at + timing.type_on_s
                    advance(entry, at + timing.type_on_s - timing.char_s)
        if engine.idle:  # every finished request has been reported: skip to the next keystroke
            future = [e[2] for e in live if e[2] is not None] + list(superseding.values())
            if not future:
                if live:
                    raise RuntimeError("an editor session waits on a request the engine never finished")
                break
            offset += max(0.0, min(future) - now)
            continue
        mark = split.before(engine) if split is not None else None
        step = engine.step()
        if split is not None:
            split.after(engine, step, mark)
        for ev in step.events:
            r = by_index.get(ev.index)
            if r is None:
                continue
            at = ev.time_s + offset
            if r.ttft_s is None and (ev.tokens or not ev.finish_reason):  # (an endpoint's chunks carry no ids)
                r.ttft_s = at - r.sent_s
            if ev.finish_reason:
                r.finish_reason, r.error = ev.finish_reason, getattr(ev, "error", "") or ""
                late = superseding.pop(ev.index, None)
                if late is not None and at > late:  # it ended after the keystroke that superseded it
                    r.cancelled_s = late - r.sent_s
                if r.cancelled_s is None and ev.finish_reason != "cancelled":
                    r.e2e_s = at - r.sent_s
                    if r.ttft_s is None:
                        r.ttft_s = r.e2e_s
                if r.keystroke.waits:
                    entry = next((e for e in live if e[0] == r.session and e[2] is None), None)
                    if entry is not None:
                        advance(entry, at + timing.think_s)
        yield len(sent)
    ends = [r.sent_s + (r.e2e_s if r.e2e_s is not None else (r.cancelled_s or 0.0)) for r in sent]
    return sent, max(ends, default=0.0) - min((r.sent_s for r in sent), default=0.0)


def _cut(text: str, stop: tuple[str, ...]) -> str:
    at = min((text.find(s) for s in stop if s in text), default=-1)
    return text if at < 0 else text[:at]


def _finish(engine, mode: str, users: int, repeat: int, sent: list[Sent], makespan: float, errors: list[str],
            split: StepSplit, decode: Callable[[Any], str]) -> EditorRun:
    result = engine.result()
    texts, stats = [], []
    for r in sent:
        seq = result.sequences[r.index]
        texts.append(_cut(seq if isinstance(seq, str) else decode(seq), r.keystroke.stop))
        rs = result.stats.requests[r.index]
        stats.append({"new_tokens": rs.new_tokens if isinstance(seq, str) else len(seq), "rounds": rs.rounds,
                      "drafted": rs.drafted, "accepted": rs.accepted, "prompt_tokens": rs.prompt_tokens})
        if r.finish_reason == "error":
            errors.append(f"{r.keystroke.session}#{r.keystroke.index}: {r.error or 'failed'}")
    return EditorRun(mode, users, repeat, sent, texts, stats, makespan, split.result(engine), errors)


def run_editor(sessions: list[EditorSession], backends: dict[str, Any], settings: BenchSettings,
               submit: Callable[[Any, Keystroke, int], int], decode: Callable[[Any], str],
               timing: EditorTiming = EditorTiming(), clock: Callable[[], float] = time.perf_counter) -> list[EditorRun]:
    """Every mode of `backends` (`settings.modes`, prompt lookup aside: it cannot cancel) at every
    `settings.concurrency` (editor users at once) x `settings.repeat`; see the module docstring."""
    modes = [m for m in settings.modes if m in backends and m != "prompt_lookup"]
    configs = [(m, c) for c in settings.concurrency for m in modes]
    runs: list[EditorRun] = []
    for r in range(settings.repeat):
        order = run_order(configs, r)
        for c in dict.fromkeys(c for _, c in order):
            lanes = [(m, backends[m].fresh() if hasattr(backends[m], "fresh") else backends[m])
                     for m, cc in order if cc == c]
            with settled():
                if len(lanes) > 1 and interleaves(settings, [b for _, b in lanes]):
                    runs.extend(_together(lanes, sessions, settings, submit, decode, timing, c, r, clock))
                    continue
                for mode, backend in lanes:
                    runs.extend(_together([(mode, backend)], sessions, settings, submit, decode, timing, c, r, None))
    return runs


def _together(lanes, sessions, settings, submit, decode, timing, users, repeat, clock) -> list[EditorRun]:
    """The lanes' engines taking turns step by step on `TurnClocks` (`clock` None: one lane, the
    backend's own clock); a lane that has sent more requests than another waits, its clock held."""
    clocks = TurnClocks(len(lanes), clock=clock or time.perf_counter)
    engines, gens, splits = [], [], [StepSplit() for _ in lanes]
    errors: list[list[str]] = [[] for _ in lanes]
    outcome: list[tuple[list[Sent], float]] = [([], 0.0) for _ in lanes]
    for i, (mode, backend) in enumerate(lanes):
        with clocks.turn(i):
            engines.append(open_engine(backend, mode, settings, users, repeat,
                                       clock=clocks.clock(i) if clock else None))
            gens.append(editor_steps(engines[i], sessions, submit, timing, users, splits[i]))
    live, added = list(range(len(lanes))), [0] * len(lanes)
    while live:
        low = min(added[i] for i in live)
        for i in live:
            if added[i] > low:
                clocks.hold(i)
        for i in [i for i in live if added[i] == low]:
            clocks.release(i)
            with clocks.turn(i):
                try:
                    added[i] = next(gens[i])
                    continue
                except StopIteration as end:
                    outcome[i] = end.value
                except Exception as exc:  # noqa: BLE001 - this lane's run fails alone
                    errors[i].append(f"{type(exc).__name__}: {exc}")
                live.remove(i)
                close_engine(engines[i])
    runs = []
    for i, (mode, _) in enumerate(lanes):
        with clocks.turn(i):
            sent, makespan = outcome[i]
            runs.append(_finish(engines[i], mode, users, repeat, sent, makespan, errors[i], splits[i], decode))
    return runs
