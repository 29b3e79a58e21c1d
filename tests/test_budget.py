"""The automatic budget: cost model, rank calibration, per-request trust, shadows, round sizing, pruning."""

import numpy as np
import pytest

from suffixspec.draft.tree import DraftTree, prune_tree
from suffixspec.engine.budget import CostModel, RankCalibration
from suffixspec.engine.fallback import PromptLookupProposer
from suffixspec.generate import SpeculativeGenerator
from suffixspec.verify.batch import RoundBatch

from support.prompts import NEW, VOCAB, prompts_for
from support.tiny_models import hf_generate, oracle_proposer, tiny_model


def test_auto_budget_follows_the_cost_curve():
    model = tiny_model("llama")
    prompts = prompts_for()
    refs = {tuple(p): hf_generate(model, p, NEW) for p in prompts}
    cheap = SpeculativeGenerator(model, proposer=oracle_proposer(refs, VOCAB), cost_model=CostModel([1, 4096], [1.0, 1.01]))
    res = cheap.generate(prompts, max_new_tokens=NEW)
    assert res.stats.drafted > 0 and res.stats.tokens_per_round > 2
    dear = SpeculativeGenerator(model, proposer=oracle_proposer(refs, VOCAB), cost_model=CostModel([1, 4096], [1.0, 4096.0]))
    res2 = dear.generate(prompts, max_new_tokens=NEW)
    assert res2.stats.drafted == 0 and res2.stats.plain_rounds == res2.stats.rounds
    assert res.sequences == res2.sequences == [refs[tuple(p)] for p in prompts]


def test_measured_cost_model_is_monotone():
    cost = CostModel.measure(tiny_model("llama"), sizes=(1, 4, 16), past=32, repeats=1)
    assert list(cost.relative()) == [1, 4, 16] and cost(16) >= cost(1) > 0
    # past the largest measured size: along the last measured segment (not in proportion to the tokens)
    slope = max(0.0, (cost(16) - cost(4)) / 12)
    assert cost(64) == pytest.approx(cost(16) + slope * 48)


def test_prune_tree_keeps_a_closed_subtree():
    tree = DraftTree.from_paths([[1, 2, 3], [4, 5], [1, 6]], scores=[0.9, 0.5, 0.4])
    small = prune_tree(tree, 3, 10)
    assert small.tokens.tolist() == [1, 2, 3]
    shallow = prune_tree(tree, 10, 1)
    assert sorted(shallow.tokens.tolist()) == [1, 4] and shallow.max_depth == 1


def test_prune_tree_against_brute_force():
    """On random trees whose scores never increase down a path (as the proposer's), the pruned tree is
    a valid tree closed under parents, within size and depth, of the largest score sum any such
    subset has (brute force over every subset)."""
    import itertools

    rng = np.random.default_rng(8)
    for _ in range(200):
        n = int(rng.integers(1, 10))
        parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
        scores = []
        for i, p in enumerate(parents):
            scores.append(float(rng.uniform(0, 1 if p < 0 else scores[p])))
        tree = DraftTree(np.arange(n), np.array(parents), np.array(scores))
        size, max_depth = int(rng.integers(1, n + 2)), int(rng.integers(1, 5))
        got = prune_tree(tree, size, max_depth)
        check = DraftTree(got.tokens, got.parents, got.scores)  # validates
        assert np.array_equal(check.depths, got.depths) and len(got) <= size
        assert len(got) == 0 or got.depths.max() <= max_depth
        kept = got.tokens.tolist()  # tokens are the original indices
        assert all(parents[i] < 0 or parents[i] in kept for i in kept)
        assert np.array_equal(got.scores, tree.scores[kept])
        best = 0.0
        for r in range(1, min(size, n) + 1):
            for sub in itertools.combinations(range(n), r):
                if all((parents[i] < 0 or parents[i] in sub) and tree.depths[i] <= max_depth for i in sub):
                    best = max(best, sum(scores[i] for i in sub))
        assert got.scores.sum() == pytest.approx(best)


def test_cost_model_follows_observed_pass_times():
    cm = CostModel([1, 8, 64], [1.0, 2.0, 4.0])
    for _ in range(200):
        cm.observe(8, 3.0)  # the machine got slower: seen on 8-token passes only
    # every size moves with the batch's speed, so the relative costs the budget decides on stay measured
    assert cm(8) == pytest.approx(3.0, rel=0.01)
    assert cm(1) == pytest.approx(1.5, rel=0.01) and cm(64) == pytest.approx(6.0, rel=0.01)
    for _ in range(300):
        cm.observe(64, 2.0)  # cheaper than a smaller pass: the curve stays monotone, and stays finite
    assert cm(64) == pytest.approx(2.0, rel=0.02)
    assert cm(8) <= cm(64) and cm(1) <= cm(8) and cm(1) > 0.1


def test_cost_model_keeps_a_seldom_seen_size_relative_to_the_batch_speed():
    """16 rows: a 2-token-per-row pass seen once at its measured cost, then many one-token rounds 45%
    dearer than measured: the 2-token pass must follow the batch's speed (its relative cost stays near
    the measured 1.47x), not keep its old absolute cost (which would make it look 1.02x)."""
    cm = CostModel([1, 2, 4, 8, 16, 32, 64], [1.0, 1.05, 1.1, 1.3, 1.7, 2.5, 3.9])
    cm.observe(32, 2.5, batch=16)
    for _ in range(200):
        cm.observe(16, 1.7 * 1.45, batch=16)
    assert cm(16, batch=16) == pytest.approx(1.7 * 1.45, rel=0.01)
    assert float(cm(32, batch=16) / cm(16, batch=16)) == pytest.approx(2.5 / 1.7, rel=0.07)


def test_cost_model_converges_to_every_observed_size():
    """Observed sizes converge to what they were seen to cost, unobserved ones to the measured cost times
    the geometric mean of the observed corrections, in any order of observations; always monotone, but
    for the one-token step of b > 1 rows (b tokens), which costs the curve at b times `step_ratio`."""
    rng = np.random.default_rng(5)
    sizes = [1, 2, 4, 8, 16, 32, 64]
    for case in range(20):
        batch = 1 + case % 3
        measured = np.cumsum(rng.uniform(0.1, 1.0, len(sizes)))
        cm = CostModel(sizes, measured)
        assert cm.step_ratio == pytest.approx(measured[0] / measured[1])
        step = np.array([cm.step_ratio if batch > 1 and s == batch else 1.0 for s in sizes])
        observed = rng.choice(len(sizes), size=int(rng.integers(1, 4)), replace=False)
        truth = {int(i): measured[i] * step[i] * rng.uniform(0.6, 1.6) for i in observed}
        for _ in range(900):  # interleaved: each observed size is seen again and again
            i = int(rng.choice(observed))
            cm.observe(sizes[i], truth[i] * rng.uniform(0.98, 1.02), batch=batch)
        raw = measured * np.exp(np.mean([np.log(truth[i] / (measured[i] * step[i])) for i in observed]))
        for i in observed:
            raw[i] = truth[i] / step[i]
        expect = np.maximum.accumulate(raw) * step
        got = cm(np.asarray(sizes, np.float64), batch=batch)
        assert np.all(np.diff(got / step) >= 0)
        np.testing.assert_allclose(got, expect, rtol=0.03)
        if case % 3:
            np.testing.assert_allclose(cm(np.asarray(sizes, np.float64)), measured)  # batch 1 untouched


def test_auto_budget_weights_and_prefill_margin():
    gen = SpeculativeGenerator(tiny_model("llama"), proposer=PromptLookupProposer(),
                               cost_model=CostModel([1, 2, 4, 8, 16, 32], [1, 1, 1.6, 2.2, 4, 8]),
                               prefill_slack=float("inf"))  # the margin alone (the slack: the next test)
    gen.calibration = RankCalibration(prior_ratio=1.0)  # the scores as they are
    good = DraftTree(np.arange(1, 9), np.arange(8) - 1, np.full(8, 0.9))
    trees, limits = [good, DraftTree.empty()], [64, 64]
    # decode round, rows counted alike: 4 nodes a row (8 tokens, cost 2.2) -> (2 + 2.7) / 2.2 beats 2 / 1
    assert [len(t) for t in gen.policy.size_round(RoundBatch.build(trees, limits))] == [3, 0]
    # the drafting row is nearly done and the other is the batch's tail: its tokens count a quarter
    assert [len(t) for t in gen.policy.size_round(RoundBatch.build(trees, limits, weights=[0.25, 1.0]))] == [0, 0]
    gen.policy.batch_margin = 0.1  # two rows: speculate only beyond 1.1x the plain rate; 2.14 < 2.2
    assert [len(t) for t in gen.policy.size_round(RoundBatch.build(trees, limits))] == [0, 0]
    gen.policy.batch_margin = 0.01
    # a prefill round of 100 pending tokens: weak drafts raise the round's average rate (1.8 / 27 > 1 / 25)
    # but buy fewer tokens (0.8) than their extra pass time (2 units) buys in plain decode rounds
    weak = DraftTree(np.arange(1, 9), np.arange(8) - 1, np.full(8, 0.1))
    assert len(gen.policy.size_round(RoundBatch.build([weak], [64], pending=[[0] * 100]))[0]) == 0
    assert len(gen.policy.size_round(RoundBatch.build([good], [64], pending=[[0] * 100]))[0]) == 8


def test_cost_model_corrections_are_per_batch_size():
    cm = CostModel([1, 8, 64], [1.0, 2.0, 4.0])
    for _ in range(200):
        cm.observe(8, 10.0, batch=4)  # four rows with long contexts: dearer than the measured curve
    assert cm(8, batch=4) == pytest.approx(10.0, rel=0.01) and cm(64, batch=4) >= cm(8, batch=4)
    assert cm(8) == pytest.approx(2.0) and cm(8, batch=2) == pytest.approx(2.0)  # other batch sizes untouched
    assert cm.relative() == {1: 1.0, 8: 2.0, 64: 4.0}
    cm.observe(1, 100.0)  # a load spike moves the speed by at most 10%, the size's shape by at most 2%
    assert cm(1) == pytest.approx(1.1 * (1 + 0.1 * CostModel.SHAPE_RATE))


def test_a_noisy_machine_asks_more_passes_before_a_size_is_known():
    """Beyond one row a size's first passes replace the guess, so on a noisy machine two of them can
    price it out: a size counts as known (tried, no longer explored) only after enough passes for
    the noise the batch's passes show; a quiet machine, one row, and stalls among quiet passes keep
    GUESS_PASSES."""
    rng = np.random.default_rng(0)
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    quiet, noisy, stalled = (CostModel(sizes, [1.0 + 0.01 * s for s in sizes]) for _ in range(3))
    for i in range(200):
        quiet.observe(4, float(quiet(4, batch=4)), batch=4)
        noisy.observe(4, float(noisy(4, batch=4)) * float(np.exp(rng.normal(0.0, 0.15))), batch=4)
        noisy.observe(1, float(noisy(1)) * float(np.exp(rng.normal(0.0, 0.15))))
        stalled.observe(4, float(stalled(4, batch=4)) * (4.0 if i % 40 == 0 else 1.0), batch=4)
    assert quiet.known(4) == stalled.known(4) == CostModel.GUESS_PASSES
    assert noisy.known(1) == CostModel.GUESS_PASSES
    assert 5 <= noisy.known(4) <= CostModel.MAX_KNOWN_PASSES  # about 0.15^2 / 0.05^2 = 9
    noisy.observe(16, float(noisy(16, batch=4)), batch=4)
    noisy.observe(16, float(noisy(16, batch=4)), batch=4)
    assert not noisy.tried(16, 4) and quiet.known(4) == 2


def test_rank_calibration_against_brute_force():
    rng = np.random.default_rng(4)
    cal = RankCalibration(decay=0.9)
    edges = [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
    scored, accepted = np.zeros(len(edges) + 1), np.zeros(len(edges) + 1)
    for _ in range(60):
        trees, accs = [], []
        for _ in range(int(rng.integers(1, 4))):
            n = int(rng.integers(0, 40))
            parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
            scores = rng.random(n)
            tree = DraftTree(np.arange(n), np.array(parents, np.int64), scores) if n else DraftTree.empty()
            acc = sorted(rng.choice(n, int(rng.integers(0, n + 1)), replace=False).tolist()) if n else []
            trees.append(tree)
            accs.append(acc)
        scored *= 0.9
        accepted *= 0.9
        for tree, acc in zip(trees, accs):
            by_score = sorted(range(len(tree)), key=lambda i: (-tree.scores[i], i))
            for r, node in enumerate(by_score):
                b = next(k for k, e in enumerate(edges + [1 << 62]) if r + 1 <= e)
                scored[b] += tree.scores[node]
                accepted[b] += node in acc
        cal.observe(trees, accs)
        np.testing.assert_allclose(cal.scored, scored)
        np.testing.assert_allclose(cal.accepted, accepted)


def test_rank_calibration_learns_per_rank_ratios():
    cal = RankCalibration()
    rng = np.random.default_rng(0)
    chain = DraftTree(np.arange(12), np.arange(12) - 1, np.linspace(0.6, 0.3, 12))
    for _ in range(3000):  # the best node accepted 90% of the time, ranks 9-12 never
        k = 1 if rng.random() < 0.9 else 0
        cal.observe([chain], [list(range(k))])
    f = cal.factors(12)
    assert abs(f[0] - 0.9 / 0.6) < 0.1
    assert f[9] == cal.low and f[11] == cal.low
    fresh = RankCalibration(prior_ratio=0.5)
    assert np.all(fresh.factors(100) == 0.5)  # nothing observed: the prior ratio
    assert np.all(fresh.apply(np.array([3.0, 0.5])) == [1.0, 0.25])


def test_a_rank_bucket_with_few_trees_follows_the_pooled_ratio():
    """Ranks 13-16 seen in one tree that failed there, every other rank accepted at twice its score:
    the bucket is not trapped near 0 (it sits behind the pooled ratio), while evidence of many trees
    still moves it."""
    cal = RankCalibration()
    chain = DraftTree(np.arange(12), np.arange(12) - 1, np.full(12, 0.5))
    for _ in range(100):
        cal.observe([chain], [list(range(12))])
    deep = DraftTree(np.arange(16), np.arange(16) - 1, np.full(16, 0.5))
    cal.observe([deep], [list(range(12))])
    pooled = (cal.accepted.sum() + cal.prior * cal.prior_ratio) / (cal.scored.sum() + cal.prior)
    b = cal.buckets(16)[12]
    assert cal.factors(16)[12] == pytest.approx((cal.accepted[b] + cal.pool * pooled) / (cal.scored[b] + cal.pool))
    assert cal.factors(16)[12] > 1.0 and cal.factors(16)[0] > 1.9
    for _ in range(300):
        cal.observe([deep], [list(range(12))])
    assert cal.factors(16)[12] < 0.5  # many trees failing there: the bucket's own evidence wins


def test_request_draft_factor_scales_the_auto_budget():
    from suffixspec.engine.budget import REQUEST_PRIOR, REQUEST_PRIOR_RATIO, RequestTrust

    lv = RequestTrust()
    assert lv.factor() == REQUEST_PRIOR_RATIO  # nothing drafted yet: the prior
    lv.predicted, lv.hits = 40.0, 0.0  # forty nodes' worth of estimates, none accepted
    want = REQUEST_PRIOR * REQUEST_PRIOR_RATIO / (40.0 + REQUEST_PRIOR)
    assert abs(lv.factor() - want) < 1e-12 and want < 0.2
    lv.predicted, lv.hits = 1.0, 19.0  # far better than estimated
    assert lv.factor() == 3.0
    gen = SpeculativeGenerator(tiny_model("llama"), proposer=PromptLookupProposer(),
                               cost_model=CostModel([1, 2, 4, 8, 16, 32], [1, 1.15, 1.3, 1.6, 2, 4]))
    gen.calibration = RankCalibration(prior_ratio=1.0)
    tree = DraftTree(np.arange(1, 5), np.arange(4) - 1, np.array([0.5, 0.4, 0.3, 0.2]))
    assert len(gen.policy.size_round(RoundBatch.build([tree], [64]))[0]) == 4  # 2.4 / 1.375 is the best rate
    # scaled to 0.1, 0.08, 0.06, 0.04: no k pays its pass (1.1 / 1.15, 1.18 / 1.225, ...)
    assert len(gen.policy.size_round(RoundBatch.build([tree], [64], factors=[0.2]))[0]) == 0


def test_shadow_follows_committed_tokens_like_verification():
    """An unverified tree followed along tokens committed in pieces matches, node for node, the
    longest accepted path of the whole committed sequence (brute force: `DraftTree.longest_accepted`)."""
    from suffixspec.engine.budget import Shadow

    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
        tokens = [int(rng.integers(0, 3)) for _ in range(n)]
        seen, keep = set(), []
        for i, (t, p) in enumerate(zip(tokens, parents)):  # siblings distinct
            if (p, t) not in seen and (p < 0 or p in keep):
                seen.add((p, t))
                keep.append(i)
        remap = {old: new for new, old in enumerate(keep)}
        tree = DraftTree(np.array([tokens[i] for i in keep]), np.array([remap.get(parents[i], -1) for i in keep]))
        committed = [int(t) for t in rng.integers(0, 3, int(rng.integers(1, 10)))]
        node = tree.longest_accepted(committed)
        want = 0 if node < 0 else int(tree.depths[node])
        sh, done, at = Shadow(tree), False, 0
        while at < len(committed) and not done:
            step = int(rng.integers(1, 4))
            done = sh.feed(committed[at : at + step])
            at += step
        assert sh.hits == want
        # resolved exactly when the path left the tree or reached a leaf within the tokens fed
        leaf = node >= 0 and not np.any(tree.parents == node)
        assert done == (want < min(len(committed), at) or leaf)


def test_unverified_trees_teach_the_request_factor():
    """Drafts scored too low to pay for a pass, yet always right: the trees the auto budget passed
    over are checked against what was committed after them, the request's factor rises, and it starts
    drafting (it never would on the evidence of verified drafts alone, having none)."""
    model = tiny_model("llama", sharpen=4.0)
    ref = hf_generate(model, [5, 6, 7], 40)

    class Right:
        def start(self, prompt_ids, request_id=None, filter=None):
            self.pos = 0
            return self

        def extend(self, tokens):
            self.pos += len(tokens)

        def propose(self, budget):
            nxt = ref[self.pos : self.pos + 3]
            return DraftTree(np.array(nxt), np.arange(len(nxt)) - 1, np.array([0.15, 0.12, 0.1][: len(nxt)]))

        def close(self):
            pass

    # no drafts ride along the prefill either: no verified evidence at all to start from
    gen = SpeculativeGenerator(model, proposer=Right(), cost_model=CostModel([1, 2, 4, 8], [1.0, 1.3, 1.35, 1.4]),
                               prefill_margin=1e9)
    out = gen.generate([[5, 6, 7]], max_new_tokens=40)
    assert out.sequences == [ref]
    drafted = [b > 0 for b in out.stats.budgets]
    assert not any(drafted[:3]) and sum(drafted[-8:]) >= 6
    assert out.stats.requests[0].accepted > 0


def test_failing_drafts_lower_the_request_factor():
    """A proposer whose confident drafts are always wrong: the request soon stops drafting."""
    model = tiny_model("llama", sharpen=4.0)
    ref = hf_generate(model, [5, 6, 7], 40)

    class Wrong:
        def start(self, prompt_ids, request_id=None, filter=None):
            return self

        def extend(self, tokens):
            pass

        def propose(self, budget):
            return DraftTree(np.array([96, 95, 94]), np.array([-1, 0, 1]), np.array([0.9, 0.8, 0.7]))

        def close(self):
            pass

    class FixedCost(CostModel):  # a draft costs its pass 30%, whatever the tiny model's passes take
        def observe(self, *args, **kwargs):
            pass

    gen = SpeculativeGenerator(model, proposer=Wrong(), cost_model=FixedCost([1, 2, 4, 64], [1.0, 1.3, 1.35, 2.0]))
    out = gen.generate([[5, 6, 7]], max_new_tokens=40)
    assert out.sequences == [ref]
    drafted_rounds = [b > 0 for b in out.stats.budgets]
    assert sum(drafted_rounds[:5]) >= 1 and sum(drafted_rounds[-20:]) <= 2


def test_prefill_drafts_stay_within_the_ttft_slack():
    """A prompt's pass takes drafts only while they make it at most `prefill_slack` dearer."""
    from suffixspec.engine.budget import BudgetPolicy

    linear = CostModel([1, 1024], [1.0, 1024.0])  # cost proportional to the tokens fed
    sure = DraftTree(np.arange(1, 65), np.arange(64) - 1, np.full(64, 0.99))
    for slack, rows, width, want in [(0.03, 1, 100, 3), (0.03, 4, 500, 15), (0.0, 2, 300, 0), (0.1, 1, 100, 10)]:
        policy = BudgetPolicy(cost_model=linear, prefill_slack=slack, prefill_margin=1e-6,
                              calibration=RankCalibration(prior_ratio=1.0))
        sized = policy.size_round(RoundBatch.build([sure] * rows, [128] * rows, pending=[[0] * width] * rows))
        assert [len(t) for t in sized] == [want] * rows, (slack, rows, width)
        cost = linear(rows * (np.array([0, want]) + width))
        assert cost[1] <= (1 + slack) * cost[0]


def test_draft_cadence_thins_out_while_quiet_and_wakes():
    from suffixspec.engine.budget import DraftCadence

    c = DraftCadence(max_skip=3)
    pattern = []
    for _ in range(20):
        d = c.drafts()
        pattern.append(d)
        if d:
            c.observe(False)
    drafted = [i for i, d in enumerate(pattern) if d]
    assert drafted == [0, 2, 5, 9, 13, 17]  # skips of 1, 2, then 3 rounds
    c.wake()
    assert c.drafts() and c.streak == 6  # a newcomer: look now, the streak stays
    c.observe(False)
    assert not c.drafts()
    c.skip = 0
    c.observe(True)
    assert c.streak == 0 and all(c.drafts() for _ in range(3))
    # within `memory` rounds of a verified tree quiet rounds skip nothing, then the streak thins again
    pattern = []
    for _ in range(40):
        d = c.drafts()
        pattern.append(d)
        if d:
            c.observe(False)
    drafted = [i for i, d in enumerate(pattern) if d]
    first_skip = pattern.index(False)
    assert first_skip == c.memory - 3 and all(pattern[:first_skip])  # 3 rounds drafted above
    gaps = [b - a for a, b in zip(drafted, drafted[1:]) if a >= first_skip - 1]
    assert gaps and set(gaps) == {4}, gaps  # the streak grew meanwhile: straight to the longest skip


@pytest.mark.parametrize("share", [0.001, 0.004, 0.0041, 0.006, 0.009, 0.0121, 0.016, 0.05])
def test_draft_cadence_skips_only_as_far_as_drafting_costs(share):
    """A quiet batch whose drafting rounds spend `share` of their time drafting: it skips the fewest
    rounds that keep drafting within max_share of all rounds (brute force over the skip counts), never
    more than the streak and max_skip allow; drafting is never dearer than max_share, or than
    share / (max_skip + 1) where max_skip caps the skips, and cheap drafting never skips."""
    from suffixspec.engine.budget import DraftCadence

    c = DraftCadence(max_skip=3, max_share=0.004)
    pattern = []
    for _ in range(60):
        d = c.drafts()
        pattern.append(d)
        if d:
            c.observe(False, cost_s=share * 0.1, round_s=0.1)
    weighed = min(share, 4 * 0.004)  # a share beyond where the skips cap weighs as that
    fewest = next((k for k in range(100) if weighed / (k + 1) <= 0.004 + 1e-12), None)
    assert c.needed() == fewest
    drafted = [i for i, d in enumerate(pattern) if d]
    gaps = [b - a for a, b in zip(drafted, drafted[1:])]
    want = min(fewest, 3)
    assert gaps[:want] == list(range(2, want + 2)) and set(gaps[want:]) == {want + 1}, gaps  # skips 1, 2, ...
    spent = share * len(drafted) / len(pattern)
    # within max_share, or where max_skip caps the skips, one round in max_skip + 1 (the first
    # rounds' shorter skips aside)
    assert spent <= max(c.max_share, share / (c.max_skip + 1)) * 1.15
    if share <= 0.004:
        assert all(pattern)


def test_draft_cadence_share_decays_toward_new_rounds_and_untimed_rounds_skip_freely():
    from suffixspec.engine.budget import DraftCadence

    c = DraftCadence(max_skip=3, max_share=0.004)
    c.observe(False)
    assert c.share is None and c.skip == 1  # no timings: as far as the streak allows
    c.observe(False, cost_s=0.02, round_s=1.0)  # 2%: three skips needed, capped by the streak (2)
    assert c.share == pytest.approx(0.016) and c.skip == 2  # 2% weighs as 1.6%, where skips cap
    for _ in range(40):  # drafting became cheap (0.1%): the decayed share follows, skips stop
        c.observe(False, cost_s=0.001, round_s=1.0)
    assert c.share == pytest.approx(0.001, rel=1e-3) and c.needed() == 0 and c.skip == 0
    c.observe(False, cost_s=5.0, round_s=1.0)  # a spike weighs as the share at which skips cap, no more
    assert c.share == pytest.approx(0.75 * 0.001 + 0.25 * 0.016, rel=1e-3) and c.needed() == 1
    c.observe(True, cost_s=0.0, round_s=0.0)  # a zero-length round: no timing, the streak ends
    assert c.streak == 0 and c.skip == 0


def _product_limit(seen, x, prior):
    """P(length > x) by the definition: the product over event lengths t <= x of 1 - ended(t) / at-risk(t)."""
    s = 1.0
    for t in range(x + 1):
        ended = sum(1 for length, e in seen if e and length == t)
        at_risk = sum(1 for length, _ in seen if length >= t) + prior
        s *= 1.0 - ended / at_risk
    return s


def test_output_lengths_equal_the_product_limit_estimate():
    from suffixspec.engine.budget import OutputLengths

    rng = np.random.default_rng(3)
    for trial in range(20):
        est = OutputLengths(window=16, prior=[0.5, 1.0, 2.0][trial % 3])
        seen = []
        for _ in range(int(rng.integers(0, 40))):
            item = (int(rng.integers(0, 30)), bool(rng.random() < 0.7))
            est.observe(*item)
            seen.append(item)
        seen = seen[-16:]
        surv = est.survival()
        for x in range(len(surv) + 3):
            want = _product_limit(seen, x, est.prior)
            assert surv[min(x, len(surv) - 1)] == pytest.approx(want)
        done = int(rng.integers(0, 35))
        cont = est.continuing(done, 8)
        for d in range(9):
            want = _product_limit(seen, done + d, est.prior) / _product_limit(seen, done, est.prior)
            assert cont[d] == pytest.approx(want)
    assert (OutputLengths().continuing(5, 4) == 1.0).all()  # nothing seen: nothing discounted


def test_short_answers_draft_no_wider_than_they_repay():
    """Answers that always ended 2 tokens in: a deep chain is cut to the depth the output reaches, and
    with nothing seen the same chain is taken whole."""
    from suffixspec.engine.budget import BudgetPolicy, OutputLengths

    chain = DraftTree.from_paths([list(range(1, 13))], [0.95])
    chain.scores[:] = 0.95 ** np.arange(1, 13)
    policy = BudgetPolicy(cost_model=CostModel([1, 64], [1.0, 2.9]))  # 3% more a token
    policy.calibration = RankCalibration(prior=1e6, prior_ratio=1.0)  # scores taken as they are
    whole = policy.size_round(RoundBatch.build([chain], [64]))[0]
    assert len(whole) == 12
    lengths = OutputLengths()
    for _ in range(50):
        lengths.observe(4, True)
    short = policy.size_round(RoundBatch.build([chain], [64], continuing=[lengths.continuing(1, 64)]))[0]
    assert len(short) in (1, 2, 3)  # past 4 tokens (3 beyond the 1 done) hardly any output runs on


def test_cost_model_beyond_one_row_step_and_first_tree_passes():
    """Four rows. The one-row curve is flat from 2 to 8 tokens, so it prices a pass of two tokens a row
    (8 tokens) like a one-token step of four rows (4 tokens). The step skips the masks a 4-token pass
    of one row builds (`step_ratio`: the one-row step over its 2-token pass), so a tree starts at 1.16x
    a step; on this machine it costs 1.4x, and its first three passes, among hundreds of steps, must
    take the estimate most of the way there. At one row, three passes move a size by at most 2% each."""
    curve = ([1, 2, 4, 8, 16], [1.0, 1.16, 1.16, 1.16, 1.34])
    cm = CostModel(*curve)
    assert cm.step_ratio == pytest.approx(1 / 1.16)
    assert cm(4, batch=4) == pytest.approx(1.16 / 1.16) and cm(8, batch=4) == pytest.approx(1.16)
    for _ in range(200):
        cm.observe(4, 0.8, batch=4)
    assert cm(4, batch=4) == pytest.approx(0.8, rel=1e-3)
    assert float(cm(8, batch=4) / cm(4, batch=4)) == pytest.approx(1.16, rel=1e-3)
    for _ in range(3):
        cm.observe(8, 0.8 * 1.4, batch=4)
        for _ in range(20):
            cm.observe(4, 0.8, batch=4)
    assert cm(4, batch=4) == pytest.approx(0.8, rel=0.01)  # the plain step stays where it was seen
    tree_over_step = float(cm(8, batch=4) / cm(4, batch=4))
    assert tree_over_step > 1.28 and tree_over_step < 1.4  # from 1.16, toward 1.4
    one = CostModel(*curve)
    for _ in range(3):
        one.observe(2, 1.16 * 1.4)
    assert float(one(2) / one(1)) < 1.16 * 1.02 ** 3 * 1.001


def test_passes_between_two_sizes_correct_the_nearer_one_fully():
    """Four rows on a flat curve, size 8 well known. A pass of 12 tokens lies between sizes 8 and 16
    (nearer 16 in log): the first such pass replaces 16's guess, so the curve then prices that pass
    as it was seen (before: half its error, as 16 carries half the interpolated cost), and later
    ones move it as a running mean of what each implies for 16 (an unlucky start is soon undone;
    before, a size priced too dear stayed so through the passes beside it, and the monotone curve
    lifted every larger size with it). At one row the same error is corrected at the slow rate."""
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    truth = {t: 1.0 + 0.1 * (t - 1) / 63 for t in range(1, 600)}
    cm = CostModel(sizes, [truth[s] for s in sizes])
    for _ in range(30):  # the plain step (four tokens) and 8 tokens, well known
        cm.observe(4, float(cm(4, batch=4)), batch=4)
        cm.observe(8, truth[8], batch=4)
    cm.observe(12, truth[12] * 1.4, batch=4)  # an unlucky first pass
    assert float(cm(12, batch=4)) == pytest.approx(truth[12] * 1.4, rel=1e-9)
    assert float(cm(64, batch=4) / cm(8, batch=4)) > 1.3  # every larger size priced out with it
    for _ in range(8):
        cm.observe(12, truth[12], batch=4)
        cm.observe(8, truth[8], batch=4)
    assert float(cm(12, batch=4)) == pytest.approx(truth[12] * (1 + 0.4 / (1 + 8)), rel=0.03)
    assert float(cm(64, batch=4) / cm(8, batch=4)) < 1.2  # the larger sizes no longer priced out
    one = CostModel(sizes, [truth[s] for s in sizes])
    for _ in range(400):
        one.observe(12, truth[12] * 1.2)
    assert float(one(12)) == pytest.approx(truth[12] * 1.2, rel=0.02)
