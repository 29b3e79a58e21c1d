"""The response cache's background upkeep (`Proposer(cache_upkeep="background")`, suffixspec/draft/upkeep.py):
`close` returns before its output is added, proposals go on meanwhile from the last snapshot, outputs
land in close order (the same cache bytes as inline upkeep), a failed add is counted and the upkeep
goes on, and many threads closing and proposing together lose nothing. `Proposer.close_sessions`
closes many sessions with one add, keeping what closing them one by one keeps, either way."""

import threading

import numpy as np
import pytest

from suffixspec import BadInputError, Proposer, ResponseCache

RNG = np.random.default_rng(7)
TEXT = RNG.integers(0, 300, 6000).astype(np.int32)


def _outputs(n, length=120):
    return [TEXT[(i * 97) % 5000 : (i * 97) % 5000 + length] for i in range(n)]


def _close_all(proposer, outputs):
    for i, out in enumerate(outputs):
        s = proposer.start(TEXT[i : i + 16])
        s.extend(out)
        s.propose(8)
        s.close()


class GatedCache(ResponseCache):
    """A cache whose adds wait for `gate`; the document equal to `poison` raises."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.gate = threading.Event()
        self.poison = None
        self.entered = threading.Event()
        self.batches = []  # the documents of each add, in call order

    def add_many(self, documents):
        documents = list(documents)
        self.entered.set()
        self.batches.append(len(documents))
        assert self.gate.wait(30)
        if self.poison is not None and any(np.array_equal(np.asarray(d), self.poison) for d in documents):
            raise RuntimeError("poisoned document")
        super().add_many(documents)


def test_background_upkeep_adds_in_close_order_the_same_cache_as_inline():
    outputs = _outputs(40)
    inline, background = Proposer(), Proposer(cache_upkeep="background")
    _close_all(inline, outputs)
    _close_all(background, outputs)
    assert background.wait_cache(60)
    assert background.cache_upkeep_failures == 0
    assert background.cache.to_bytes() == inline.cache.to_bytes()
    # what was added drafts: a prompt ending inside a closed output proposes its continuation
    s = background.start(outputs[3][:40])
    assert outputs[3][40] in set(s.propose(16).tokens.tolist())


def test_close_returns_before_the_add_and_proposals_go_on_meanwhile():
    p = Proposer(cache_upkeep="background")
    p.cache = gated = GatedCache()
    gated.gate.set()
    _close_all(p, _outputs(2))  # a snapshot with something in it
    assert p.wait_cache(30)
    before = len(gated)
    gated.gate.clear()
    gated.entered.clear()
    out = _outputs(3)[2]
    s = p.start(TEXT[:16])
    s.extend(out)
    s.close()  # returns although the add is held at the gate
    assert gated.entered.wait(30)
    assert not p.wait_cache(0.05) and len(gated) == before
    other = p.start(_outputs(1)[0][:30])
    assert len(other.propose(16)) > 0  # the last snapshot serves while the add waits
    gated.gate.set()
    assert p.wait_cache(30) and len(gated) == before + len(out)


def test_a_failed_add_is_counted_and_the_upkeep_goes_on():
    p = Proposer(cache_upkeep="background")
    p.cache = gated = GatedCache()
    outputs = _outputs(4)
    gated.poison = outputs[1]
    gated.gate.set()
    _close_all(p, outputs)
    assert p.wait_cache(30)
    assert p.cache_upkeep_failures == 1
    assert len(gated) == sum(len(o) for i, o in enumerate(outputs) if i != 1)


def test_threads_closing_and_proposing_together_lose_nothing():
    p = Proposer(cache_upkeep="background")
    outputs = _outputs(64, length=200)
    errors = []

    def work(k):
        try:
            for i in range(k, len(outputs), 4):
                s = p.start(TEXT[i : i + 24])
                for a in range(0, 200, 50):
                    s.propose(16)
                    s.extend(outputs[i][a : a + 50])
                s.close()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert p.wait_cache(60) and p.cache_upkeep_failures == 0
    assert len(p.cache) == sum(len(o) for o in outputs)  # every output, whole (no rotation at this size)
    for out in outputs[::8]:  # and each one drafts its own continuation
        assert out[30] in set(p.start(out[:30]).propose(16).tokens.tolist())


def test_an_unknown_upkeep_mode_is_refused():
    with pytest.raises(BadInputError, match="cache_upkeep: expected 'inline' or 'background', got 'later'"):
        Proposer(cache_upkeep="later")


def _open_all(proposer, outputs):
    sessions = []
    for i, out in enumerate(outputs):
        s = proposer.start(TEXT[i : i + 16])
        s.propose(8)
        s.extend(out)
        sessions.append(s)
    return sessions


def _documents(cache):
    """Each generation's documents, oldest first: the frozen ones one by one, the live one whole."""
    return [[d.tolist() for d in g] for g in cache.documents()]


@pytest.mark.parametrize("upkeep", ["inline", "background"])
def test_close_sessions_keeps_what_closing_one_by_one_keeps_in_one_add(upkeep):
    """Sessions closed together: the same documents in the same generations (a rotation among them),
    the same learned counts, one add for all; closed sessions then draft nothing and refuse tokens,
    and closing them again adds nothing."""
    outputs = _outputs(10) + [TEXT[:0]]  # and one session that committed nothing
    one = Proposer(cache_tokens=4 * 700, cache_generations=4, cache_upkeep=upkeep)
    together = Proposer(cache_tokens=4 * 700, cache_generations=4, cache_upkeep=upkeep)
    one.cache = GatedCache(4 * 700, 4)
    together.cache = gated = GatedCache(4 * 700, 4)
    one.cache.gate.set()
    gated.gate.set()
    for s in _open_all(one, outputs):
        s.close()
    sessions = _open_all(together, outputs)
    together.close_sessions(sessions)
    assert one.wait_cache(60) and together.wait_cache(60)
    assert gated.batches == [10] and len(one.cache.batches) == 10
    assert len(together.cache._frozen) == 1  # 10 x 120 tokens fill the 700-token generation once
    assert _documents(together.cache) == _documents(one.cache)
    assert np.array_equal(together.learned(), one.learned())
    assert len(sessions[0].propose(8)) == 0
    with pytest.raises(BadInputError):
        sessions[0].extend([1])
    together.close_sessions(sessions)
    sessions[1].close()
    assert together.wait_cache(60) and gated.batches == [10]
    # what was added drafts: a prompt ending inside a closed output proposes its continuation
    assert outputs[9][40] in set(together.start(outputs[9][:40]).propose(16).tokens.tolist())
