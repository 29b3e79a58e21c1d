"""`Server`: continuous batching over a `SpeculativeGenerator`.

Requests join the running batch between rounds and leave it when they finish, so a slot freed by a
short request is refilled at once instead of idling until the batch's slowest request is done.

Contract of one `step()`:

1. Admission: waiting requests (FIFO) fill the free slots (`max_batch`). The newcomers get passes
   of their own over their prompts plus a draft tree each (their prefill, which is also their first
   round; grouped by prompt length so left padding stays small); their cache rows then join the
   running batch (`KVState.add_rows`).
2. One round for every running request (newcomers included): propose, prune to the budget, one
   forward pass, acceptance, commit. Finished requests leave the batch (`KVState.select_rows`).

A request's output and its sampling draws depend only on its prompt, its draw key and the settings,
never on which requests share its batch: under greedy decoding it equals plain batch-1 decoding.
Plain decoding is the same loop with budget 0. Times are seconds on the server's clock (`now()`,
0 at construction); request latencies count from `add()`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .errors import BadInputError
from .generate import GenerationResult, GenerationStats, RequestStats, _peak_memory, prune_tree

__all__ = ["Server", "Event", "Step"]


@dataclass
class Event:
    """Tokens request `index` committed in one round, at `time_s`; `finish_reason` once it is done."""

    index: int
    tokens: list[int]
    time_s: float
    finish_reason: str = ""


@dataclass
class Step:
    start_s: float
    end_s: float
    admitted: list[int] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


@dataclass
class _Live:
    index: int
    key: int  # sampling draw key
    max_new: int
    context: list[int]  # prompt + output
    pending: list[int]  # committed tokens not yet in the cache
    output: list[int] = field(default_factory=list)
    session: Any = None
    filter: Any = None
    request_id: Any = None
    predicted: float = 0.0  # decayed sum of this request's drafts' (globally calibrated) acceptance estimates
    hits: float = 0.0  # decayed count of its accepted draft nodes
    shadows: list = field(default_factory=list)  # trees proposed but not verified, still being checked

    def draft_factor(self) -> float:
        """How this request's drafts fare against the calibrated estimates: its verified drafts and the
        trees it proposed but did not verify (`_Shadow`), over a prior at `_REQUEST_PRIOR_RATIO`."""
        return float(np.clip((self.hits + _REQUEST_PRIOR * _REQUEST_PRIOR_RATIO) / (self.predicted + _REQUEST_PRIOR),
                             0.05, 3.0))


class _Shadow:
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


_SHADOW_NODES = 8  # the best nodes of an unverified tree that are checked against what followed
_REQUEST_PRIOR = 1.0  # pseudo-count (in estimated accepted nodes) behind every request's factor ...
_REQUEST_PRIOR_RATIO = 0.6  # ... at this factor: a request's first drafts must earn trust (short answers lost to them)
_REQUEST_DECAY = 0.95  # per round: a request that changes phase (prose, then copying) is re-evaluated


def _prefill_groups(lives: list[_Live], waste: float = 0.25) -> list[list[_Live]]:
    """Newcomers grouped by prompt length so that left padding adds at most `waste` of a group's tokens."""
    groups: list[list[_Live]] = []
    total = 0
    for lv in sorted(lives, key=lambda lv: len(lv.pending)):
        n = len(lv.pending)
        if groups and (len(groups[-1]) + 1) * n <= (1.0 + waste) * (total + n):
            groups[-1].append(lv)
            total += n
        else:
            groups.append([lv])
            total = n
    return groups


class Server:
    """Continuous batching; built by `SpeculativeGenerator.serve` (its arguments are `generate`'s,
    plus `max_batch`: most requests decoded together, None for no limit)."""

    def __init__(self, gen, *, max_new_tokens: int = 128, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None, eos_token_id=None,
                 stop=None, stream: Callable[[int, list[int]], Any] | None = None, logits_processor=None,
                 budget="auto", max_batch: int | None = None, clock: Callable[[], float] = time.perf_counter):
        from .verify import KVState, Sampler

        if int(max_new_tokens) < 0:
            raise BadInputError(f"max_new_tokens: expected >= 0, got {max_new_tokens}")
        if budget != "auto" and (not isinstance(budget, (int, np.integer)) or isinstance(budget, bool) or budget < 0):
            raise BadInputError(f"budget: expected 'auto' or an int >= 0, got {budget!r}")
        if max_batch is not None and int(max_batch) < 1:
            raise BadInputError(f"max_batch: expected None or >= 1, got {max_batch}")
        self.gen = gen
        self.max_new = int(max_new_tokens)
        self.budget = budget
        self.auto = budget == "auto"
        self.max_batch = None if max_batch is None else int(max_batch)
        self.min_weight = 0.25  # floor of `_tail_weights`
        self.eos = gen._eos_set(eos_token_id)
        self.stops = gen._stop_matchers(stop)
        self.stream = stream
        self.sampler = Sampler(do_sample, temperature, top_k, top_p, seed, logits_processor)
        self._sampling = dict(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p)
        self.stats = GenerationStats(requests=[])
        self.outputs: list[list[int]] = []
        self._added_s: list[float] = []
        self._waiting: deque[_Live] = deque()
        self._rows: list[_Live] = []  # the rows of self._state, in order
        self._clock = clock
        self._t0 = clock()
        self._unsupported = gen._check_support()
        self._speculate = self._unsupported is None and (self.auto or budget > 0)
        if self.auto and self._unsupported is None and gen.cost_model is None:
            from .generate import CostModel

            gen.cost_model = CostModel.cached(gen.model)
        self._new_state = lambda b: KVState(gen.model, b)
        self._state = self._new_state(0)
        self.device = self._state.device

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
    def idle(self) -> bool:
        return not self._rows and not self._waiting

    def add(self, prompt, *, max_new_tokens: int | None = None, key: int | None = None, filter=None,
            request_id=None) -> int:
        """Queue one request (token ids, or a string with a tokenizer); returns its index.
        `key` keys its sampling draws (default: its index); `max_new_tokens` caps it below the server's."""
        ids = self.gen._encode([prompt])[0]
        q = len(self.outputs)
        limit = self.max_new if max_new_tokens is None else min(self.max_new, int(max_new_tokens))
        if limit < 0:
            raise BadInputError(f"max_new_tokens: expected >= 0, got {max_new_tokens}")
        self.outputs.append([])
        self._added_s.append(self.now())
        self.stats.requests.append(RequestStats(prompt_tokens=len(ids)))
        live = _Live(q, q if key is None else int(key), limit, list(ids), list(ids), filter=filter,
                     request_id=request_id)
        if limit == 0:
            self.stats.requests[q].finish_reason = "length"
        else:
            self._waiting.append(live)
        return q

    # ---------------------------------------------------------------------------------- rounds

    def step(self) -> Step:
        """Admit what fits, then one round for every running request (see the module docstring)."""
        step = Step(self.now(), 0.0)
        if self._unsupported is not None:
            if self._waiting:
                self._plain_one(self._waiting.popleft(), step)
            step.end_s = self.stats.e2e_s = self.now()
            return step
        free = len(self._waiting) if self.max_batch is None else min(len(self._waiting), self.max_batch - len(self._rows))
        if free > 0:
            newcomers = [self._waiting.popleft() for _ in range(free)]
            for lv in newcomers:
                self.stats.requests[lv.index].queue_s = self.now() - self._added_s[lv.index]
                step.admitted.append(lv.index)
                if self._speculate:
                    lv.session = self.gen.proposer.start(lv.context, request_id=lv.request_id, filter=lv.filter)
            for group in _prefill_groups(newcomers):
                state = self._new_state(len(group))
                group = self._round(state, group, step.events, prefill=True)
                self._state.add_rows(state)
                self._rows.extend(group)
        if self._rows:
            self._rows = self._round(self._state, self._rows, step.events, prefill=False)
        if not self._rows:
            self._state = self._new_state(0)
        step.end_s = self.stats.e2e_s = self.now()
        return step

    def _round(self, state, lives: list[_Live], events: list[Event], prefill: bool) -> list[_Live]:
        from .verify import accept

        gen, stats = self.gen, self.stats
        limits = [lv.max_new - len(lv.output) for lv in lives]
        t = time.perf_counter()
        trees = gen._propose(self.proposer_or_none, [lv.session for lv in lives], limits, self.budget)
        stats.proposer_s += time.perf_counter() - t
        t = time.perf_counter()
        width = max(len(lv.pending) for lv in lives)
        proposed = trees
        if self.auto and self._speculate and any(len(tr) for tr in trees):
            trees = gen._auto_prune(trees, limits, width=width, weights=self._tail_weights(lives),
                                    row_factors=[lv.draft_factor() for lv in lives])
        t_pass = time.perf_counter()
        logits, root = state.forward([lv.pending for lv in lives], trees)
        if self.auto and self._speculate and width == 1:  # prefills are dominated by the prompt: not observed
            gen.cost_model.observe(len(lives) * (1 + max(len(tr) for tr in trees)), time.perf_counter() - t_pass,
                                   batch=len(lives))  # the pass is padded to the widest row
        results = accept(logits, root, trees, self.sampler, [lv.context for lv in lives], [lv.key for lv in lives],
                         [len(lv.output) for lv in lives], limits, self.eos)
        state.commit([res.accepted_nodes for res in results])
        stats.verifier_s += time.perf_counter() - t
        stats.rounds += 1
        stats.plain_rounds += all(len(tr) == 0 for tr in trees)
        stats.budgets.extend(len(tr) for tr in trees)
        now = self.now()
        keep = []
        committed = []
        for i, (lv, res, tree) in enumerate(zip(lives, results, trees)):
            rs = stats.requests[lv.index]
            tokens, reason = [], ""
            for tok in res.tokens:
                tokens.append(tok)
                lv.output.append(tok)
                if tok in self.eos:
                    reason = "eos"
                elif any(m(lv.output) for m in self.stops):
                    reason = "stop"
                elif len(lv.output) >= lv.max_new:
                    reason = "length"
                if reason:
                    break
            committed.append(tokens)
            n_acc = min(len(res.accepted_nodes), len(tokens))
            if not rs.rounds:
                rs.ttft_s = now - self._added_s[lv.index]
            rs.rounds += 1
            rs.committed_per_round.append(len(tokens))
            rs.drafted += len(tree)
            rs.accepted += n_acc
            for d in range(n_acc):
                if d == len(rs.accepted_by_position):
                    rs.accepted_by_position.append(0)
                rs.accepted_by_position[d] += 1
            rs.new_tokens = len(lv.output)
            rs.e2e_s = now - self._added_s[lv.index]
            lv.context.extend(tokens)
            lv.pending = [tokens[-1]]
            self.outputs[lv.index] = lv.output
            if self.stream is not None and tokens:
                self.stream(lv.index, list(tokens))
            events.append(Event(lv.index, list(tokens), now, reason))
            if reason:
                rs.finish_reason = reason
                if lv.session is not None:
                    lv.session.close()
                    lv.session = None
            else:
                if lv.session is not None:
                    lv.session.extend(tokens)
                keep.append(i)
        if self.auto and self._speculate:
            for lv, res, tree, full, tokens, lim in zip(lives, results, trees, proposed, committed, limits):
                lv.predicted *= _REQUEST_DECAY
                lv.hits *= _REQUEST_DECAY
                if len(tree):
                    lv.predicted += float(gen.calibration.apply(np.sort(tree.scores)[::-1]).sum())
                    lv.hits += len(res.accepted_nodes)
                elif len(full):
                    shadow = prune_tree(full, _SHADOW_NODES, lim - 1)
                    if len(shadow):
                        lv.predicted += float(gen.calibration.apply(np.sort(shadow.scores)[::-1]).sum())
                        lv.shadows.append(_Shadow(shadow))
                if lv.shadows:
                    pending = []
                    for sh in lv.shadows:
                        if sh.feed(tokens):
                            lv.hits += sh.hits
                        else:
                            pending.append(sh)
                    lv.shadows = pending
            if any(len(tr) and float(tr.scores.sum()) > 0 for tr in trees):
                gen.calibration.observe(trees, [res.accepted_nodes for res in results])
        if len(keep) < len(lives):
            state.select_rows(keep)
        return [lives[i] for i in keep]

    def _tail_weights(self, lives: list[_Live]):
        """Weights of the rows' tokens for the auto budget: with nobody waiting, the batch lasts as long
        as its slowest request, so a row counts by its expected remaining rounds relative to the
        longest (remaining tokens / tokens per round so far, one token a round before any); with
        requests waiting, a freed slot is refilled at once and every token counts alike."""
        if self._waiting or len(lives) == 1:
            return None
        rounds = np.array([self.stats.requests[lv.index].rounds for lv in lives], np.float64)
        done = np.array([len(lv.output) for lv in lives], np.float64)
        remaining = np.array([lv.max_new for lv in lives], np.float64) - done
        expected_rounds = remaining * (rounds + 1.0) / (done + 1.0)
        return np.maximum(expected_rounds / expected_rounds.max(), self.min_weight)

    @property
    def proposer_or_none(self):
        return self.gen.proposer if self._speculate else None

    def _plain_one(self, lv: _Live, step: Step) -> None:
        """A model tree verification cannot serve: transformers' own generate, one request per step."""
        from .verify import warn_once

        warn_once(f"suffixspec: speculation disabled for this model ({self._unsupported}); using plain decoding")
        step.admitted.append(lv.index)
        sub = GenerationStats(requests=[RequestStats(prompt_tokens=len(lv.context))])
        res = self.gen._plain_generate([lv.context], sub, lv.max_new, self.sampler, self.eos, self.stops, None,
                                       **self._sampling)
        rs = sub.requests[0]
        rs.queue_s = self.now() - self._added_s[lv.index] - rs.e2e_s
        rs.ttft_s = rs.e2e_s = self.now() - self._added_s[lv.index]
        self.stats.requests[lv.index] = rs
        self.stats.rounds += sub.rounds
        self.stats.plain_rounds += sub.plain_rounds
        self.stats.verifier_s += sub.verifier_s
        self.stats.fallback = self._unsupported
        self.outputs[lv.index] = res.sequences[0]
        if self.stream is not None and res.sequences[0]:
            self.stream(lv.index, list(res.sequences[0]))
        step.events.append(Event(lv.index, list(res.sequences[0]), self.now(), rs.finish_reason))

    # ---------------------------------------------------------------------------------- end

    def close(self) -> None:
        """Close every live proposer session (requests still running or waiting are abandoned)."""
        for lv in [*self._rows, *self._waiting]:
            if lv.session is not None:
                lv.session.close()
                lv.session = None
        self._rows, self._waiting = [], deque()
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
        self.stats.peak_memory_bytes = _peak_memory(self.device)
        tok = self.gen.tokenizer
        texts = [tok.decode(o) for o in self.outputs] if tok is not None else None
        return GenerationResult([list(o) for o in self.outputs], self.stats, texts)
