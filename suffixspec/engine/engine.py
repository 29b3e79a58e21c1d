"""`Engine`: the continuous-batching engine: the request queue, admission and stepping.

Requests join the running batch between rounds and leave it when they finish; a freed slot is
refilled at the next step. The round itself is `round.RoundRunner`; prompts are read by `prefill`.

Contract of one `step()`:

1. Cancelled requests leave (`cancel`).
2. Either admission or a round. Admission when slots are free (`max_batch`) and requests wait, or a
   long prompt is being read, unless the previous step admitted while requests ran (running rows
   wait for at most one admission between two of their rounds). Waiting requests (FIFO) fill the
   free slots within `max_step_tokens` (a longer prompt becomes a `PrefillJob`, read chunk by chunk).
   A newcomer's prefill is its first round; its cache rows then join the running batch
   (`KVState.add_rows`). Automatic rows of a prefill that could carry no draft node
   (`BudgetPolicy.prefill_may_draft`) defer their proposer sessions (`SessionState.DEFERRED`) to
   their first drafting round. A newcomer whose prompt fits one step has its first tokens at the end
   of the step that admits it: its time to first token is its queueing and its prefill.
3. Otherwise one round for every running request (`RoundRunner.run`: draft, size, verify, settle,
   feed, learn). Finished requests leave the batch. Their sessions close just before the proposer
   next drafts, or in `upkeep()` (a step of an idle engine, `close()`, `run()`): never in the step
   that finishes them nor in one that only admits. While the automatic budget keeps choosing plain
   decoding, automatic rows draft only every few rounds (`budget.DraftCadence`).
4. A round that raises is retried request by request from a fresh cache: the request that raises
   alone fails (finish reason "error", its error recorded); the others go on unaffected.

A request's output and sampling draws depend only on its prompt, draw key and options, never on its
batch: under greedy decoding it equals plain batch-1 decoding; plain decoding is budget 0. Times are
seconds on the engine's clock (`now()`, 0 at construction); request latencies count from `add()`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from ..draft.prediction import Prediction, prediction_counts
from ..errors import BadInputError
from ..verify.structured import escaped_view
from .budget import DraftCadence
from .fallback import serve_plain
from .lifecycle import CloseQueue, Event, Request, Stage
from .options import DecodeOptions, check_int
from .prefill import DEFAULT_MAX_STEP_TOKENS, PrefillJob, prefill_groups
from .reuse import PrefixReuse, make_prefix_pool
from .round import RoundRunner
from .stats import GenerationResult, GenerationStats, RequestStats, peak_memory

__all__ = ["Engine", "Server", "Event", "Step"]

log = logging.getLogger(__name__)


@dataclass
class Step:
    start_s: float
    end_s: float
    admitted: list[int] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


def model_vocab_size(model) -> int | None:
    """Rows of the model's input embedding (the ids it can read), else its config's `vocab_size`."""
    try:
        return int(model.get_input_embeddings().weight.shape[0])
    except (AttributeError, TypeError, NotImplementedError):
        size = getattr(getattr(model, "config", None), "vocab_size", None)
        return int(size) if size else None


class Engine:
    """Continuous batching over a `SpeculativeGenerator` (built by `SpeculativeGenerator.serve`).

    `options`: the default `DecodeOptions` of every request (or its fields as keyword arguments:
    `max_new_tokens`, `do_sample`, `temperature`, `top_k`, `top_p`, `seed`, `eos_token_id`, `stop`,
    `logits_processor`, `budget`). `max_batch`: most requests decoded together (None: no limit).
    `stream(index, tokens)`: called with each round's committed tokens. `filter`: the corpus document
    filter of requests added without one. `max_step_tokens`: most prompt tokens (padding included)
    a step feeds to the model; a longer prompt is read in chunks over several steps (`prefill`).
    `clock`: seconds. `prefix_cache_bytes`: this engine's own prefix pool of that many bytes (0: none;
    None: the generator's pool, `SpeculativeGenerator.prefix_pool`)."""

    def __init__(self, gen, *, options: DecodeOptions | None = None, max_batch: int | None = None,
                 stream: Callable[[int, list[int]], Any] | None = None, filter=None,
                 max_step_tokens: int | None = None, clock: Callable[[], float] = time.perf_counter,
                 prefix_cache_bytes: int | None = None, **option_fields):
        from ..verify.kv import KVState

        if options is None:
            options = DecodeOptions(**option_fields)
        elif option_fields:
            options = options.replace(**option_fields)
        check_int(max_batch, "max_batch", low=1, none_ok=True)
        check_int(max_step_tokens, "max_step_tokens", low=1, none_ok=True)
        self.max_step_tokens = DEFAULT_MAX_STEP_TOKENS if max_step_tokens is None else int(max_step_tokens)
        self.gen = gen
        self.model = gen.model
        self.tokenizer = gen.tokenizer
        self.policy = gen.policy
        self.options = options
        self.decoding = options.resolve(self.model, self.tokenizer)
        self.max_batch = None if max_batch is None else int(max_batch)
        self.stream = stream
        self.filter = filter
        self.stats = GenerationStats(requests=[])
        # every request not released, by index; its `stage` says where it is (`lifecycle`)
        self._requests: dict[int, Request] = {}
        self._next = 0
        self._waiting: deque[Request] = deque()  # the WAITING requests, in arrival order
        self._rows: list[Request] = []  # the RUNNING requests in the batch: the rows of self._state, in order
        self._job: PrefillJob | None = None  # a RUNNING request whose long prompt is being read
        self._cadence = DraftCadence()  # the running batch's drafting while its budget stays off
        self._admitted_last = False  # the last step admitted while rows ran (the next one runs their round)
        self._closes = CloseQueue()  # finished requests' sessions, closed by `RoundRunner.flush_closes`
        self._clock = clock
        # the generator's one-time work (kernels, tree check, cost curve) is timed apart, before the clock
        self.stats.setup_s = gen.prepare(drafts=options.budget != 0, cost_curve=options.budget == "auto",
                                         clock=clock).total_s
        self.unsupported = gen.check_support()
        self._t0 = clock()
        self._new_state = lambda b: KVState(self.model, b)
        self._state = self._new_state(0)
        self.device = self._state.device
        # prompts read once: the generator's pool, or this engine's own when a bound is given
        pool = gen.prefix_pool if prefix_cache_bytes is None else make_prefix_pool(prefix_cache_bytes, self.model)
        self._reuse = PrefixReuse(pool if self.unsupported is None else None)
        self._rounds = RoundRunner(gen, self.policy, self.stats, clock, self.now, self._closes, stream,
                                   keep_rows=self._keep_rows)
        config = getattr(self.model, "config", None)
        self.vocab_size = model_vocab_size(self.model)
        self.max_positions = getattr(config, "max_position_embeddings", None)

    # ---------------------------------------------------------------------------------- queue

    def now(self) -> float:
        return self._clock() - self._t0

    @property
    def running(self) -> int:
        return len(self._rows)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def prefilling(self) -> int:
        """Requests whose prompts are being read over several steps (0 or 1)."""
        return int(self._job is not None)

    @property
    def idle(self) -> bool:
        return not self._rows and not self._waiting and self._job is None

    def add(self, prompt, *, max_new_tokens: int | None = None, key: int | None = None, filter=None,
            request_id=None, options: DecodeOptions | None = None, prediction=None, sibling: int | None = None) -> int:
        """Queue one request (token ids, or a string with a tokenizer); returns its index.

        `options`: its own `DecodeOptions` (default: the engine's); `max_new_tokens` caps it further.
        `key` keys its sampling draws (default: its index). `filter`: its corpus document filter.
        `prediction`: tokens (or a string) its output is expected to repeat: drafted first.
        `sibling`: the index of a request with the same prompt (one of `n` samples), checked to have it:
        requests admitted together read a prompt they share once (`reuse`), samples or not.
        Everything is checked here against the model: a bad request never reaches a round."""
        ids = self.gen.encode_one(prompt, "prompt")
        bad = None if self.vocab_size is None else next((t for t in ids if t >= self.vocab_size), None)
        if bad is not None:
            raise BadInputError(f"prompt: expected token ids in [0, {self.vocab_size}) (the model's vocabulary), got {bad}",
                                  param="prompt")
        opts = self.options if options is None else options
        if opts.per_request:
            decoding = opts.resolve(self.model, self.tokenizer, prompt_len=len(ids))
        else:
            decoding = self.decoding if options is None else options.resolve(self.model, self.tokenizer)
        limit = int(opts.max_new_tokens)
        if max_new_tokens is not None:
            limit = min(limit, check_int(max_new_tokens, "max_new_tokens", low=0))
        if self.max_positions is not None and len(ids) + limit > int(self.max_positions):
            raise BadInputError(f"prompt: {len(ids)} prompt tokens plus max_new_tokens {limit} exceed the model's "
                                f"context of {int(self.max_positions)} positions", param="prompt")
        if key is not None:
            key = check_int(key, "key", low=0)
        if opts.budget == "auto" and self.unsupported is None:
            self.policy.ensure_cost_model(self.model)
        predicted = None
        if prediction is not None:
            predicted = Prediction(self.gen.encode_one(prediction, "prediction") if len(prediction) else [])
        if sibling is not None:
            first = self._requests.get(sibling)
            if first is not None and first.prompt != list(ids):
                raise BadInputError(f"sibling: expected a request with the same prompt, request {sibling} has "
                                    "another", param="sibling")
        q = self._next
        self._next += 1
        rq = Request(q, q if key is None else key, limit, decoding, opts.budget, list(ids), list(ids),
                     stats=RequestStats(prompt_tokens=len(ids)), added_s=self.now(),
                     filter=self.filter if filter is None else filter,
                     request_id=request_id, prediction=predicted,
                     recycle=bool(self.gen.recycle if opts.recycle is None else opts.recycle),
                     draft_view=escaped_view(self.tokenizer, ids) if decoding.grammar is not None else None)
        self._requests[q] = rq
        self.stats.requests.append(rq.stats)
        if limit == 0:
            rq.stats.finish_reason = "length"
            rq.move(Stage.FINISHED)
        else:
            self._waiting.append(rq)
        return q

    def cancel(self, index: int) -> bool:
        """Cancel a waiting or running request: it leaves at the start of the next step (its slot is
        free for that step's admissions). False when it is unknown or already finished."""
        rq = self._requests.get(index)
        if rq is None or rq.stage is Stage.FINISHED:
            return False
        rq.cancelled = True
        return True

    def output(self, index: int) -> list[int]:
        return list(self._requests[index].output)

    def finished(self, index: int) -> bool:
        """Whether request `index` has finished (a request with nothing to generate finishes at `add`)."""
        return self._requests[index].stage is Stage.FINISHED

    def score_prompt(self, ids: list[int], top: int) -> list:
        """The log probability of each prompt token after the ones before it, with `top` alternatives
        (`logprobs.score_prompt`; the first entry is None): one pass over the prompt, on the verifier's
        time."""
        from ..verify.logprobs import score_prompt

        t = self._clock()
        try:
            return score_prompt(self.model, list(ids), int(top))
        finally:
            self.stats.verifier_s += self._clock() - t

    def request_stats(self, index: int) -> RequestStats:
        return self._requests[index].stats

    def prediction_counts(self, index: int) -> tuple[int, int]:
        """(accepted, rejected) prediction tokens of a request as OpenAI counts them: the prediction's
        tokens that its output kept, in order, and the others (`prediction.prediction_counts`);
        (0, 0) without a prediction."""
        rq = self._requests.get(index)
        if rq is None or rq.prediction is None:
            return 0, 0
        return prediction_counts(rq.prediction.tokens, rq.output)

    def release(self, index: int) -> None:
        """Forget a finished request's output and statistics (a long-running server calls this)."""
        rq = self._requests.get(index)
        if rq is not None and rq.stage is not Stage.FINISHED:
            raise BadInputError(f"release: request {index} has not finished", param="index")
        if rq is not None:
            del self._requests[index]
            self.stats.requests.remove(rq.stats)

    # ---------------------------------------------------------------------------------- steps

    def step(self) -> Step:
        """Drop cancelled requests, then either admit what fits (their prefill is their first round)
        or run one round for every running request; see the module docstring."""
        step = Step(self.now(), 0.0)
        if self.idle:  # nothing to decode: the deferred upkeep
            self.upkeep()
            step.end_s = self.now()
            return step
        self._drop_cancelled(step)
        if self.unsupported is not None:
            if self._waiting:
                serve_plain(self, self._waiting.popleft(), step)
            step.end_s = self.stats.e2e_s = self.now()
            return step
        if not self._rows:
            self._state = self._new_state(0)
        slots = None if self.max_batch is None else self.max_batch - len(self._rows) - self.prefilling
        free = len(self._waiting) if slots is None else min(len(self._waiting), slots)
        # the running rows wait for at most one admission (a bounded prefill step) between two rounds
        if (free > 0 or self._job is not None) and not (self._rows and self._admitted_last):
            self._admitted_last = bool(self._rows)  # it held running rows back
            self._admit(free, step)
        elif self._rows:
            rows = self._rows
            try:
                self._rows = self._round(self._state, rows, step.events, drafts=self._cadence.drafts(),
                                         cadence=self._cadence)
            except Exception as exc:  # noqa: BLE001
                self._state = self._new_state(0)
                self._rows = []
                self._rows = self._isolate(rows, exc, step.events)
            self._admitted_last = False
        if not self._rows:
            self._state = self._new_state(0)
        step.end_s = self.stats.e2e_s = self.now()
        return step

    def upkeep(self) -> None:
        """Close finished requests' proposer sessions now (their outputs join the past responses).
        Steps leave that to the next proposal, so it never lands on a newcomer's first token; a step
        of an idle engine, `close()` and `run()` do it too. Counted in `stats.proposer_s` (and `e2e_s`)."""
        if self._closes:
            t = self._clock()
            self._rounds.flush_closes()
            self.stats.proposer_s += self._clock() - t
            self.stats.e2e_s = self.now()

    def _admit(self, free: int, step: Step) -> None:
        """Up to `free` waiting requests and the prefill in progress, within `max_step_tokens` fed
        tokens: prefixes that several newcomers share are read once, then each newcomer starts from
        the longest prefix of its prompt in the pool (`reuse`); groups that fit are read in one pass
        each (their first round), then the rows join the running batch; the first prompt too long
        for the step becomes the prefill job (if none is in progress); the job then reads its next
        chunk with what is left. Newcomers not started stay at the head of the queue, in their order."""
        budget, spent, back = self.max_step_tokens, 0, []
        newcomers = [self._waiting.popleft() for _ in range(free)]
        reuse = self._reuse
        reuse.begin_admission()
        try:
            for plan in reuse.plan_shared(newcomers):
                if spent + plan.length - plan.cached <= budget:
                    spent += self._read_shared(plan)
            for rq in newcomers:
                reuse.match(rq)
            for group in prefill_groups(newcomers, max_tokens=budget):
                tokens = len(group) * max(len(rq.pending) for rq in group)
                if spent + tokens <= budget:
                    self._start(group)
                    spent += tokens
                    self._first_round(group, self._seeded(group), step)
                elif len(group) == 1 and tokens > budget and self._job is None:
                    self._start(group)
                    self._job = PrefillJob(group[0], self._seeded(group))
                else:
                    back.extend(group)
            for rq in back:
                reuse.unmatch(rq)
        finally:
            reuse.end_admission()
        for rq in sorted(back, key=lambda rq: rq.index, reverse=True):
            self._waiting.appendleft(rq)
        step.admitted.extend(rq.index for rq in newcomers if rq.stage is not Stage.WAITING)  # in arrival order
        reuse.count([rq for rq in newcomers if rq.stage is not Stage.WAITING])
        left = budget - spent
        if self._job is not None and left >= min(budget // 4, self._job.remaining):
            spent += self._advance_job(left, step)
        if spent:
            self.stats.prefill_steps += 1
            self.stats.prefill_tokens += spent
        self._cadence.wake()  # a newcomer may draft well: the next round looks

    def _read_shared(self, plan) -> int:
        """A prefix several newcomers share, read once into the pool (`PrefixReuse.read_shared`); a
        failure leaves each to read its own prompt (and fail alone). Returns the tokens fed."""
        t = self._clock()
        try:
            return self._reuse.read_shared(plan, self._new_state)
        except Exception as exc:  # noqa: BLE001 - the members read their prompts themselves
            log.warning("reading a shared prefix failed: %r", exc)
            return 0
        finally:
            self.stats.verifier_s += self._clock() - t

    def _seeded(self, group: list[Request]):
        """A KV state for `group`, each row starting from its pool match (on the verifier's time)."""
        t = self._clock()
        try:
            return self._reuse.seeded_state(group, self._new_state)
        finally:
            self.stats.verifier_s += self._clock() - t

    def _start(self, group: list[Request]) -> None:
        for rq in group:
            rq.move(Stage.RUNNING)
            rq.stats.queue_s = self.now() - rq.added_s

    def _first_round(self, group: list[Request], state, step: Step) -> None:
        """The group's first round over its (remaining) prompts in `state`; its rows join the batch."""
        try:
            # a prefill too short to carry any tree within the policy's slack leaves its automatic
            # rows' session set-up to their first drafting round, off their time to first token
            room = self.policy.prefill_may_draft(len(group), max(len(rq.pending) for rq in group))
            for rq in group:
                if room or not rq.auto or rq.filter is not None or rq.prediction is not None:
                    rq.open(self.gen.proposer)
                else:
                    rq.defer()
            kept = self._round(state, group, step.events, drafts=True)
            self._keep_rows(state, range(len(kept)), kept)  # the prompts read, for requests that follow
            self._state.add_rows(state)
            self._rows.extend(kept)
        except Exception as exc:  # noqa: BLE001 - isolated below: one request fails, not the group
            self._rows.extend(self._isolate(group, exc, step.events))

    def _advance_job(self, tokens: int, step: Step) -> int:
        """The prefill job reads its next chunk of at most `tokens`, or, when the rest fits, runs its
        first round and joins the batch. Returns the prompt tokens fed."""
        job = self._job
        if job.remaining <= tokens:
            self._job = None
            fed = job.remaining
            self._first_round([job.request], job.state, step)
            return fed
        t = self._clock()
        try:
            fed = job.feed(tokens)
        except Exception as exc:  # noqa: BLE001 - this request's own failure
            self._job = None
            self._isolate([job.request], exc, step.events)
            return 0
        self.stats.verifier_s += self._clock() - t
        self.stats.prefill_chunks += 1
        return fed

    def _keep_rows(self, state, rows, requests: list[Request]) -> None:
        """Rows of `state` (the rows of `requests`) into the prefix pool, on the verifier's time; a
        failure costs the pool an entry, never a request."""
        if not self._reuse.enabled or not requests:
            return
        t = self._clock()
        try:
            self._reuse.keep(state, list(rows), list(requests))
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("keeping a prefix failed: %r", exc)
        self.stats.verifier_s += self._clock() - t

    def _round(self, state, requests: list[Request], events: list[Event], drafts: bool = True,
               cadence: DraftCadence | None = None) -> list[Request]:
        """One round of `requests` (the rows of `state`): `RoundRunner.run`, told whether requests wait."""
        return self._rounds.run(state, requests, events, drafts=drafts, cadence=cadence,
                                waiting=bool(self._waiting))

    # ---------------------------------------------------------------------------------- ends

    def _drop_cancelled(self, step: Step) -> None:
        job = self._job
        if (not any(rq.cancelled for rq in self._rows) and not any(rq.cancelled for rq in self._waiting)
                and not (job is not None and job.request.cancelled)):
            return
        now = self.now()
        if job is not None and job.request.cancelled:
            self._job = None
            self._keep_rows(job.state, [0], [job.request])
            self.end_request(job.request, "cancelled", "", step.events, now)
        for rq in [rq for rq in self._waiting if rq.cancelled]:
            self._waiting.remove(rq)
            self.end_request(rq, "cancelled", "", step.events, now)
        keep = [i for i, rq in enumerate(self._rows) if not rq.cancelled]
        if len(keep) < len(self._rows):
            gone = [i for i, rq in enumerate(self._rows) if rq.cancelled]
            self._keep_rows(self._state, gone, [self._rows[i] for i in gone])
            for rq in self._rows:
                if rq.cancelled:
                    self.end_request(rq, "cancelled", "", step.events, now)
            self._state.select_rows(keep)
            self._rows = [self._rows[i] for i in keep]

    def end_request(self, rq: Request, reason: str, error: str, events: list[Event], now: float) -> None:
        """`rq` ends outside a round (cancelled, failed, or served by the fallback): its event in `events`."""
        rs = rq.stats
        rs.finish_reason, rs.error = reason, error
        rs.e2e_s = now - rq.added_s
        self._closes.add(rq)
        rq.move(Stage.FINISHED)
        events.append(Event(rq.index, [], now, reason, error))

    def _isolate(self, requests: list[Request], exc: Exception, events: list[Event]) -> list[Request]:
        """After a failed round: each request alone, from a fresh cache row over its whole context
        (its committed tokens stay as they are); one that fails alone fails for good. Returns the
        survivors, their rows appended to `self._state`."""
        if len(requests) == 1:
            rq = requests[0]
            log.warning("request %d failed: %r", rq.index, exc)
            self.end_request(rq, "error", f"{type(exc).__name__}: {exc}", events, self.now())
            return []
        survivors = []
        for rq in requests:
            rq.pending = list(rq.context)
            state = self._new_state(1)
            try:
                self._closes.add(rq)  # the failed round may have left it behind the context
                rq.open(self.gen.proposer)
                kept = self._round(state, [rq], events)
            except Exception as err:  # noqa: BLE001 - this request's own failure
                log.warning("request %d failed: %r", rq.index, err)
                self.end_request(rq, "error", f"{type(err).__name__}: {err}", events, self.now())
                continue
            if kept:
                self._state.add_rows(state)
                survivors.extend(kept)
        return survivors

    def close(self) -> None:
        """Close every live proposer session (requests still running or waiting are abandoned)."""
        for rq in [*self._rows, *self._waiting, *([self._job.request] if self._job is not None else [])]:
            self._closes.add(rq)
            rq.move(Stage.FINISHED)
        self.upkeep()
        self._rows, self._waiting, self._job = [], deque(), None
        self._state = self._new_state(0)

    def run(self) -> GenerationResult:
        """Step until every queued request has finished; the result of all requests so far."""
        try:
            while not self.idle:
                self.step()
        finally:
            self.close()
        return self.result()

    def result(self) -> GenerationResult:
        self.stats.peak_memory_bytes = peak_memory(self.device)
        outputs = [list(self._requests[q].output) for q in sorted(self._requests)]
        texts = [self.tokenizer.decode(o) for o in outputs] if self.tokenizer is not None else None
        return GenerationResult(outputs, self.stats, texts)


# the alias kept for this release: `Server` is what `Engine` was called before
Server = Engine
