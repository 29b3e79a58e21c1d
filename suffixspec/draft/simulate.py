"""Trace replay: acceptance of a proposer measured without a model, and the copy-oracle.

Greedy speculative decoding is exact, so a recorded (prompt, output) trace replays exactly: a
round proposes a tree, accepts its longest root path equal to the next output tokens, then
commits one more token (the target's own, the *bonus*), until the output is consumed. Traces
replay in order through one proposer, as a server would see them.

The copy-oracle drafts, each round, the longest prefix of the remaining output found anywhere
in the available text (prompt, output so far, earlier outputs, corpora), capped at the
budget: no copying proposer can beat it.

The context bound is the same clairvoyant choice restricted to what a suffix-match drafter can
reach: per round and source, the longest suffix of the context the source holds (for the request
itself: the longest one that also ends earlier, as the proposer matches it; at least one token),
and the longest prefix of the remaining output that continues it there (any occurrence); the best
source wins, capped at the budget. It is the acceptance of an unbounded-width tree over the
sources' longest matches that always holds the right branch.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BadInputError
from ..textinput import read_utf8
from ..tokenids import as_tokens
from .automaton import SuffixAutomaton
from .proposer import Proposer

STAT_KEYS = ("mean_accepted_tokens", "acceptance_rate", "drafted_per_round", "accepted_by_position",
             "rounds", "propose_us_p50", "propose_us_p99", "propose_us_max", "oracle_mean_accepted_tokens",
             "context_bound_mean_accepted_tokens")


@dataclass
class Trace:
    prompt: np.ndarray
    output: np.ndarray
    id: object = None


def load_traces(path, tokenizer=None, vocab_size: int | None = None) -> list[Trace]:
    """Read JSONL traces: `prompt_ids`/`output_ids` (win when present) or `prompt`/`output` text.
    The file must be UTF-8 JSON lines; `vocab_size` (else the tokenizer's, when given) bounds token ids."""
    path = Path(path)
    traces = []
    if vocab_size is None and tokenizer is not None:
        vocab_size = getattr(tokenizer, "vocab_size", None)
    for lineno, line in enumerate(read_utf8(path, "traces").split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInputError(f"{where}: malformed JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise BadInputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        parts = []
        for key in ("prompt", "output"):
            if f"{key}_ids" in rec:
                try:
                    parts.append(as_tokens(rec[f"{key}_ids"], f"{key}_ids"))
                except (TypeError, ValueError) as exc:
                    raise BadInputError(f"{where}: {exc}") from None
            elif key in rec:
                if tokenizer is None:
                    raise BadInputError(f"{where}: text field {key!r} needs a tokenizer (--tokenizer)")
                if not isinstance(rec[key], str):
                    raise BadInputError(f"{where}: expected {key!r} to be a string")
                parts.append(np.asarray(tokenizer.encode(rec[key]), np.int32))
            else:
                raise BadInputError(f"{where}: expected '{key}_ids' or '{key}'")
            if vocab_size is not None and len(parts[-1]) and int(parts[-1].max()) >= vocab_size:
                raise BadInputError(f"{where}: expected {key} token ids in [0, {vocab_size}) (the vocabulary), "
                                    f"got {int(parts[-1].max())}")
        traces.append(Trace(parts[0], parts[1], rec.get("id")))
    if not traces:
        raise BadInputError(f"{path}: no traces")
    return traces


def _percentile(values, q) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def replay(traces, proposer: Proposer, budget: int, filter=None) -> dict:
    """Replay traces through `proposer`; returns the statistics of STAT_KEYS but the oracle's."""
    if budget < 1:
        raise BadInputError(f"budget: expected a positive integer, got {budget}")
    rounds = drafted = accepted = total = 0
    by_position = np.zeros(budget + 1, np.int64)
    propose_ns = []
    for trace in traces:
        out = trace.output
        session = proposer.start(trace.prompt, request_id=trace.id, filter=filter)
        pos = 0
        while pos < out.shape[0]:
            t0 = time.perf_counter_ns()
            tree = session.propose(budget)
            propose_ns.append(time.perf_counter_ns() - t0)
            node = tree.longest_accepted(out[pos : pos + budget + 1]) if len(tree) else -1
            a = int(tree.depths[node]) if node >= 0 else 0
            by_position[1 : a + 1] += 1
            drafted += len(tree)
            accepted += a
            commit = out[pos : pos + a + 1]
            session.extend(commit)
            pos += commit.shape[0]
            rounds += 1
        session.close()
        total += out.shape[0]
    last = int(np.max(np.nonzero(by_position)[0])) if by_position.any() else 0
    us = np.asarray(propose_ns) / 1e3
    return {
        "mean_accepted_tokens": total / rounds if rounds else 0.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "drafted_per_round": drafted / rounds if rounds else 0.0,
        "accepted_by_position": [round(float(c) / rounds, 4) for c in by_position[1 : last + 1]] if rounds else [],
        "rounds": rounds,
        "output_tokens": total,
        "propose_us_p50": _percentile(us, 50),
        "propose_us_p99": _percentile(us, 99),
        "propose_us_max": float(us.max()) if len(us) else 0.0,
    }


def oracle_mean_accepted(traces, budget: int, corpora=(), use_history: bool = True) -> float:
    """Mean committed tokens per round of the clairvoyant copy proposer."""
    history = SuffixAutomaton()
    rounds = total = 0
    for trace in traces:
        own = SuffixAutomaton(trace.prompt)
        out = trace.output
        pos = 0
        while pos < out.shape[0]:
            ahead = out[pos : pos + budget]
            a = own.prefix_length(ahead)
            if use_history and len(history):
                a = max(a, history.prefix_length(ahead))
            for corpus in corpora:
                a = max(a, corpus.prefix_length(ahead))  # automata, or corpus-index shards
            commit = out[pos : pos + a + 1]
            own.extend(commit)
            pos += commit.shape[0]
            rounds += 1
        if use_history and out.shape[0]:
            history.add_document(out)
        total += out.shape[0]
    return total / rounds if rounds else 0.0


def _continued(automaton, context, ahead, length) -> int:
    """How many tokens of `ahead` continue the last `length` tokens of `context` in `automaton`."""
    if length < 1:
        return 0
    return automaton.prefix_length(np.concatenate([context[context.shape[0] - length :], ahead])) - length


def context_bound_mean_accepted(traces, budget: int, corpora=(), use_history: bool = True) -> float:
    """Mean committed tokens per round of the context bound (module docstring)."""
    history = SuffixAutomaton()
    rounds = total = 0
    for trace in traces:
        text = trace.prompt.copy()
        own = SuffixAutomaton(text)  # the text ...
        earlier = SuffixAutomaton(text[:-1])  # ... and all of it but the last token: where "earlier" ends
        out = trace.output
        pos = 0
        while pos < out.shape[0]:
            ahead = out[pos : pos + budget]
            a = _continued(own, text, ahead, earlier.match_length(text)) if text.shape[0] else 0
            sources = ([history] if use_history and len(history) else []) + list(corpora)
            for src in sources:  # automata, or corpus-index shards
                a = max(a, _continued(src, text, ahead, src.match_length(text)))
            commit = out[pos : pos + a + 1]
            if text.shape[0]:
                earlier.extend(text[-1:])
            earlier.extend(commit[:-1])
            own.extend(commit)
            text = np.concatenate([text, commit])
            pos += commit.shape[0]
            rounds += 1
        if use_history and out.shape[0]:
            history.add_document(out)
        total += out.shape[0]
    return total / rounds if rounds else 0.0


def simulate(traces, proposer: Proposer, budget: int, filter=None) -> dict:
    stats = replay(traces, proposer, budget, filter)
    corpora = []
    for c in proposer.corpora:
        corpora.extend([shard.fa for shard in c.shards] if hasattr(c, "shards") else [c])
    stats["oracle_mean_accepted_tokens"] = oracle_mean_accepted(
        traces, budget, corpora, use_history=proposer.cache is not None)
    stats["context_bound_mean_accepted_tokens"] = context_bound_mean_accepted(
        traces, budget, corpora, use_history=proposer.cache is not None)
    stats["budget"] = budget
    return stats
