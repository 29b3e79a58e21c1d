"""The continuous-batching engine: joins and leaves between rounds, identity with batch-1 decoding,
sampling keys, bad options, prefill groups, cancellation, failure isolation, time accounting."""

import pytest

from suffixspec.budget import CostModel
from suffixspec.errors import BadInputError
from suffixspec.fallback import PromptLookupProposer
from suffixspec.generate import SpeculativeGenerator

from tiny_models import hf_generate, oracle_proposer, random_tree_proposer, tiny_model
from test_generate import NEW, VOCAB, prompts_for


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
    # plain decoding: a request's prefill round and its first decode round share a step; one token a round
    assert log[0] == ([0, 1], [(0, 1, ""), (0, 1, "length"), (1, 1, ""), (1, 1, "")], 1)
    assert log[1] == ([2], [(1, 1, ""), (2, 1, ""), (2, 1, "")], 2)  # request 0's slot refilled in the next step
    assert log[2] == ([], [(1, 1, ""), (2, 1, "length")], 1)
    assert log[3] == ([3], [(1, 1, ""), (3, 1, ""), (3, 1, "")], 2)
    assert log[4][0] == [] and (1, 1, "length") in log[4][1]
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


def test_serve_rejects_bad_options():
    gen = SpeculativeGenerator(tiny_model("llama"), proposer=PromptLookupProposer())
    with pytest.raises(BadInputError, match="max_batch"):
        gen.serve(max_batch=0)
    with pytest.raises(BadInputError, match="budget"):
        gen.serve(budget="many")
    server = gen.serve(max_new_tokens=4, budget=0)
    with pytest.raises(BadInputError):
        server.add([])
    assert server.add([1, 2], max_new_tokens=0) == 0 and server.idle
    assert server.result().sequences == [[]]


def test_prefill_groups_bound_the_padding():
    from suffixspec.engine import Request, prefill_groups

    lives = [Request(i, i, 8, None, "auto", [1] * n, [1] * n) for i, n in enumerate((10, 11, 100, 12, 90))]
    assert [[lv.index for lv in g] for g in prefill_groups(lives)] == [[0, 1, 3], [4, 2]]
    assert [len(g) for g in prefill_groups(lives, waste=10.0)] == [5]
