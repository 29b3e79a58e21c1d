"""SuffixSpecDraftModel against a fake of llama-cpp-python's draft-model calling convention (no llama_cpp needed).

The fake (`FakeLlama`) drives the draft model as `Llama.generate` does: one buffer of `n_ctx` token ids
whose first `n_tokens + 1` (the context and the token just sampled) are passed as a view, the draft's
tokens written after them by the next evaluation and left there stale when rejected. Its "model"
answers a fixed greedy continuation; an evaluation accepts the longest draft prefix that equals it,
then samples one token. A fake clock advances by a chosen cost line per evaluation.
"""

import abc
import subprocess
import sys

import numpy as np
import pytest

from suffixspec import BadInputError, BadInputTypeError
from suffixspec.integrations import llama_cpp as adapter

FLAT = [[1, 1.0], [10**9, 1.0 + 1e-9]]  # an evaluation costs the same whatever it verifies
STEEP = [[1, 1.0], [2, 2.0]]  # each drafted token costs a whole evaluation: no draft pays


class StandInDraftModel(abc.ABC):
    """llama_cpp.llama_speculative.LlamaDraftModel's shape: an abstract `__call__`."""

    @abc.abstractmethod
    def __call__(self, input_ids, /, **kwargs):
        raise NotImplementedError


def draft_class():
    try:
        return adapter.SuffixSpecDraftModel
    except ImportError:
        return adapter.draft_model_class(StandInDraftModel)


class Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class FakeLlama:
    """`Llama.generate`'s loop as the draft model sees it (module docstring)."""

    def __init__(self, n_ctx=4096, clock=None, base=1.0, per_token=0.0):
        self.buf = np.full(n_ctx, 777, np.intc)  # stale garbage beyond the context
        self.clock, self.base, self.per_token = clock, base, per_token
        self.drafts: list[np.ndarray] = []
        self.lengths: list[int] = []  # the length of each call's ids

    def generate(self, draft_model, prompt, answer):
        buf = self.buf
        buf[: len(prompt)] = prompt
        n = len(prompt)  # n_tokens: evaluated tokens
        out = [answer[0]]  # the first token, sampled after the prompt's evaluation
        evals = 1
        while len(out) < len(answer):
            buf[n] = out[-1]
            view = buf[: n + 1]
            before = view.copy()
            d = draft_model(view)
            assert np.array_equal(view, before), "the draft model changed the array it was given"
            assert isinstance(d, np.ndarray) and d.dtype == np.intc and d.ndim == 1
            self.drafts.append(d)
            self.lengths.append(n + 1)
            buf[n + 1 : n + 1 + len(d)] = d  # the evaluation of [token] + draft
            evals += 1
            if self.clock is not None:
                self.clock.now += self.base + self.per_token * len(d)
            n += 1
            i, acc = len(out), 0
            while acc < len(d) and i + acc < len(answer) and d[acc] == answer[i + acc]:
                acc += 1
            out.extend(answer[i : i + acc])
            n += acc
            if len(out) < len(answer):
                out.append(answer[len(out)])
        return out, evals


def copy_edit(seed=0, n=300):
    """A prompt of n random tokens and an answer that copies a span of it with two edits."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 5000, n).tolist()
    answer = prompt[40:120] + [6001, 6002] + prompt[122:200] + [6003] + prompt[201:260]
    return prompt, answer


class Spy:
    """Records what the proposer's sessions are given: per session, the prompt and the extended ids."""

    def __init__(self, model):
        self.sessions = []
        start = model.proposer.start

        def spied_start(prompt, **kw):
            session = start(prompt, **kw)
            record = {"prompt": list(np.asarray(prompt)), "fed": [], "closed": False}
            self.sessions.append(record)
            extend, close = session.extend, session.close
            session.extend = lambda ids: (record["fed"].extend(np.asarray(ids).tolist()), extend(ids))[1]
            session.close = lambda: (record.update(closed=True), close())[1]
            return session

        model.proposer.start = spied_start


def test_import_does_not_import_llama_cpp():
    code = ("import sys, suffixspec, suffixspec.integrations.llama_cpp as m; "
            "assert 'llama_cpp' not in sys.modules, 'llama_cpp imported'; "
            "m.LlamaDrafter; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_class_is_a_draft_model_built_with_no_arguments():
    cls = draft_class()
    model = cls()
    assert isinstance(model, adapter.LlamaDrafter) and model.k == adapter.DEFAULT_MAX_DRAFT
    assert cls.__name__ == "SuffixSpecDraftModel"
    try:
        from llama_cpp.llama_speculative import LlamaDraftModel
    except ImportError:
        assert isinstance(model, StandInDraftModel)
        with pytest.raises(ImportError):
            adapter.SuffixSpecDraftModel  # noqa: B018 - the lazy name needs llama_cpp
    else:
        assert isinstance(model, LlamaDraftModel) and adapter.SuffixSpecDraftModel is cls


def test_bad_options_are_refused():
    cls = draft_class()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(BadInputError, match="max_draft"):
            cls(max_draft=bad)
    with pytest.raises(BadInputError, match="filter"):
        cls(filter={"repo": "x"})
    with pytest.raises(BadInputTypeError, match="no_such_knob"):
        cls(no_such_knob=1)
    with pytest.raises(BadInputError):
        cls(step_cost=[[1, -1]])


def test_one_session_per_sequence_fed_only_new_ids():
    model = draft_class()(step_cost=FLAT)
    spy = Spy(model)
    prompt, answer = copy_edit()
    llama = FakeLlama()
    out, evals = llama.generate(model, prompt, answer)
    assert out == answer
    assert evals < len(answer) / 3  # the copied spans were drafted and accepted
    assert len(spy.sessions) == 1 and model.stats["sessions"] == 1
    s = spy.sessions[0]
    # the session started on the prompt, then was given each new id exactly once, in order
    assert s["prompt"] == prompt
    assert s["fed"] == answer[: llama.lengths[-1] - len(prompt)]
    assert all(len(d) <= model.k for d in llama.drafts)


def test_a_call_that_does_not_extend_starts_a_new_session_and_the_old_joins_the_cache():
    # inline upkeep: the closed output is in the cache when the closing call drafts (the default,
    # background upkeep, adds it a few milliseconds later: longer than this fake's whole sequence)
    model = draft_class()(step_cost=FLAT, cache_upkeep="inline")
    spy = Spy(model)
    prompt, answer = copy_edit(seed=1)
    FakeLlama().generate(model, prompt, answer)
    # another prompt (nothing of the first), whose answer is the first answer: only the cache knows it
    other, _ = copy_edit(seed=2)
    llama = FakeLlama()
    out, evals = llama.generate(model, other, answer)
    assert out == answer
    assert len(spy.sessions) == 2 and spy.sessions[0]["closed"] and not spy.sessions[1]["closed"]
    assert spy.sessions[1]["prompt"] == other
    assert evals < len(answer) / 3
    # the second sequence's second draft already continues the first answer, from the cache
    second = llama.drafts[1]
    assert len(second) > 0 and second.tolist() == answer[2 : 2 + len(second)]


def test_a_rolled_back_or_edited_context_starts_a_new_session():
    model = draft_class()(step_cost=FLAT)
    spy = Spy(model)
    ids = np.arange(100, 160, dtype=np.intc)
    model(ids[:40])
    model(ids[:45])  # extends
    model(ids[:45])  # the same ids again: still the same sequence
    assert len(spy.sessions) == 1 and spy.sessions[0]["fed"] == ids[39:45].tolist()
    model(ids[:30])  # shorter: a new sequence
    edited = ids[:50].copy()
    edited[10] = 5
    model(edited)  # same length class, different content: a new sequence
    assert len(spy.sessions) == 3 and [s["closed"] for s in spy.sessions] == [True, True, False]
    assert spy.sessions[2]["prompt"] == edited[:49].tolist() and spy.sessions[2]["fed"] == [int(edited[49])]
    model.finish()
    assert spy.sessions[2]["closed"] and model.stats["sessions"] == 3


def test_the_array_is_only_read():
    model = draft_class()(step_cost=FLAT)
    prompt, answer = copy_edit(seed=3)
    ids = np.array(prompt + answer[:30], np.intc)
    ids.setflags(write=False)  # any write would raise
    d = model(ids)
    assert d.dtype == np.intc and len(d) > 0 and d.tolist() == answer[30 : 30 + len(d)]
    assert model(np.asarray(ids, np.int64)).tolist() == d.tolist()  # other integer arrays too
    assert model(np.zeros(0, np.intc)).shape == (0,)
    with pytest.raises(BadInputError):
        model(np.zeros((2, 3), np.intc))
    with pytest.raises(BadInputError, match="temperature") as refused:  # an unknown keyword is refused by name
        model(ids, temperature=0.5)
    assert refused.value.param == "temperature"


def test_fixed_costs_choose_the_draft_length():
    prompt, answer = copy_edit(seed=4)
    free = draft_class()(step_cost=FLAT, max_draft=6)
    FakeLlama().generate(free, prompt, answer)
    steep = draft_class()(step_cost=STEEP, max_draft=6)
    llama = FakeLlama()
    out, evals = llama.generate(steep, prompt, answer)
    assert out == answer and evals == len(answer)  # no drafted token pays for a whole evaluation
    assert all(len(d) == 0 for d in llama.drafts)
    assert free.stats["draft_tokens"] > 0 and max(free.stats["draft_tokens"], 0) <= 6 * free.stats["calls"]


def measured_lengths(per_token, seed=5, rounds=4):
    clock = Clock()
    model = draft_class()(max_draft=8)
    real = adapter.time
    adapter.time = clock
    try:
        lengths = []
        for r in range(rounds):
            prompt, answer = copy_edit(seed=seed + r)
            llama = FakeLlama(clock=clock, base=0.02, per_token=per_token)
            llama.generate(model, prompt, answer)
            lengths += [len(d) for d in llama.drafts]
    finally:
        adapter.time = real
    return model, np.array(lengths)


def test_measured_step_cost_chooses_the_draft_length():
    cheap, cheap_lengths = measured_lengths(per_token=0.0002)  # a drafted token costs 1% of an evaluation
    dear, dear_lengths = measured_lengths(per_token=0.03)  # ... 150% of one
    assert cheap.stats["calls_measured"] > 50
    a, c = cheap.cost.line(1)
    assert a == pytest.approx(0.02, rel=0.1) and c < 0.002
    a, c = dear.cost.line(1)
    assert a == pytest.approx(0.02, rel=0.2) and c > 0.01  # measured when drafts vary
    tail = slice(len(cheap_lengths) // 2, None)
    assert cheap_lengths[tail].mean() > 4
    assert dear_lengths[len(dear_lengths) // 2 :].mean() < 0.5 * cheap_lengths[tail].mean()
