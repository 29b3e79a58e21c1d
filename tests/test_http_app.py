"""The HTTP app and the engine loop in this process (no server process): a request that fails inside
the engine answers 500 alone while the others go on; an engine thread that dies, or one step that
stalls, turns /health to 503 and fails the requests in flight."""

import asyncio
import threading
import time

import httpx
import pytest

from support.http import make_tiny_model_dir


class Boom:
    """A logits processor that raises: the request using it fails inside the round."""

    def __call__(self, input_ids, scores):
        raise RuntimeError("boom")


@pytest.fixture(scope="module")
def app_state(tmp_path_factory):
    from suffixspec import SpeculativeGenerator, load_model
    from suffixspec.http.app import AppState
    from suffixspec.http.engine_loop import EngineLoop
    from suffixspec.http.protocol import ModelContext

    from support import tiny_models  # noqa: F401  (one torch thread)

    model_dir = make_tiny_model_dir(tmp_path_factory.mktemp("http_app") / "tiny")
    model, tokenizer = load_model(str(model_dir))
    gen = SpeculativeGenerator(model, tokenizer)
    server = gen.serve(max_batch=4)
    state = AppState(["tiny"])
    state.ctx = ModelContext(names=["tiny"], tokenizer=tokenizer, vocab_size=server.vocab_size,
                             max_positions=server.max_positions, max_new_tokens_limit=256,
                             eos=frozenset(server.decoding.eos))
    state.engine = EngineLoop(server, metrics=state.metrics)
    state.engine.start()
    yield state, gen, tokenizer
    state.engine.stop()


def test_a_request_failing_in_the_engine_answers_500_alone(app_state, monkeypatch):
    from suffixspec.http import protocol
    from suffixspec.http.app import create_app

    state, gen, tokenizer = app_state
    real = protocol.parse_request

    def parse(body, kind, ctx):
        req = real(body, kind, ctx)
        if "FAIL" in str(body.get("prompt")):
            req.options = req.options.replace(logits_processor=[Boom()])
        return req

    monkeypatch.setattr(protocol, "parse_request", parse)
    prompts = ["def ok_one(x):\n", "FAIL here\n", "def ok_two(y):\n"]

    async def go():
        transport = httpx.ASGITransport(app=create_app(state))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            return await asyncio.gather(*(http.post("/v1/completions", json={
                "model": "tiny", "prompt": p, "max_tokens": 20, "temperature": 0}) for p in prompts))

    ok1, failed, ok2 = asyncio.run(go())
    assert failed.status_code == 500, failed.text
    err = failed.json()["error"]
    assert err["code"] == "engine_error" and "boom" in err["message"] and "Traceback" not in failed.text
    for r, p in ((ok1, prompts[0]), (ok2, prompts[2])):
        assert r.status_code == 200
        out = gen.generate([p], max_new_tokens=20).sequences[0]
        eos = tokenizer.eos_token_id
        assert r.json()["choices"][0]["text"] == tokenizer.decode(out[:-1] if out[-1] == eos else out)
    assert state.engine.health() == (True, "ok")


class FakeEngine:
    """Just enough of `engine.engine.Engine` for the loop: `step` runs `on_step`."""

    def __init__(self, on_step):
        from suffixspec.engine.stats import GenerationStats, RequestStats

        self.on_step = on_step
        self.stats = GenerationStats(requests=[])
        self._rs = RequestStats
        self.queued = []
        self.running = 0

    @property
    def idle(self):
        return not self.queued

    @property
    def waiting(self):
        return len(self.queued)

    def add(self, prompt, **kw):
        self.queued.append(len(self.queued))
        return self.queued[-1]

    def step(self):
        return self.on_step()

    def finished(self, index):
        return False

    def upkeep(self):
        pass

    def cancel(self, index):
        return True


def _request():
    from suffixspec.engine.options import DecodeOptions
    from suffixspec.http.protocol import GenerationRequest, PromptInput

    return GenerationRequest("completion", "m", [PromptInput([1, 2], None)], 4, DecodeOptions(max_new_tokens=4))


def test_a_dead_engine_thread_fails_its_requests_and_health():
    from suffixspec.http.engine_loop import EngineLoop, Final, Handle

    def explode():
        raise MemoryError("no room")

    loop = EngineLoop(FakeEngine(explode))
    loop.start()
    assert loop.health() == (True, "ok")

    async def go():
        handle = Handle(_request())
        loop.submit(handle)
        await handle.wait_accepted()
        return [item async for item in handle.events()]

    events = asyncio.run(asyncio.wait_for(go(), 10))
    assert isinstance(events[-1], Final) and events[-1].reason == "error" and "no room" in events[-1].error
    ok, reason = loop.health()
    assert not ok and "MemoryError" in reason
    from suffixspec.http.protocol import APIError

    with pytest.raises(APIError) as info:
        loop.submit(Handle(_request(), asyncio.new_event_loop()))
    assert info.value.status == 503


def test_a_stalled_step_turns_health_503():
    from suffixspec.http.engine_loop import EngineLoop, Handle

    release = threading.Event()

    def slow():
        release.wait(10)
        raise SystemExit  # ends the thread once the test is done

    loop = EngineLoop(FakeEngine(slow), stall_s=0.2)
    loop.start()
    asyncio_loop = asyncio.new_event_loop()
    loop.submit(Handle(_request(), asyncio_loop))
    deadline = time.monotonic() + 10
    while loop.health()[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    ok, reason = loop.health()
    release.set()
    assert not ok and "stall limit" in reason
    asyncio_loop.close()


def test_requests_close_behind_each_other_at_an_idle_engine_join_one_admission():
    """Woken from idle, the engine thread takes the requests that follow within `gather_s` of the
    previous one before its step (one prefill for a burst); with no window each one steps alone."""
    from types import SimpleNamespace

    from suffixspec.http.engine_loop import EngineLoop, Handle

    for gather_s, first_step in ((1.0, 3), (0.0, 1)):
        seen = []

        def step():
            seen.append(len(server.queued))
            server.queued.clear()
            return SimpleNamespace(events=[], admitted=[])

        server = FakeEngine(step)
        loop = EngineLoop(server, gather_s=gather_s, gather_max_s=3.0)
        loop.start()
        asyncio_loop = asyncio.new_event_loop()
        for k in range(3):
            if k:
                time.sleep(0.2)  # well inside the 1 s window, far beyond none
            loop.submit(Handle(_request(), asyncio_loop))
        deadline = time.monotonic() + 10
        while sum(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        loop.stop()
        asyncio_loop.close()
        assert sum(seen) == 3 and seen[0] == first_step, (gather_s, seen)


def test_an_idle_engine_waits_for_requests_still_being_parsed():
    """Handlers announce a request on arrival (`expect`) and `arrived` after submitting it: woken
    by the first of a burst, the idle engine thread waits for the announced ones (no time window
    needed), and without announcements steps at once."""
    from types import SimpleNamespace

    from suffixspec.http.engine_loop import EngineLoop, Handle

    for announce, first_step in ((True, 3), (False, 1)):
        seen = []

        def step():
            seen.append(len(server.queued))
            server.queued.clear()
            return SimpleNamespace(events=[], admitted=[])

        server = FakeEngine(step)
        loop = EngineLoop(server, gather_s=0.0, gather_max_s=3.0)
        loop.start()
        asyncio_loop = asyncio.new_event_loop()
        if announce:
            for _ in range(3):
                loop.expect()
        for k in range(3):
            if k:
                time.sleep(0.2)  # a handler still parsing its request
            loop.submit(Handle(_request(), asyncio_loop))
            if announce:
                loop.arrived()
        deadline = time.monotonic() + 10
        while sum(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        loop.stop()
        asyncio_loop.close()
        assert sum(seen) == 3 and seen[0] == first_step, (announce, seen)
