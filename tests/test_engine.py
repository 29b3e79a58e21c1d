"""The continuous-batching engine: joins and leaves between rounds, identity with batch-1 decoding,
sampling keys, bad options, prefill groups, cancellation, failure isolation, time accounting, finished
requests' sessions closed together."""

from collections import Counter

import pytest

from suffixspec.draft.proposer import Proposer
from suffixspec.draft.response_cache import ResponseCache
from suffixspec.draft.tree import DraftTree
from suffixspec.engine.budget import CostModel
from suffixspec.engine.fallback import PromptLookupProposer
from suffixspec.errors import BadInputError
from suffixspec.generate import SpeculativeGenerator

from support.prompts import NEW, VOCAB, prompts_for
from support.tiny_models import StandInProposer, hf_generate, oracle_proposer, random_tree_proposer, tiny_model


def serve_all(gen, prompts, limits, steps_before_join=3, late=(), **options):
    """Serve `prompts` (output limits cycling through `limits`) on `gen.serve(**options)`; the `late`
    prompts join after `steps_before_join` steps (mid-flight). Returns the result and the steps."""
    server = gen.serve(**options)
    for i, p in enumerate(prompts):
        server.add(p, max_new_tokens=limits[i % len(limits)])
    steps = []
    while not server.idle or late:
        if len(steps) == steps_before_join and late:
            for p in late:
                server.add(p)
            late = ()
        steps.append(server.step())
    return server.result(), steps


@pytest.mark.parametrize("budget,drafts", [(0, None), (8, "oracle"), ("auto", "junk")])
def test_continuous_batching_greedy_equals_batch_one(family, budget, drafts):
    kind, model, prompts, refs = family
    late = prompts_for(seed=11, lengths=(3, 21))
    refs = {**refs, **{tuple(p): hf_generate(model, p, NEW) for p in late}}
    proposer = {None: None, "oracle": lambda: oracle_proposer(refs, VOCAB, junk=2),
                "junk": lambda: random_tree_proposer(VOCAB)}[drafts]
    gen = SpeculativeGenerator(model, proposer=proposer() if proposer else PromptLookupProposer(),
                               cost_model=CostModel([1, 1024], [1.0, 1.0]))
    # output limits differ, so requests finish at different rounds and freed slots refill mid-flight
    limits = (NEW, 7, 13, 2)
    res, steps = serve_all(gen, prompts, limits, late=late, max_new_tokens=NEW, budget=budget, max_batch=3)
    everything = prompts + late
    wanted = [limits[i % 4] for i in range(len(prompts))] + [NEW] * len(late)
    assert res.sequences == [refs[tuple(p)][:n] for p, n in zip(everything, wanted)]
    assert all(len(s.admitted) <= 3 for s in steps)
    admitted = [q for s in steps for q in s.admitted]
    assert admitted == list(range(len(everything)))  # FIFO, each request once
    for rs, n in zip(res.stats.requests, wanted):
        assert sum(rs.committed_per_round) == rs.new_tokens == n and rs.finish_reason == "length"


def test_continuous_batching_refills_a_freed_slot_at_once():
    model = tiny_model("llama")
    prompts = prompts_for(lengths=(4, 9, 2, 6, 13))
    gen = SpeculativeGenerator(model, proposer=PromptLookupProposer())
    server = gen.serve(max_new_tokens=6, budget=0, max_batch=2)
    limits = [2, 6, 3, 6, 1]
    for p, n in zip(prompts, limits):
        server.add(p, max_new_tokens=n)
    log = []
    while not server.idle:
        step = server.step()
        log.append((step.admitted, sorted((e.index, len(e.tokens), e.finish_reason) for e in step.events), server.running))
    # plain decoding, one token a round; a step either admits into the free slots (a newcomer's
    # prefill is its first round, alone in its step) or runs the batch's round, never two admissions
    # in a row while requests run
    assert log[0] == ([0, 1], [(0, 1, ""), (1, 1, "")], 2)
    assert log[1] == ([], [(0, 1, "length"), (1, 1, "")], 1)
    assert log[2] == ([2], [(2, 1, "")], 2)  # request 0's slot refilled at the next step
    assert log[3] == ([], [(1, 1, ""), (2, 1, "")], 2)
    assert log[4] == ([], [(1, 1, ""), (2, 1, "length")], 1)
    assert log[5] == ([3], [(3, 1, "")], 2)
    assert log[6] == ([], [(1, 1, ""), (3, 1, "")], 2)
    assert log[7] == ([], [(1, 1, "length"), (3, 1, "")], 1)
    assert log[8] == ([4], [(4, 1, "length")], 1)  # a limit of 1: done in its prefill
    assert log[9:] == [([], [(3, 1, "")], 1), ([], [(3, 1, "")], 1), ([], [(3, 1, "length")], 0)]
    assert server.result().sequences == [hf_generate(model, p, n) for p, n in zip(prompts, limits)]
    st = server.result().stats
    assert [r.new_tokens for r in st.requests] == limits
    assert st.requests[0].queue_s == pytest.approx(0.0, abs=0.05) and st.requests[2].queue_s > 0
    assert all(0 < r.ttft_s <= r.e2e_s for r in st.requests)


def test_continuous_batching_sampling_keys_follow_the_request():
    model = tiny_model("qwen2", sharpen=3.0)
    prompts = prompts_for(2, lengths=(5, 17, 1, 9, 3))
    gen = SpeculativeGenerator(model, proposer=PromptLookupProposer())
    together = gen.generate(prompts, max_new_tokens=12, do_sample=True, seed=5, budget=0).sequences
    refs = {tuple(p): s for p, s in zip(prompts, together)}
    spec = SpeculativeGenerator(model, proposer=oracle_proposer(refs, VOCAB, junk=2))
    two_at_a_time = spec.generate(prompts, max_new_tokens=12, do_sample=True, seed=5, budget=6, max_batch=2)
    assert two_at_a_time.sequences == together
    assert two_at_a_time.stats.drafted > 0


def test_server_is_the_alias_of_engine_kept_for_this_release():
    import suffixspec
    from suffixspec.engine.engine import Engine, Server

    assert suffixspec.Server is suffixspec.Engine is Engine is Server
    assert {"Engine", "Server"} <= set(suffixspec.__all__)
    gen = SpeculativeGenerator(tiny_model("llama"), proposer=PromptLookupProposer())
    assert isinstance(gen.serve(max_new_tokens=4, budget=0), suffixspec.Engine)


def test_serve_rejects_bad_options():
    gen = SpeculativeGenerator(tiny_model("llama"), proposer=PromptLookupProposer())
    with pytest.raises(BadInputError, match="max_batch"):
        gen.serve(max_batch=0)
    with pytest.raises(BadInputError, match="budget"):
        gen.serve(budget="many")
    server = gen.serve(max_new_tokens=4, budget=0)
    with pytest.raises(BadInputError) as err:
        server.add([])
    assert err.value.param == "prompt"
    vocab = gen.model.get_input_embeddings().weight.shape[0]
    for bad, kwargs, param in [([vocab], {}, "prompt"), ([1] * 5000, {"max_new_tokens": 4000}, "prompt"),
                               ([1], {"prediction": [-3]}, "prediction"), ([1], {"key": -1}, "key"),
                               ([1], {"max_new_tokens": -1}, "max_new_tokens")]:
        with pytest.raises(BadInputError) as err:
            server.add(bad, **kwargs)
        assert err.value.param == param, (bad, kwargs)
    assert server.add([1, 2], max_new_tokens=0) == 0 and server.idle
    assert server.result().sequences == [[]]
    with pytest.raises(BadInputError) as err:
        server.release(server.add([1, 2]))
    assert err.value.param == "index" and "has not finished" in str(err.value)


def test_prefill_groups_bound_the_padding():
    from suffixspec.engine.lifecycle import Request
    from suffixspec.engine.prefill import prefill_groups

    lives = [Request(i, i, 8, None, "auto", [1] * n, [1] * n) for i, n in enumerate((10, 11, 100, 12, 90))]
    assert [[lv.index for lv in g] for g in prefill_groups(lives)] == [[0, 1, 3], [4, 2]]
    assert [len(g) for g in prefill_groups(lives, waste=10.0)] == [5]


# ------------------------------------------------------------------------------------ time accounting


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_time_is_charged_to_proposer_budget_and_verifier_apart():
    """A model whose passes cost 10 units, a proposer whose proposals cost 1 and extensions 0.5, a
    budget policy whose decisions cost 0.25 and whose learning costs 0.125: each statistic holds
    exactly its own part (the automatic budget's time once fell into verifier_s)."""
    from suffixspec.engine.budget import BudgetPolicy

    clock = FakeClock()
    model = tiny_model("llama")
    prompts = prompts_for()
    refs = {tuple(p): hf_generate(model, p, NEW) for p in prompts}
    inner = oracle_proposer(refs, VOCAB)
    calls = {"propose": 0, "extend": 0, "size": 0, "learn": 0, "passes": 0}

    class CostlyProposer:
        def start(self, prompt_ids, request_id=None, filter=None):
            return CostlySession(inner.start(prompt_ids, request_id, filter))

    class CostlySession:
        def __init__(self, s):
            self.s = s

        def propose(self, budget):
            calls["propose"] += 1
            clock.t += 1.0
            return self.s.propose(budget)

        def extend(self, tokens):
            calls["extend"] += 1
            clock.t += 0.5
            self.s.extend(tokens)

        def close(self):
            self.s.close()

    class CostlyPolicy(BudgetPolicy):
        def size_round(self, *args, **kwargs):
            calls["size"] += 1
            clock.t += 0.25
            return super().size_round(*args, **kwargs)

        def learn(self, *args, **kwargs):
            calls["learn"] += 1
            clock.t += 0.125
            return super().learn(*args, **kwargs)

    def pass_cost(module, args, kwargs):
        calls["passes"] += 1
        clock.t += 10.0

    gen = SpeculativeGenerator(model, proposer=CostlyProposer(),
                               policy=CostlyPolicy(cost_model=CostModel([1, 1024], [1.0, 1.01])))
    gen.check_support()  # the self-check's passes happen before the run
    handle = model.register_forward_pre_hook(pass_cost, with_kwargs=True)
    try:
        server = gen.serve(max_new_tokens=NEW, max_batch=2, clock=clock)
        for p in prompts:
            server.add(p)
        res = server.run()
    finally:
        handle.remove()
    st = res.stats
    assert res.sequences == [refs[tuple(p)] for p in prompts]
    assert calls["passes"] == st.rounds > 0 and calls["size"] > 0 and calls["learn"] > 0
    assert st.verifier_s == pytest.approx(10.0 * calls["passes"])
    assert st.proposer_s == pytest.approx(1.0 * calls["propose"] + 0.5 * calls["extend"])
    assert st.budget_s == pytest.approx(0.25 * calls["size"] + 0.125 * calls["learn"])
    assert st.e2e_s == pytest.approx(st.verifier_s + st.proposer_s + st.budget_s)


# ------------------------------------------------------------------------------------ per-request control


def test_cancel_frees_the_slot_within_one_step():
    model = tiny_model("llama")
    prompts = prompts_for()
    gen = SpeculativeGenerator(model, proposer=PromptLookupProposer(), cost_model=CostModel([1, 1024], [1.0, 1.0]))
    server = gen.serve(max_new_tokens=NEW, max_batch=2)
    first, second, third = (server.add(p) for p in prompts[:3])
    server.step()
    assert server.running == 2 and server.waiting == 1
    assert server.cancel(first)
    step = server.step()
    assert (first, "cancelled") in [(e.index, e.finish_reason) for e in step.events]
    assert third in step.admitted and server.running == 2  # the freed slot went to the waiting request
    res = server.run()
    assert res.stats.requests[first].finish_reason == "cancelled"
    assert res.sequences[second] == hf_generate(model, prompts[1], NEW)
    assert res.sequences[third] == hf_generate(model, prompts[2], NEW)
    assert not server.cancel(second)  # finished: nothing to cancel


def test_a_failing_request_fails_alone():
    """One request whose logits processor raises in the middle of a shared round: it ends with
    finish reason "error" and its error recorded; the others' outputs equal a run without it."""
    from suffixspec.engine.options import DecodeOptions

    model = tiny_model("llama")
    prompts = prompts_for()
    refs = {tuple(p): hf_generate(model, p, NEW) for p in prompts}

    class Poison:
        def __init__(self):
            self.calls = 0

        def __call__(self, input_ids, scores):
            self.calls += 1
            if self.calls > 3:
                raise RuntimeError("poisoned processor")
            return scores

    for budget in (0, "auto"):
        gen = SpeculativeGenerator(model, proposer=oracle_proposer(refs, VOCAB),
                                   cost_model=CostModel([1, 1024], [1.0, 1.01]))
        server = gen.serve(max_new_tokens=NEW, budget=budget)
        good = [server.add(p) for p in prompts]
        bad = server.add(prompts[0], options=DecodeOptions(max_new_tokens=NEW, budget=budget,
                                                           logits_processor=[Poison()]))
        res = server.run()
        assert res.stats.requests[bad].finish_reason == "error"
        assert "poisoned processor" in res.stats.requests[bad].error
        assert [res.sequences[q] for q in good] == [refs[tuple(p)] for p in prompts]


def test_add_validates_against_the_model():
    model = tiny_model("llama")  # vocabulary 97, 512 positions
    server = SpeculativeGenerator(model, proposer=PromptLookupProposer()).serve(max_new_tokens=8, budget=0)
    with pytest.raises(BadInputError, match="vocabulary"):
        server.add([1, 2, 97])
    with pytest.raises(BadInputError, match="context of 512"):
        server.add([1] * 510, max_new_tokens=8)
    with pytest.raises(TypeError, match="max_new_tokens"):
        server.add([1, 2], max_new_tokens=2.5)
    assert server.idle  # nothing was queued


def test_per_request_options_equal_their_own_runs():
    """Greedy and seeded-sampling requests in one batch: each equals a run of its own."""
    from suffixspec.engine.options import DecodeOptions

    model = tiny_model("llama", sharpen=2.0)
    prompts = prompts_for()
    gen = SpeculativeGenerator(model, proposer=random_tree_proposer(VOCAB), cost_model=CostModel([1, 1024], [1.0, 1.0]))
    sampled = DecodeOptions(max_new_tokens=NEW, do_sample=True, temperature=0.8, top_k=20, seed=7, budget=4)
    server = gen.serve(max_new_tokens=NEW, budget=4)
    a = server.add(prompts[0])
    b = server.add(prompts[1], options=sampled, key=3)
    res = server.run()
    assert res.sequences[a] == hf_generate(model, prompts[0], NEW)
    alone = gen.serve(options=sampled)
    alone.add(prompts[1], key=3)
    assert res.sequences[b] == alone.run().sequences[0]


def test_a_prediction_is_drafted_first_and_never_changes_the_output():
    model = tiny_model("llama")
    prompt = prompts_for()[0]
    ref = hf_generate(model, prompt, NEW)

    nothing = StandInProposer(lambda session, budget: DraftTree.empty())  # the prediction is the only source
    gen = SpeculativeGenerator(model, proposer=nothing, cost_model=CostModel([1, 1024], [1.0, 1.0]))
    server = gen.serve(max_new_tokens=NEW, budget=16)
    right = server.add(prompt, prediction=ref)
    wrong = server.add(prompt, prediction=[(t + 1) % VOCAB for t in ref])
    edited = server.add(prompt, prediction=ref[:8] + [5, 5, 5] + ref[8:])  # an insertion to re-anchor past
    res = server.run()
    assert res.sequences[right] == res.sequences[wrong] == res.sequences[edited] == ref
    assert res.stats.requests[right].rounds <= 3  # (almost) whole rounds
    # counted as OpenAI does: prediction tokens the output kept, and the others
    assert server.prediction_counts(right) == (NEW, 0)
    assert server.prediction_counts(edited) == (NEW, 3)
    accepted, rejected = server.prediction_counts(wrong)
    assert accepted + rejected == NEW and accepted < NEW // 2
    assert res.stats.requests[edited].rounds < res.stats.requests[wrong].rounds


def test_release_forgets_a_finished_request():
    model = tiny_model("llama")
    server = SpeculativeGenerator(model, proposer=PromptLookupProposer()).serve(max_new_tokens=4, budget=0)
    q = server.add([1, 2, 3])
    with pytest.raises(BadInputError, match="not finished"):
        server.release(q)
    while not server.idle:
        server.step()
    assert len(server.output(q)) == 4
    server.release(q)
    assert server.result().sequences == [] and server.stats.requests == []


def test_the_server_filter_reaches_every_session_without_its_own():
    seen = []

    class Recording(StandInProposer):
        def start(self, prompt_ids, request_id=None, filter=None):
            seen.append(filter)
            return super().start(prompt_ids, request_id, filter)

    recording = Recording(lambda session, budget: DraftTree.empty())
    gen = SpeculativeGenerator(tiny_model("llama"), proposer=recording, cost_model=CostModel([1, 1024], [1.0, 1.0]))
    server = gen.serve(max_new_tokens=2, budget=4, filter={"repo": "a"})
    server.add([1, 2, 3])
    server.add([4, 5, 6], filter={"repo": "b"})
    server.run()
    assert seen == [{"repo": "a"}, {"repo": "b"}]


# ------------------------------------------------------------------------------------ drafting while off


def test_a_batch_that_stays_off_drafts_every_few_rounds_and_its_sessions_miss_nothing(monkeypatch):
    """A cost model under which no draft ever pays: the automatic rows' prefills (too short to carry
    a tree) neither propose nor open a session; from their first round the running batch's automatic
    rows propose on a thinning cadence (never two rounds in a row, never more than four rounds
    apart, about one round in four in all), a fixed-budget row proposes every round from its prefill
    on, every proposal sees the request's whole output so far, every session closes over the whole
    output, and the outputs equal plain decoding. (Drafting is taken to cost more than the cadence's
    share of any round, as it does next to a tiny model's passes.)"""
    import suffixspec.engine.budget as budget_mod
    from suffixspec.engine.options import DecodeOptions

    monkeypatch.setattr(budget_mod, "CADENCE_MAX_SHARE", 1e-12)

    model = tiny_model("llama")
    prompts = prompts_for()[:3]
    new = 40
    refs = [hf_generate(model, p, new) for p in prompts]
    step_no = [0]
    proposals: dict[int, list[int]] = {}  # request -> steps at which it was asked to draft
    closed: dict[int, list[int]] = {}

    def draft(session, budget):
        assert session.out == server.output(session.request_id)  # caught up before proposing
        proposals.setdefault(session.request_id, []).append(step_no[0])
        return DraftTree.from_paths([[1, 2, 3]], [0.9])

    proposer = StandInProposer(draft)
    # a prefill slack of 1%: the prompts' pass takes no drafts here (the cadence is what this test is about)
    gen = SpeculativeGenerator(model, proposer=proposer, cost_model=CostModel([1, 2, 1024], [1.0, 50.0, 5e4]),
                               prefill_slack=0.01)
    server = gen.serve(max_new_tokens=new, budget="auto")
    original_start = proposer.start

    opened: dict[int, int] = {}  # request -> step at which its session opened

    def start(prompt_ids, request_id=None, filter=None):
        opened[request_id] = step_no[0]
        session = original_start(prompt_ids, request_id, filter)
        original_close = session.close
        session.close = lambda: (closed.__setitem__(request_id, list(session.out)), original_close())
        return session

    proposer.start = start
    auto = [server.add(p, request_id=i) for i, p in enumerate(prompts[:2])]
    fixed = server.add(prompts[2], request_id=2, options=DecodeOptions(max_new_tokens=new, budget=4))
    while not server.idle:
        step_no[0] += 1
        server.step()
    res = server.result()
    assert res.sequences == refs
    server.close()  # the last sessions close here (no proposal came after them)
    assert closed == {i: refs[i] for i in range(3)}
    rounds = res.stats.requests[fixed].rounds
    # one round a step (the first is the prefill); the last round has one token left: no draft
    assert proposals[fixed] == list(range(1, rounds)), proposals[fixed]
    assert opened[fixed] == 1
    for q in auto:
        steps = proposals[q]
        assert opened[q] == steps[0] == 2  # the batch's first round drafts (a newcomer wakes the cadence)
        gaps = [b - a for a, b in zip(steps, steps[1:])]
        assert gaps and all(2 <= g <= 4 for g in gaps), steps
        assert len(steps) <= res.stats.requests[q].rounds // 4 + 4, steps


@pytest.mark.parametrize("draft_ms, every_round", [(0.1, True), (5.0, False)])
def test_a_quiet_batch_drafts_every_round_only_while_drafting_is_cheap(draft_ms, every_round):
    """On the engine's clock (a virtual one here: each forward pass takes 150 ms, each session's
    proposal `draft_ms`, nothing else any time), a quiet batch of two rows whose drafts never pay
    proposes at every round while drafting stays within the cadence's share (0.2 ms of a 150 ms round,
    0.13%, under 0.4%), so a copy that resumes is never missed; at 10 ms a round (6.3%) it skips 1,
    2, then 3 rounds between drafting rounds, as far as the streak and max_skip allow. Outputs equal
    plain decoding either way."""
    import functools

    from suffixspec.engine.budget import CADENCE_MAX_SHARE
    from suffixspec.engine.engine import Engine

    share = 2 * draft_ms / (150 + 2 * draft_ms)  # two rows' proposals in a drafting round
    # cheap: under the cadence's share; dear: at least max_skip (3) times it, where the skips cap
    assert share < CADENCE_MAX_SHARE if every_round else share >= 3 * CADENCE_MAX_SHARE
    model = tiny_model("llama")
    prompts = prompts_for()[:2]
    new = 24
    refs = [hf_generate(model, p, new) for p in prompts]
    now = [0.0]
    forward = model.forward

    @functools.wraps(forward)  # the engine reads the forward's signature (its cache argument's name)
    def timed_forward(*args, **kwargs):
        now[0] += 0.150
        return forward(*args, **kwargs)

    proposals: list[int] = []
    step_no = [0]

    def draft(session, budget):
        now[0] += draft_ms * 1e-3
        proposals.append(step_no[0])
        return DraftTree.from_paths([[1, 2, 3]], [0.9])

    gen = SpeculativeGenerator(model, proposer=StandInProposer(draft),
                               cost_model=CostModel([1, 2, 1024], [1.0, 50.0, 5e4]), prefill_slack=0.01)
    engine = Engine(gen, clock=lambda: now[0], max_new_tokens=new, budget="auto")
    model.forward = timed_forward
    try:
        for p in prompts:
            engine.add(p)
        while not engine.idle:
            step_no[0] += 1
            engine.step()
    finally:
        del model.forward  # the class's forward again
    res = engine.result()
    assert res.sequences == refs
    assert res.stats.plain_rounds == res.stats.rounds  # nothing paid: no tree was ever verified
    drafting_steps = sorted(set(proposals))
    assert drafting_steps[0] == 2  # the prefills carry no tree; the batch's first round drafts
    gaps = [b - a for a, b in zip(drafting_steps, drafting_steps[1:])]
    if every_round:
        assert drafting_steps == list(range(2, new)), drafting_steps  # rounds at steps 2..new; the last has one token left
    else:
        assert gaps[:3] == [2, 3, 4] and set(gaps[3:]) == {4}, drafting_steps


def test_a_prefill_opens_its_session_only_when_it_could_carry_a_tree():
    """Where one draft node more keeps the prefill within the policy's slack, the automatic rows'
    sessions open at admission and their prefill proposes; where it cannot, the session opens at the
    request's first drafting round, and a request that never drafts (one token) still closes a
    session over its whole output (its output joins the past responses as before). Outputs equal
    plain decoding either way."""
    model = tiny_model("llama")
    prompts = prompts_for()[:2]
    other = prompts_for(seed=7, lengths=(11,))[0]  # (a prompt of its own: one shared would be read apart)
    new = 12
    refs = [hf_generate(model, p, new) for p in prompts]
    for slack, first in [(1.0, 1), (0.01, 2)]:
        step_no = [0]
        opened, proposed, closed = {}, {}, {}

        def draft(session, budget):
            proposed.setdefault(session.request_id, step_no[0])
            return DraftTree.from_paths([[1, 2, 3]], [0.9])

        proposer = StandInProposer(draft)
        gen = SpeculativeGenerator(model, proposer=proposer, cost_model=CostModel([1, 2, 1024], [1.0, 1.5, 800.0]))
        gen.policy.prefill_slack = slack
        original_start = proposer.start

        def start(prompt_ids, request_id=None, filter=None, proposer_start=original_start):
            opened[request_id] = step_no[0]
            session = proposer_start(prompt_ids, request_id, filter)
            original_close = session.close
            session.close = lambda: (closed.__setitem__(request_id, list(session.prompt) + list(session.out)),
                                     original_close())
            return session

        proposer.start = start
        server = gen.serve(max_new_tokens=new, budget="auto")
        for i, p in enumerate(prompts):
            server.add(p, request_id=i)
        one = server.add(other, request_id=9, max_new_tokens=1)
        while not server.idle:
            step_no[0] += 1
            server.step()
        res = server.result()
        server.close()
        assert res.sequences == refs + [hf_generate(model, other, 1)]
        assert opened[0] == opened[1] == proposed[0] == proposed[1] == first, (slack, opened, proposed)
        assert 9 not in proposed, (slack, opened, proposed, closed)
        assert closed.get(9) == list(other) + hf_generate(model, other, 1), (slack, opened, closed)
        assert closed[0] == list(prompts[0]) + refs[0] and closed[1] == list(prompts[1]) + refs[1]
        assert res.stats.requests[one].new_tokens == 1


def test_a_finished_session_closes_before_the_next_proposal_not_in_a_newcomers_first_step():
    """One client at a time: request 0's session closes (its output joins the past responses) neither
    in the step that finishes it nor in the step that admits request 1 (its time to first token), but
    before request 1's first proposal; the last request's closes in a step of the idle server. A close
    that raises is logged and fails nothing. Outputs equal plain decoding."""
    model = tiny_model("llama")
    prompts = prompts_for()[:3]
    new = 10
    refs = [hf_generate(model, p, new) for p in prompts]
    step_no = [0]
    log = []

    def draft(session, budget):
        log.append(("propose", session.request_id, step_no[0]))
        return DraftTree.from_paths([[1, 2, 3]], [0.9])

    proposer = StandInProposer(draft)
    gen = SpeculativeGenerator(model, proposer=proposer, cost_model=CostModel([1, 2, 1024], [1.0, 50.0, 5e4]),
                               prefill_slack=0.01)  # the prefills take no drafts (a newcomer's step never proposes)
    original_start = proposer.start

    def start(prompt_ids, request_id=None, filter=None):
        session = original_start(prompt_ids, request_id, filter)

        def close():
            log.append(("close", request_id, step_no[0]))
            if request_id == 1:
                raise RuntimeError("the cache is full")

        session.close = close
        return session

    proposer.start = start
    server = gen.serve(max_new_tokens=new, budget="auto")
    finished, admitted = {}, {}
    q = server.add(prompts[0], request_id=0)
    while not server.idle:
        step_no[0] += 1
        step = server.step()
        for i in step.admitted:
            admitted[i] = step_no[0]
        for ev in step.events:
            if ev.finish_reason:
                finished[ev.index] = step_no[0]
                if ev.index + 1 < len(prompts):
                    server.add(prompts[ev.index + 1], request_id=ev.index + 1)
    res = server.result()
    assert res.sequences == refs and all(rs.finish_reason == "length" for rs in res.stats.requests)
    closes = {r: at for kind, r, at in log if kind == "close"}
    first_proposal = {}
    for kind, r, at in log:
        if kind == "propose":
            first_proposal.setdefault(r, at)
    for r in (0, 1):
        assert finished[r] < admitted[r + 1] < closes[r] == first_proposal[r + 1], (log, finished, admitted)
        assert log.index(("close", r, closes[r])) < log.index(("propose", r + 1, closes[r]))
    assert 2 not in closes
    step_no[0] += 1
    server.step()  # an idle server's step does the upkeep
    assert log[-1] == ("close", 2, step_no[0]) and len(closes) == 2 and q == 0


def test_a_verified_draft_ends_the_quiet_streak():
    """Drafts that pay (an oracle proposer, cheap passes): every round drafts, as before the cadence."""
    model = tiny_model("llama")
    prompts = prompts_for()[:2]
    refs = {tuple(p): hf_generate(model, p, NEW) for p in prompts}
    inner = oracle_proposer(refs, VOCAB, wrong=False)
    gen = SpeculativeGenerator(model, proposer=inner, cost_model=CostModel([1, 1024], [1.0, 1.01]))
    server = gen.serve(max_new_tokens=NEW, budget="auto")
    for p in prompts:
        server.add(p)
    res = server.run()
    assert res.sequences == [refs[tuple(p)] for p in prompts]
    assert inner.calls == sum(rs.rounds for rs in res.stats.requests)


def test_round_budgets_are_bounded_and_their_mean_counts_every_round():
    from suffixspec.engine.stats import BUDGETS_KEPT, GenerationStats

    stats = GenerationStats(requests=[])
    sizes = [i % 7 for i in range(3 * BUDGETS_KEPT + 5)]
    for i in range(0, len(sizes), 4):
        stats.record_budgets(sizes[i : i + 4])
    assert list(stats.budgets) == sizes[-BUDGETS_KEPT:]
    assert stats.mean_budget == pytest.approx(sum(sizes) / len(sizes))
    assert stats.to_dict()["mean_budget"] == stats.mean_budget


def test_forgetting_rounds_keeps_the_requests_and_zeroes_every_round_counter():
    from suffixspec.engine.stats import GenerationStats, RequestStats

    kept = RequestStats(prompt_tokens=3, new_tokens=2, rounds=1)
    stats = GenerationStats(requests=[kept], rounds=5, plain_rounds=2, proposer_s=0.1, budget_s=0.2,
                            verifier_s=0.3, e2e_s=1.5, peak_memory_bytes=7, fallback="why")
    stats.record_budgets([3, 0, 4])
    stats.forget_rounds()
    assert (stats.rounds, stats.plain_rounds, stats.proposer_s, stats.budget_s, stats.verifier_s) == (0, 0, 0.0, 0.0, 0.0)
    assert list(stats.budgets) == [] and stats.mean_budget == 0.0
    assert stats.requests == [kept] and (stats.e2e_s, stats.peak_memory_bytes, stats.fallback) == (1.5, 7, "why")
    stats.record_budgets([2])
    assert stats.mean_budget == 2.0


def test_decode_passes_are_counted_by_the_tokens_they_feed():
    """Each step without a newcomer runs one decode pass, feeding every row its pending token and
    the widest tree's nodes (rows are padded to it); a prefill is not a decode pass; forgetting the
    rounds forgets the passes."""
    model = tiny_model("llama", vocab=VOCAB, seed=3)
    gen = SpeculativeGenerator(model, proposer=random_tree_proposer(VOCAB),
                               cost_model=CostModel([1, 1024], [1.0, 1.0]))
    server = gen.serve(max_new_tokens=12, budget=8, max_batch=3)
    prompts = prompts_for(seed=5, lengths=(4, 19))
    for i, p in enumerate(prompts):
        server.add(p, max_new_tokens=(12, 5, 9)[i % 3])
    stats, seen, decoded = server.stats, 0, 0
    while not server.idle:
        before = Counter(stats.decode_pass_tokens)
        step = server.step()
        sizes = list(stats.budgets)[seen:]
        seen = len(stats.budgets)
        new = stats.decode_pass_tokens - before
        assert sum(new.values()) <= 1  # at most one decode pass a step
        if not step.admitted:
            assert new == Counter({len(sizes) * (1 + max(sizes)): 1})
        decoded += sum(new.values())
    assert decoded == sum(stats.decode_pass_tokens.values()) > 0
    assert any(k > 3 for k in stats.decode_pass_tokens)  # trees were verified
    assert decoded < stats.rounds  # the prefills were rounds, not decode passes
    stats.forget_rounds()
    assert not stats.decode_pass_tokens


class CountingCache(ResponseCache):
    """A response cache that records the documents of each add."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.batches = []

    def add_many(self, documents):
        documents = [list(map(int, d)) for d in documents]
        self.batches.append(documents)
        super().add_many(documents)


@pytest.mark.parametrize("budget", [8, "auto"])
def test_requests_finishing_together_join_the_past_responses_in_one_add(budget):
    """Requests that finish in the same round (sessions that drafted, or automatic ones deferred and
    opened only to close): their outputs join the cache in one add, before the next proposal or in
    the idle server's upkeep, one add per round that finished some; a later request's output in an
    add of its own. Outputs equal plain decoding."""
    model = tiny_model("llama")
    prompts = prompts_for(seed=5, lengths=(6, 11, 3, 8, 5))
    refs = [hf_generate(model, p, 9) for p in prompts]
    # automatic rows: drafting priced far above its gain, so they defer their sessions and never draft
    gen = SpeculativeGenerator(model, cost_model=CostModel([1, 2, 1024], [1.0, 50.0, 5e4]))
    gen.proposer.cache = cache = CountingCache()
    server = gen.serve(max_new_tokens=9, budget=budget, max_batch=4)
    for p in prompts[:4]:
        server.add(p)
    finishing_steps = 0
    while not server.idle:
        finishing_steps += any(ev.finish_reason for ev in server.step().events)
    server.step()  # the idle server's upkeep closes the last ones
    assert sorted(d for batch in cache.batches for d in batch) == sorted(refs[:4])
    assert len(cache.batches) == finishing_steps, [len(b) for b in cache.batches]  # budget 8: [3, 1]
    if budget == "auto":
        assert len(cache.batches) == 1
    adds = len(cache.batches)
    server.add(prompts[4])
    while not server.idle:
        server.step()
    server.step()
    assert cache.batches[adds:] == [[refs[4]]]
    assert server.result().sequences == refs


class FailingCloses:
    """The generator's proposer, with every other session's close failing; `together` False hides
    its `close_sessions`, so the engine closes sessions one by one."""

    def __init__(self, inner, together):
        self.inner, self.together, self.closed, self.calls = inner, together, [], 0

    def start(self, *a, **k):
        session, outer = self.inner.start(*a, **k), self

        class Session:
            def __getattr__(self, name):
                return getattr(session, name)

            def close(self):
                outer.calls += 1
                if outer.calls % 2:
                    raise RuntimeError("close failed")
                outer.closed.append(session)
                session.close()

        return Session()

    def __getattr__(self, name):
        if name == "close_sessions" and not self.together:
            raise AttributeError(name)
        if name == "close_sessions":
            def fail(sessions):
                self.calls += 1
                raise RuntimeError("close_sessions failed")
            return fail
        return getattr(self.inner, name)


@pytest.mark.parametrize("together", [True, False])
def test_failing_closes_are_logged_and_cost_no_request_its_output(together, caplog):
    """A proposer whose closes fail (all together, or every other one when closed one by one): each
    failure is logged, the other sessions still close, and every output equals plain decoding."""
    model = tiny_model("llama")
    prompts = prompts_for(seed=7, lengths=(6, 11, 3, 8))
    refs = [hf_generate(model, p, 9) for p in prompts]
    proposer = FailingCloses(Proposer(), together)
    gen = SpeculativeGenerator(model, proposer=proposer)
    server = gen.serve(max_new_tokens=9, budget=8, max_batch=4)
    for p in prompts:
        server.add(p)
    with caplog.at_level("WARNING", logger="suffixspec.engine"):
        while not server.idle:
            server.step()
        server.step()
    assert server.result().sequences == refs
    failures = caplog.text.count("closing a finished request's proposer session failed")
    if together:
        assert proposer.calls >= 1 and failures == proposer.calls and not proposer.closed
    else:
        assert proposer.calls == len(prompts) and failures == 2 and len(proposer.closed) == 2
