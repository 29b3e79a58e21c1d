"""Chunked prefill: long prompts read over several bounded steps, beside running requests, with the
same outputs as reading them whole (greedy and sampled), and the scheduling the engine promises."""

import numpy as np
import pytest

from suffixspec.engine.budget import CostModel
from suffixspec.engine.fallback import PromptLookupProposer
from suffixspec.engine.lifecycle import Request
from suffixspec.engine.prefill import prefill_groups
from suffixspec.generate import SpeculativeGenerator
from suffixspec.verify.kv import KVState

from support.tiny_models import hf_generate, random_tree_proposer, tiny_model

CHUNK = 8
VOCAB = 97


def prompt(seed, n):
    return np.random.default_rng(seed).integers(1, VOCAB, n).tolist()


def widths():
    """A KVState.forward that records every pass's (rows, fed tokens per row) while `on[0]`."""
    seen, on = [], [False]
    real = KVState.forward

    def spy(self, pending, trees):
        if on[0]:
            seen.append((len(pending), max(len(p) + len(t) for p, t in zip(pending, trees))))
        return real(self, pending, trees)

    return seen, on, spy


def serve(model, prompts, late=(), join_after=2, max_step_tokens=CHUNK, on_start=None, **options):
    gen = SpeculativeGenerator(model, proposer=random_tree_proposer(VOCAB),
                               cost_model=CostModel([1, 1024], [1.0, 1.0]))
    server = gen.serve(max_step_tokens=max_step_tokens, **options)  # (its support check is a tree pass)
    if on_start is not None:
        on_start()
    for p in prompts:
        server.add(p)
    steps = []
    while not server.idle or late:
        if len(steps) == join_after and late:
            for p in late:
                server.add(p)
            late = ()
        steps.append(server.step())
    return server.result(), steps


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
@pytest.mark.parametrize("budget", [0, 6, "auto"])
def test_long_prompts_alone_and_beside_running_requests_equal_plain_decoding(kind, budget, monkeypatch):
    model = tiny_model(kind)
    short = [prompt(1, 5), prompt(2, 3)]
    long = [prompt(3, CHUNK), prompt(4, int(3.5 * CHUNK)), prompt(5, 10 * CHUNK)]
    refs = {tuple(p): hf_generate(model, p, 12) for p in short + long}
    seen, on, spy = widths()
    monkeypatch.setattr(KVState, "forward", spy)
    for prompts, late in [(long[2:], ()), (short, long)]:  # alone; joining running requests
        on[0] = False
        res, _ = serve(model, prompts, late, max_new_tokens=12, budget=budget, max_batch=4,
                       on_start=lambda: on.__setitem__(0, True))
        assert res.sequences == [refs[tuple(p)] for p in [*prompts, *late]]
    # no pass fed more than a step's tokens besides its draft tree (at most 6 nodes, or 16 auto)
    assert max(w for rows, w in seen if rows == 1) <= CHUNK + (6 if budget == 6 else 16 if budget == "auto" else 0)


def test_sampled_outputs_do_not_depend_on_the_chunk_size():
    model = tiny_model("llama", sharpen=0.5)
    prompts = [prompt(6, 3), prompt(7, 37), prompt(8, 80)]
    outs = []
    for chunk in (4, 9, 1000):
        res, _ = serve(model, prompts, max_step_tokens=chunk, max_new_tokens=10, budget=4, do_sample=True,
                       temperature=1.2, seed=3, max_batch=3)
        outs.append(res.sequences)
    assert outs[0] == outs[1] == outs[2]


def test_running_requests_get_a_round_between_the_chunks():
    """While an 80-token prompt is read 8 tokens a step, the running requests commit a token at
    every other step, and a request arriving meanwhile is admitted before the long prompt is in."""
    model = tiny_model("llama")
    gen = SpeculativeGenerator(model, proposer=PromptLookupProposer())
    server = gen.serve(max_step_tokens=CHUNK, max_new_tokens=40, budget=0, max_batch=4)
    runners = [server.add(prompt(9, 4)), server.add(prompt(10, 6))]
    server.step()  # their prefill
    long = server.add(prompt(11, 80))
    steps = [server.step() for _ in range(6)]
    newcomer = server.add(prompt(12, 5))
    while server.request_stats(long).rounds == 0:
        steps.append(server.step())
    runner_steps = [any(e.index in runners and e.tokens for e in s.events) for s in steps]
    assert all(a or b for a, b in zip(runner_steps, runner_steps[1:])), runner_steps  # never two steps without
    assert server.stats.prefill_chunks >= 80 // CHUNK - 1
    assert server.request_stats(newcomer).rounds > 0  # admitted and decoding before the long prompt was in
    assert server.prefilling == 0
    server.run()
    assert server.output(long) == hf_generate(model, prompt(11, 80), 40)


def test_a_prefill_in_progress_can_be_cancelled_and_closing_abandons_it():
    model = tiny_model("llama")
    gen = SpeculativeGenerator(model, proposer=PromptLookupProposer())
    server = gen.serve(max_step_tokens=CHUNK, max_new_tokens=5, budget=0)
    q = server.add(prompt(13, 60))
    server.step()
    assert server.prefilling == 1 and not server.idle
    assert server.cancel(q)
    step = server.step()
    assert [(e.index, e.finish_reason) for e in step.events] == [(q, "cancelled")]
    assert server.idle and server.prefilling == 0
    q2 = server.add(prompt(14, 60))
    server.step()
    server.close()
    assert server.idle and server.request_stats(q2).finish_reason == ""


def test_prefill_groups_stay_within_the_step_tokens():
    rng = np.random.default_rng(0)
    for _ in range(200):
        lengths = rng.integers(1, 40, int(rng.integers(1, 9)))
        reqs = [Request(i, i, 4, None, 0, [1] * n, [1] * n) for i, n in enumerate(lengths)]
        limit = int(rng.integers(8, 64))
        groups = prefill_groups(reqs, max_tokens=limit)
        assert sorted(rq.index for g in groups for rq in g) == list(range(len(reqs)))
        for g in groups:
            padded = len(g) * max(len(rq.pending) for rq in g)
            assert len(g) == 1 or padded <= limit
            assert padded <= 1.25 * sum(len(rq.pending) for rq in g) + 1e-9
