"""SuffixSpecProposer against a fake of vLLM's custom_class calling convention (no vLLM needed).

The fake (`FakeEngine`) keeps vLLM's persistent batch as the proposer sees it: `token_ids_cpu`
rows holding prompt + output with stale tokens beyond `num_tokens_no_spec` (the rejected drafts
and older garbage), rows that are empty for steps of a partial prefill, requests that finish
(their rows condensed: the last rows fill the holes, as `InputBatch.condense` does), rows swapped,
and requests left out of a step (pipeline-parallel microbatching: removed from the batch, back
later in another row). Each request's "model" answers a fixed greedy continuation; a step accepts
the longest draft prefix that equals it, plus one bonus token.
"""

import subprocess
import sys
import tracemalloc
from types import SimpleNamespace as NS

import numpy as np
import pytest

from suffixspec import BadInputError, BadInputTypeError, Document, Proposer, build_index
from suffixspec.integrations.vllm import SuffixSpecProposer, path_values

from support.vllm_requests import VOCAB, Request, brute_best_path, copy_requests

FREE = [[1, 1.0], [10**9, 1.0 + 1e-9]]  # a step costs the same whatever it verifies: no cut


def config(k=8, max_model_len=2048, max_num_seqs=8, vocab=VOCAB, spec=None, **opts):
    spec = spec or NS(num_speculative_tokens=k)
    return NS(speculative_config=spec, model_config=NS(max_model_len=max_model_len, get_vocab_size=lambda: vocab),
              scheduler_config=NS(max_num_seqs=max_num_seqs), additional_config={"suffixspec": opts} if opts else None)


class FakeEngine:
    """vLLM's persistent input batch and one step's bookkeeping, as the proposer sees them."""

    def __init__(self, proposer, rows=8, max_model_len=2048, seed=0, garbage=True, record=True):
        self.p = proposer
        self.record = record
        self.rng = np.random.default_rng(seed)
        self.tokens = self.rng.integers(0, VOCAB, (rows, max_model_len)).astype(np.int32) if garbage else np.zeros((rows, max_model_len), np.int32)
        self.n = np.zeros(rows, np.int32)
        self.rows: list[Request | None] = [None] * rows
        self.log = []  # (request id, row content before the step's drafts, draft) per drafted row and step

    def add(self, req):
        row = self.rows.index(None)
        self.rows[row] = req
        content = req.content
        self.tokens[row, : len(content)] = content
        self.n[row] = len(content)
        return row

    def remove(self, req):
        row = self.rows.index(req)
        self.rows[row] = None
        self.tokens[row, : self.n[row]] = self.rng.integers(0, VOCAB, int(self.n[row]))  # stale, not cleared
        return row

    def condense(self):
        """Fill holes with the last occupied rows (InputBatch.condense)."""
        while None in self.rows:
            hole = self.rows.index(None)
            last = max((i for i, r in enumerate(self.rows) if r is not None), default=-1)
            if last < hole:
                return
            self.rows[hole], self.rows[last] = self.rows[last], None
            self.tokens[[hole, last]] = self.tokens[[last, hole]]
            self.n[[hole, last]] = self.n[[last, hole]]

    def swap(self, a, b):
        self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
        self.tokens[[a, b]] = self.tokens[[b, a]]
        self.n[[a, b]] = self.n[[b, a]]

    def step(self, skip=()):
        """One engine step over the rows' requests (those in `skip` sample nothing), then propose."""
        sampled = [[] for _ in self.rows]
        for row, req in enumerate(self.rows):
            if req is None or req in skip:
                continue
            if req.prefill_left > 0:
                req.prefill_left -= 1
                if req.prefill_left > 0:
                    continue  # partial prefill: nothing sampled
                out = req.answer[:1]
            else:
                g = req.generated
                d = req.draft
                self.tokens[row, self.n[row] : self.n[row] + len(d)] = d  # vLLM writes the drafts past the valid tokens
                acc = 0
                while acc < len(d) and g + acc < len(req.answer) and d[acc] == req.answer[g + acc]:
                    acc += 1
                out = req.answer[g : g + acc + 1]
            req.generated += len(out)
            n = int(self.n[row])
            self.tokens[row, n : n + len(out)] = out
            self.n[row] = n + len(out)
            sampled[row] = out
        drafts = self.p.propose(sampled, self.n, self.tokens)
        assert isinstance(drafts, list) and len(drafts) == len(self.rows)
        for row, (req, d) in enumerate(zip(self.rows, drafts)):
            assert isinstance(d, list) and all(type(t) is int for t in d), d
            assert len(d) <= self.p.k
            if req is None or not sampled[row]:
                assert d == [], (row, d)
                continue
            if self.record:
                self.log.append((req.rid, list(self.tokens[row, : self.n[row]]), d))
            req.draft = d
        return drafts


def reference_draft(content, p: SuffixSpecProposer, ref: Proposer, max_model_len=2048):
    """What the proposer must draft for a row holding `content`, computed from scratch: a tree of
    `ref` (our own knobs, no response cache) over the same tokens, its best path by enumeration."""
    s = ref.start(content)
    tree = s.propose(p.max_nodes)
    s.close()
    return brute_best_path(tree, min(p.k, max_model_len - len(content) - 1))


def run(engine, requests, rng, max_steps=5000, skip_prob=0.0, swap_prob=0.0, max_active=None):
    pending = list(requests)
    active: list[Request] = []
    absent: dict[Request, int] = {}
    rows = len(engine.rows)
    max_active = max_active or rows
    for _ in range(max_steps):
        for req in [r for r in active if r.done]:
            engine.remove(req)
            active.remove(req)
        for req, back in list(absent.items()):
            if back <= 0 and None in engine.rows:
                engine.add(req)
                req.draft = []  # its drafts did not survive the absence
                del absent[req]
                active.append(req)
            else:
                absent[req] = back - 1
        engine.condense()
        while pending and len(active) + len(absent) < max_active and None in engine.rows:
            req = pending.pop(0)
            engine.add(req)
            active.append(req)
        if not active and not absent and not pending:
            return
        if skip_prob:
            for req in list(active):
                if req.prefill_left == 0 and not req.done and rng.random() < skip_prob:
                    engine.remove(req)
                    active.remove(req)
                    absent[req] = int(rng.integers(0, 3))
            engine.condense()
        if swap_prob and rng.random() < swap_prob:
            a, b = rng.integers(0, rows, 2)
            engine.swap(int(a), int(b))
        engine.step()
    raise AssertionError("requests did not finish")


def test_import_imports_neither_vllm_nor_torch():
    code = ("import sys, suffixspec.integrations.vllm as m; bad = [x for x in sys.modules if x.split('.')[0] in ('vllm', 'torch', 'transformers')]; "
            "assert not bad, bad; assert m.SuffixSpecProposer")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("garbage", [True, False])
def test_drafts_are_the_best_path_of_our_tree_through_moves_skips_and_stale_tails(garbage):
    """Rows move (condense, swaps), requests skip steps and come back elsewhere, tails are stale:
    every draft equals the best path, found by enumeration, of a fresh tree over the row's tokens,
    and no request ever needs a second session."""
    p = SuffixSpecProposer(config(global_cache=False, step_cost=FREE, session_timeout_steps=8))
    rng = np.random.default_rng(1)
    requests = copy_requests(14, seed=2)
    engine = FakeEngine(p, rows=6, seed=3, garbage=garbage)
    run(engine, requests, rng, skip_prob=0.15, swap_prob=0.3, max_active=5)
    assert len(engine.log) > 100
    ref = Proposer(**p.knobs)
    mismatches = [(rid, d, want) for rid, content, d in engine.log if d != (want := reference_draft(content, p, ref))]
    assert not mismatches, mismatches[:3]
    assert p.stats["sessions_started"] == len(requests)
    assert p.stats["sessions_refound"] > 0  # the moves and skips were recognised by content
    accepted = sum(len(r.answer) for r in requests) - p.stats["steps"]
    assert p.stats["draft_tokens"] > 0 and accepted > 0


def test_one_step_absence_keeps_the_session_and_a_timeout_closes_it():
    p = SuffixSpecProposer(config(session_timeout_steps=3))
    engine = FakeEngine(p, rows=2)
    a, b = copy_requests(2, seed=5, answer_len=200)
    engine.add(a)
    engine.add(b)
    for _ in range(3):
        engine.step()
    engine.step(skip={a})  # a is left out of one step...
    engine.step()  # ...and continues
    assert p.stats["sessions_started"] == 2 and p.stats["sessions_closed"] == 0
    engine.remove(a)
    engine.condense()
    assert engine.rows[0] is b
    for _ in range(2):
        engine.step()
    assert p.stats["sessions_closed"] == 0 and p.live_sessions == 2
    engine.step()  # a unseen for 3 steps: closed, its output joins the response cache
    assert p.stats["sessions_closed"] == 1 and p.live_sessions == 1
    p.flush()  # closed on the background thread
    assert len(p.proposer.cache) >= a.generated
    engine.add(a)  # back after its session closed: a new session over all it holds
    engine.step()
    assert p.stats["sessions_started"] == 3


@pytest.mark.parametrize("background", [True, False])
def test_closed_output_is_drafted_for_a_later_request(background):
    p = SuffixSpecProposer(config(session_timeout_steps=2, step_cost=FREE, close_in_background=background))
    engine = FakeEngine(p, rows=2)
    first = Request(0, list(range(1, 30)), list(range(500, 560)))
    engine.add(first)
    while not first.done:
        engine.step()
    engine.remove(first)
    for _ in range(3):
        engine.step()  # no rows: the session times out
    assert p.stats["sessions_closed"] == 1
    if background:
        p.flush()
    assert len(p.proposer.cache) == len(first.answer)
    second = Request(1, list(range(40, 70)) + [500, 501, 502], list(range(503, 560)))
    engine.add(second)
    engine.step()  # its prefill samples 503
    assert engine.log[-1][2] == list(range(504, 512))  # drafted from the closed request's output



@pytest.mark.parametrize("timeout", [None, 64])
def test_default_timeout_closes_a_finished_request_within_two_steps_for_the_next_to_draft_from(timeout):
    """One row, requests one after another (vLLM <= 0.33 says nothing when a request finishes): by
    default the finished request's session closes once unseen for two steps and the next request
    drafts from its output; a timeout of 64 steps keeps it out of the cache meanwhile."""
    opts = {} if timeout is None else {"session_timeout_steps": timeout}
    p = SuffixSpecProposer(config(step_cost=FREE, close_in_background=False, **opts))
    assert p.timeout == (2 if timeout is None else 64)
    engine = FakeEngine(p, rows=1)
    first = Request(0, list(range(1, 30)), list(range(500, 600)))
    engine.add(first)
    while not first.done:
        engine.step()
    engine.remove(first)
    second = Request(1, list(range(40, 70)), list(range(500, 600)))
    engine.add(second)
    engine.step()  # its prefill samples 500: the first request unseen for one step
    assert p.stats["sessions_closed"] == 0
    engine.step()  # drafted nothing, one token more; the first request unseen for two steps
    closed = timeout is None
    assert p.stats["sessions_closed"] == int(closed) and p.live_sessions == 2 - int(closed)
    assert engine.log[-1][2] == (list(range(502, 510)) if closed else [])  # from the first request's output


def test_a_request_back_after_its_session_closed_raises_the_default_timeout():
    """A request left out of steps (pipeline-parallel microbatches, preemption) and back with only the
    step's sampled tokens added: the first time its session was closed too soon and starts anew,
    the timeout then outlasts such absences (twice the longest), and later absences keep it."""
    p = SuffixSpecProposer(config())
    engine = FakeEngine(p, rows=2)
    a, b = copy_requests(2, seed=5, answer_len=300)
    engine.add(a)
    engine.add(b)
    for _ in range(3):
        engine.step()
    engine.step(skip={a})  # one step away: kept, and the timeout now outlasts it
    engine.step()
    assert p.stats["sessions_closed"] == 0 and p.timeout == 4
    for _ in range(4):
        engine.step(skip={a})  # four steps away: closed after four
    assert p.stats["sessions_closed"] == 1
    engine.step()  # back: a new session over what it holds, and the close is known to be too soon
    assert p.stats["sessions_started"] == 3 and p.stats["sessions_closed_too_soon"] == 1
    assert p.timeout == 2 * (4 + 1) == p.stats["session_timeout"]
    for _ in range(9):
        engine.step(skip={a})
    engine.step()
    assert p.stats["sessions_started"] == 3 and p.stats["sessions_closed"] == 1 and p.timeout == 20


def test_a_new_turn_extending_a_closed_conversation_keeps_the_default_timeout():
    p = SuffixSpecProposer(config(close_in_background=False))
    engine = FakeEngine(p, rows=1)
    (first,) = copy_requests(1, seed=7, answer_len=60)
    engine.add(first)
    while not first.done:
        engine.step()
    engine.remove(first)
    engine.step()
    engine.step()
    assert p.stats["sessions_closed"] == 1
    turn = Request(1, first.prompt + first.answer + [7, 8, 9], [10, 11, 12, 13] * 5)
    engine.add(turn)
    for _ in range(4):
        engine.step()
    assert p.timeout == 2 and not p.stats["sessions_closed_too_soon"]
    assert p.stats["sessions_started"] == 2

def test_empty_sampled_rows_and_rows_at_max_model_len():
    p = SuffixSpecProposer(config(k=8, max_model_len=64, step_cost=FREE))
    tokens = np.zeros((3, 64), np.int32)
    text = list(range(1, 20)) * 4
    tokens[0, :60] = text[:60]
    tokens[1, :40] = text[:40]
    tokens[2, :30] = text[:30]
    n = np.array([60, 40, 30], np.int32)
    drafts = p.propose([[text[59]], [], [text[29]]], n, tokens)
    assert drafts[1] == []  # partial prefill: nothing
    assert len(drafts[0]) == 64 - 60 - 1  # the room left before max_model_len
    assert drafts[0] == text[60:63] and drafts[2] == text[30:38]
    tokens[0, :63] = text[:63]
    assert p.propose([[1]], np.array([63], np.int32), tokens) == [[]]  # no room at all
    assert p.propose([], n, tokens) == []


def test_tokens_outside_the_vocabulary_are_never_drafted():
    p = SuffixSpecProposer(config(vocab=100, step_cost=FREE))
    text = [5, 6, 7, 150, 8, 9] * 5  # the prompt holds ids the model's vocabulary lacks
    tokens = np.zeros((1, 2048), np.int32)
    tokens[0, :12] = text[:12]
    d = p.propose([[text[11]]], np.array([12], np.int32), tokens)[0]
    assert d == [5, 6, 7]  # cut before 150


def test_thousands_of_requests_memory_stays_flat():
    p = SuffixSpecProposer(config(max_sessions=48, session_timeout_steps=4, cache_tokens=1 << 11, cache_generations=2))
    rng = np.random.default_rng(7)
    engine = FakeEngine(p, rows=16, max_model_len=256, record=False)
    tracemalloc.start()
    try:
        run(engine, copy_requests(500, seed=8, prompt_len=24, answer_len=8), rng, max_steps=100000, skip_prob=0.05)
        for _ in range(5):
            engine.step()
        p.flush()
        base = tracemalloc.get_traced_memory()[0]
        run(engine, copy_requests(1500, seed=9, prompt_len=24, answer_len=8), rng, max_steps=100000, skip_prob=0.05)
        for _ in range(5):
            engine.step()
        p.flush()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert p.live_sessions <= 48
    assert p.stats["sessions_started"] >= 2000
    assert len(p.proposer.cache) <= 1 << 11
    assert grown < 1 << 20, f"memory grew by {grown} bytes over 1500 requests"


def test_drafts_shrink_as_the_batch_grows():
    cpu_like = [[1, 1.0], [16, 1.7], [64, 3.9]]
    text = np.random.default_rng(0).integers(1, VOCAB, 50)
    noisy = np.concatenate([text, text[:20], [7], text[21:40], [9], text[41:]])  # a copy with edits: weaker matches

    def mean_draft(batch):
        p = SuffixSpecProposer(config(k=8, max_num_seqs=batch, step_cost=cpu_like))
        tokens = np.tile(np.concatenate([noisy, np.zeros(200, int)]).astype(np.int32), (batch, 1))
        tokens[:, 0] = np.arange(batch)  # distinct requests
        n = np.full(batch, 80, np.int32)
        drafts = p.propose([[int(tokens[0, 79])]] * batch, n, tokens)
        return np.mean([len(d) for d in drafts])

    one, many = mean_draft(1), mean_draft(64)
    assert one >= 4 and many < one, (one, many)


def test_options_and_vllm_fields():
    @__import__("dataclasses").dataclass
    class Spec:  # vLLM's SpeculativeConfig fields this proposer reads, with vLLM's defaults
        num_speculative_tokens: int = 8
        suffix_decoding_max_tree_depth: int = 24
        suffix_decoding_min_token_prob: float = 0.1

    p = SuffixSpecProposer(config(spec=Spec()))
    assert p.knobs["max_depth"] == 8 and p.knobs["min_prob"] == 0.0 and p.max_nodes == 32  # defaults: not mapped
    assert p.knobs["recency"] == 0.0
    p = SuffixSpecProposer(config(spec=Spec(suffix_decoding_max_tree_depth=5, suffix_decoding_min_token_prob=0.3)))
    assert p.knobs["max_depth"] == 5 and p.knobs["min_prob"] == 0.3
    p = SuffixSpecProposer(config(spec=Spec(suffix_decoding_min_token_prob=0.3), min_prob=0.05, max_nodes=12, recency=0.25))
    assert p.knobs["min_prob"] == 0.05 and p.max_nodes == 12 and p.knobs["recency"] == 0.25
    with pytest.raises(BadInputError, match="unknown option 'corpora'.*expected one of"):
        SuffixSpecProposer(config(corpora=["x"]))
    with pytest.raises(BadInputTypeError, match="max_nodes.*expected int, got '8'"):
        SuffixSpecProposer(config(max_nodes="8"))
    with pytest.raises(BadInputError, match="needs a \"corpus\""):
        SuffixSpecProposer(config(filter={"repo": "x"}))
    with pytest.raises(BadInputError, match="num_speculative_tokens: expected a positive int, got 0"):
        SuffixSpecProposer(config(k=0))
    with pytest.raises(BadInputError, match="^session_timeout_steps: expected an integer >= 2, got 1"):
        SuffixSpecProposer(config(session_timeout_steps=1))
    with pytest.raises(BadInputError, match="^max_sessions: expected a positive integer, got 0"):
        SuffixSpecProposer(config(max_sessions=0))
    with pytest.raises(BadInputError, match="step_cost"):
        SuffixSpecProposer(config(step_cost=[[4, 2.0], [8, 1.0]]))
    with pytest.raises(BadInputError, match="token_ids_cpu"):
        p.propose([[1], [2]], np.zeros(1, np.int32), np.zeros((1, 16), np.int32))
    p.load_model(object(), anything=1)  # vLLM's CPU runner calls it with the target model


def test_the_option_table_is_the_proposer_config_plus_the_adapters_own():
    """`OPTIONS` is derived from `ProposerConfig`'s fields (names, types, docs, defaults), never a
    second list: every knob but those not taken, with the adapter's defaults where they differ."""
    import dataclasses

    from suffixspec import ProposerConfig
    from suffixspec.draft.config import KNOBS
    from suffixspec.integrations.vllm import ADAPTER_OPTIONS, KNOB_DEFAULTS, KNOBS_NOT_TAKEN, OPTIONS

    fields = {f.name: f for f in dataclasses.fields(ProposerConfig)}
    assert set(KNOBS_NOT_TAKEN) <= set(fields) and set(KNOB_DEFAULTS) <= set(fields)
    assert not set(ADAPTER_OPTIONS) & set(fields)
    assert list(OPTIONS) == [n for n in fields if n not in KNOBS_NOT_TAKEN] + list(ADAPTER_OPTIONS)
    for name in OPTIONS.keys() - ADAPTER_OPTIONS.keys():
        f, option = fields[name], OPTIONS[name]
        assert option.doc == f.metadata["doc"] == KNOBS[name].doc
        assert option.default == KNOB_DEFAULTS.get(name, f.default)
        kind = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}[f.type.partition(" | ")[0]]
        assert option.types == kind + ((type(None),) if f.type.endswith("| None") else ())


def test_every_knob_reaches_the_proposer():
    """A knob given as an option is the proposer's; a bad value is refused by the config, by name."""
    p = SuffixSpecProposer(config(threads=2, learn=False, prior_strength=3, cache_upkeep="background", max_depth=50,
                                  global_cache=False, resync_tokens=77))
    cfg = p.proposer.config
    assert cfg is p.config and (cfg.threads, cfg.learn, cfg.prior_strength, cfg.cache_upkeep) == (2, False, 3.0, "background")
    assert (cfg.max_depth, cfg.max_nodes, cfg.recency, cfg.resync_tokens) == (8, 32, 0.0, 77)  # the adapter's defaults
    assert p.knobs["prior_strength"] == 3.0 and "vocab_size" not in p.knobs
    with pytest.raises(BadInputError, match="^match_levels: expected a positive integer, got 0"):
        SuffixSpecProposer(config(match_levels=0))
    with pytest.raises(BadInputError, match="^max_nodes: expected a positive integer, got 0"):
        SuffixSpecProposer(config(max_nodes=0))
    with pytest.raises(BadInputTypeError, match=r'\["learn"\].*expected bool, got 1'):
        SuffixSpecProposer(config(learn=1))
    with pytest.raises(BadInputError, match="unknown option 'vocab_size'"):
        SuffixSpecProposer(config(vocab_size=100))


def test_corpus_and_filter(tmp_path):
    docs = [Document(np.array(list(range(100, 140)), np.int32), id="a", tags={"repo": "one"}),
            Document(np.array(list(range(100, 110)) + list(range(300, 330)), np.int32), id="b", tags={"repo": "two"})]
    build_index(docs, tmp_path / "ix", tokenizer={"name": "toy", "vocab_size": VOCAB, "fingerprint": "f" * 64})
    row = np.zeros((1, 2048), np.int32)
    row[0, :6] = [1, 2, 3, 107, 108, 109]
    n = np.array([6], np.int32)
    plain = SuffixSpecProposer(config(step_cost=FREE))
    assert plain.propose([[109]], n, row) == [[]]  # nothing to copy from without the corpus
    both = SuffixSpecProposer(config(step_cost=FREE, corpus=str(tmp_path / "ix")))
    assert both.propose([[109]], n, row)[0][:1] in ([110], [300])
    one = SuffixSpecProposer(config(step_cost=FREE, corpus=[str(tmp_path / "ix")], filter={"repo": "one"}))
    assert one.propose([[109]], n, row)[0] == list(range(110, 118))
    two = SuffixSpecProposer(config(step_cost=FREE, corpus=[str(tmp_path / "ix")], filter={"repo": "two"}))
    assert two.propose([[109]], n, row)[0] == list(range(300, 308))


def test_warm_up_compiles_the_path_kernel():
    SuffixSpecProposer(config())
    assert path_values.signatures  # compiled in __init__, not on the first step


def test_the_step_cost_is_measured_from_the_time_between_calls(monkeypatch):
    """Each pure decode step is observed once: the time from the end of the last `propose` to the
    start of this one, the rows' last drafts plus their bonus tokens, the rows; steps with a prefill
    or a request joining are not."""
    p = SuffixSpecProposer(config(k=4))
    now = [0.0]
    p.core.clock = lambda: now[0]
    seen = []
    monkeypatch.setattr(p.core.cost, "observe", lambda tokens, seconds, batch: seen.append((tokens, round(seconds, 9), batch)))
    engine = FakeEngine(p, rows=2)
    a, b = copy_requests(2, seed=21, answer_len=120)
    a.prefill_left = b.prefill_left = 1
    engine.add(a)
    engine.add(b)
    want = []
    for i in range(12):
        verified = sum(1 + len(r.draft) for r in (a, b))
        now[0] += 0.01 * verified  # the engine's step: what it verified costs time
        pure = i > 0
        engine.step()
        if pure:
            want.append((verified, round(0.01 * verified, 9), 2))
    assert seen == want and p.stats["steps_measured"] == 11
    assert any(t > 2 for t, _, _ in seen)  # drafts were verified
