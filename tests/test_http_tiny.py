"""`suffixspec serve` on a tiny random-weight Qwen2 model (a byte-level tokenizer with Qwen-style FIM
tokens and a chat template of its own), talked to with the official `openai` client and raw `httpx`.
Two server processes for the module, started together: the main one (an API key, 8 slots) and a
limited one (one slot, a queue of two: 429 with Retry-After, then SIGTERM drains it). References come
from the same model directory loaded in this process (`SpeculativeGenerator.generate`, and plain
decoding with budget 0)."""

import asyncio
import json
import signal
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.http import ServerProcess, make_tiny_model_dir

KEY = "test-key-123"
PROMPTS = [f"def f{i}(x, y):\n    return x * {i} + y\n\nclass C{i}:\n" for i in range(32)]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Both servers of the module, started together (their start-ups overlap): the main one (API key,
    8 slots) and a limited one (one slot, a queue of two, for 429 and the drain)."""
    from suffixspec import SpeculativeGenerator, load_model

    from support import tiny_models  # noqa: F401  (one torch thread, as the servers)

    root = tmp_path_factory.mktemp("http_tiny")
    model_dir = make_tiny_model_dir(root / "tiny")
    main = ServerProcess(["--model", str(model_dir), "--api-key", KEY, "--max-batch", "8"], root / "server.log",
                         wait=False)
    limited = ServerProcess(["--model", str(model_dir), "--max-batch", "1", "--max-queue", "2",
                             "--grace-period", "60"], root / "limited.log", wait=False)
    try:
        model, tokenizer = load_model(str(model_dir))
        gen = SpeculativeGenerator(model, tokenizer)
        main.wait_ready()
        limited.wait_ready()
        yield main, limited, gen, tokenizer, model_dir
    finally:
        limited.stop()
        code = main.stop()
    assert code == 0, main.log()


@pytest.fixture(scope="module")
def tiny(servers):
    main, _, gen, tokenizer, model_dir = servers
    return main, gen, tokenizer, model_dir


@pytest.fixture(scope="module")
def limited(servers):
    return servers[1]


def client(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, **kw)


def local_text(gen, tokenizer, ids, **kw):
    out = gen.generate([ids], **kw).sequences[0]
    eos = tokenizer.eos_token_id
    return tokenizer.decode(out[:-1] if out and out[-1] == eos else out)


def test_models_auth_and_health(tiny):
    server = tiny[0]
    assert httpx.get(server.url + "/health").status_code == 200  # open without the key
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.get(server.url + "/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(server.url + "/v1/completions", headers=headers, json={"model": "tiny", "prompt": "x"})
        assert r.status_code == 401
    assert httpx.get(server.url + "/metrics").status_code == 401
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_greedy_equals_generate_and_plain_decoding(tiny):
    server, gen, tokenizer, _ = tiny
    c = client(server)
    for prompt in PROMPTS[:3]:
        r = c.completions.create(model="tiny", prompt=prompt, max_tokens=40, temperature=0)
        ids = tokenizer.encode(prompt)
        assert r.usage.prompt_tokens == len(ids)
        assert r.choices[0].text == local_text(gen, tokenizer, ids, max_new_tokens=40)
        assert r.choices[0].text == local_text(gen, tokenizer, ids, max_new_tokens=40, budget=0)
        assert r.choices[0].finish_reason in ("length", "stop")
        extra = r.usage.model_extra["suffixspec"]
        assert extra["rounds"] >= 1 and extra["verifier_ms"] > 0


def test_seeded_sampling_equals_in_process(tiny):
    server, gen, tokenizer, _ = tiny
    c = client(server)
    ids = tokenizer.encode(PROMPTS[5])
    r = c.completions.create(model="tiny", prompt=PROMPTS[5], max_tokens=40, temperature=0.8, top_p=0.9, seed=7)
    local = local_text(gen, tokenizer, ids, max_new_tokens=40, do_sample=True, temperature=0.8, top_p=0.9, seed=7)
    assert r.choices[0].text == local
    other = local_text(gen, tokenizer, ids, max_new_tokens=40, do_sample=True, temperature=0.8, top_p=0.9, seed=8)
    assert other != local  # the seed matters: the equality above is not a coincidence


def test_streamed_chunks_join_to_the_non_streamed_text(tiny):
    server, _, tokenizer, _ = tiny
    c = client(server)
    whole = c.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=60, temperature=0)
    chunks = list(c.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=60, temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    texts = [ch.choices[0].text for ch in chunks if ch.choices]
    assert "".join(texts) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 60
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == whole.choices[0].finish_reason
    rounds = chunks[-1].usage.model_extra["suffixspec"]["rounds"]
    assert len([t for t in texts if t]) <= rounds  # one chunk per round at most: several tokens per chunk

    messages = [{"role": "user", "content": "Rewrite: " + PROMPTS[2]}]
    whole = c.chat.completions.create(model="tiny", messages=messages, max_tokens=50, temperature=0)
    stream = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=50, temperature=0,
                                            stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in stream) == whole.choices[0].message.content
    assert stream[-1].usage.completion_tokens == whole.usage.completion_tokens  # usage in the last chunk


def test_chat_uses_the_models_template(tiny):
    server, gen, tokenizer, model_dir = tiny
    from suffixspec.http.chat import ChatTemplate, find_chat_template

    source, where = find_chat_template(str(model_dir))
    assert where.endswith("tokenizer_config.json") and "tiny" in source
    messages = [{"role": "user", "content": "hello there"}]
    text = ChatTemplate(source).render(messages)
    r = client(server).chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
    ids = tokenizer.encode(text)
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.content == local_text(gen, tokenizer, ids, max_new_tokens=20)


def test_stop_strings_are_cut_and_end_the_request(tiny):
    server, gen, tokenizer, _ = tiny
    c = client(server)
    full = c.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=60, temperature=0).choices[0].text
    stop = next(full[i : i + 2] for i in range(8, len(full) - 2) if full[i : i + 2].strip() and
                full.find(full[i : i + 2]) == i)
    cut = full[: full.index(stop)]
    r = c.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=60, temperature=0, stop=[stop])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = list(c.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=60, temperature=0, stop=stop,
                                         stream=True))
    assert "".join(ch.choices[0].text for ch in streamed) == cut
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_logit_bias_and_budget_extension(tiny):
    server, gen, tokenizer, _ = tiny
    c = client(server)
    tok = tokenizer.encode(" return")[0]
    r = c.completions.create(model="tiny", prompt=PROMPTS[4], max_tokens=10, temperature=0, logit_bias={str(tok): 100})
    assert r.choices[0].text == tokenizer.decode([tok] * 10)
    plain = c.completions.create(model="tiny", prompt=PROMPTS[4], max_tokens=30, temperature=0,
                                 extra_body={"suffixspec": {"budget": 0}})
    spec = c.completions.create(model="tiny", prompt=PROMPTS[4], max_tokens=30, temperature=0)
    assert plain.choices[0].text == spec.choices[0].text
    assert plain.usage.model_extra["suffixspec"]["drafted"] == 0
    assert plain.usage.model_extra["suffixspec"]["rounds"] == plain.usage.completion_tokens > 1  # one token a round


def test_recycle_extension_keeps_greedy_output(tiny):
    server, gen, tokenizer, _ = tiny
    c = client(server)
    plain = c.completions.create(model="tiny", prompt=PROMPTS[6], max_tokens=30, temperature=0,
                                 extra_body={"suffixspec": {"budget": 0}})
    texts = []
    for _ in range(2):  # the second request drafts from what the first one's passes left in the table
        r = c.completions.create(model="tiny", prompt=PROMPTS[6], max_tokens=30, temperature=0,
                                 extra_body={"suffixspec": {"budget": 8, "recycle": True}})
        texts.append(r.choices[0].text)
        assert r.usage.model_extra["suffixspec"]["drafted"] > 0
    off = c.completions.create(model="tiny", prompt=PROMPTS[6], max_tokens=30, temperature=0,
                               extra_body={"suffixspec": {"recycle": False}})
    assert texts == [plain.choices[0].text] * 2 and off.choices[0].text == plain.choices[0].text


def test_fill_in_the_middle(tiny):
    server, gen, tokenizer, _ = tiny
    from suffixspec.http.fim import fim_prompt, fim_tokens

    prefix, suffix = "def area(w, h):\n    ", "\n    return result\n"
    r = client(server).completions.create(model="tiny", prompt=prefix, suffix=suffix, max_tokens=30, temperature=0)
    ids = fim_prompt(tokenizer, fim_tokens(tokenizer), prefix, suffix)
    assert ids[0] == tokenizer.backend.token_to_id("<|fim_prefix|>")
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].text == local_text(gen, tokenizer, ids, max_new_tokens=30)


BAD = [
    (b"{not json", "invalid_json", None),
    ({"model": "tiny", "prompt": 5}, "invalid_type", "prompt"),
    ({"model": "nope", "prompt": "x"}, "model_not_found", "model"),
    ({"model": "tiny", "prompt": ""}, "invalid_value", "prompt"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 600}, "context_length_exceeded", "max_tokens"),
    ({"model": "tiny", "prompt": [1, 2, 100000]}, "invalid_value", "prompt"),
    ({"model": "tiny", "prompt": "x", "temperature": -1}, "invalid_value", "temperature"),
    ({"model": "tiny", "prompt": "x", "top_p": 0}, "invalid_value", "top_p"),
    ({"model": "tiny", "prompt": "x", "top_p": 1.01}, "invalid_value", "top_p"),
    ({"model": "tiny", "prompt": "x", "max_tokens": "5"}, "invalid_type", "max_tokens"),
    ({"model": "tiny", "prompt": "x", "stream": "yes"}, "invalid_type", "stream"),
    ({"model": "tiny", "prompt": "x", "n": 0}, "invalid_value", "n"),
    ({"model": "tiny", "prompt": "x", "n": 17}, "invalid_value", "n"),
    ({"model": "tiny", "prompt": "x", "logprobs": 21}, "invalid_value", "logprobs"),
    ({"model": "tiny", "prompt": "x", "n": 3, "best_of": 2}, "invalid_value", "best_of"),
    ({"model": "tiny", "prompt": "x", "frequency_penalty": 2.5}, "invalid_value", "frequency_penalty"),
    ({"model": "tiny", "prompt": "x", "tools": [{"type": "function"}]}, "unsupported_parameter", "tools"),
    ({"model": "tiny", "prompt": "x", "no_such_field": 1}, "unsupported_parameter", "no_such_field"),
    ({"model": "tiny", "prompt": "x", "response_format": {"type": "json_schema",
                                                           "json_schema": {"name": "a", "schema": {"type": "nope"}}}},
     "invalid_value", "response_format"),
    ({"model": "tiny", "prompt": "x", "seed": -4}, "invalid_value", "seed"),
    ({"model": "tiny", "prompt": "x", "suffixspec": {"recycle": "yes"}}, "invalid_type", "suffixspec.recycle"),
    ({"model": "tiny", "prompt": "x", "suffixspec": {"recycled": True}}, "invalid_value", "suffixspec"),
    ([1, 2], "invalid_type", None),
]


def test_bad_requests_answer_400_with_an_error_object(tiny):
    server = tiny[0]
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        for body, code, param in BAD:
            for path in ("/v1/completions",):
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                r = http.post(path, content=content, headers={"Content-Type": "application/json"})
                assert r.status_code == 400, (body, r.text)
                err = r.json()["error"]
                assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
                assert err["code"] == code and err["param"] == param, (body, err)
                assert "Traceback" not in r.text
        chat_bad = [({"model": "tiny", "messages": []}, "messages"), ({"model": "tiny", "messages": "hi"}, "messages"),
                    ({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
                    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
                     "max_completion_tokens"),
                    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
                     "top_logprobs"),
                    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "logprobs": True,
                      "top_logprobs": 21}, "top_logprobs")]
        for body, param in chat_bad:
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert http.get("/v1/nothing").status_code == 404
        assert http.get("/health").status_code == 200  # nothing stuck, still serving
        r = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


async def _stream_text(http, prompt, max_tokens, drop_after=None, budget=None):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if budget is not None:
        body["suffixspec"] = {"budget": budget}
    text, reason, seen = [], None, 0
    async with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return "".join(text), reason
            chunk = json.loads(line[6:])
            text.append(chunk["choices"][0]["text"])
            reason = chunk["choices"][0]["finish_reason"] or reason
            seen += 1
            if drop_after is not None and seen >= drop_after:
                return None, "dropped"  # leaving the block closes the connection mid-stream
    raise AssertionError("stream ended without [DONE]")


def _metric(server, name, labels=None):
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                total += s.value
    return total


def test_32_concurrent_streams_and_a_disconnect_storm(tiny):
    server = tiny[0]
    c = client(server)
    refs = [c.completions.create(model="tiny", prompt=p, max_tokens=24, temperature=0).choices[0].text
            for p in PROMPTS]
    cancelled_before = _metric(server, "suffixspec_requests_finished_total", {"reason": "cancelled"})

    async def run(storm: bool):
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120,
                                     limits=limits) as http:
            jobs = []
            for i, p in enumerate(PROMPTS):
                if storm and i % 2:  # long and plain (one token a round): surely still running when dropped
                    jobs.append(_stream_text(http, p, 400, drop_after=2, budget=0))
                else:
                    jobs.append(_stream_text(http, p, 24))
            return await asyncio.gather(*jobs)

    got = asyncio.run(run(storm=False))
    assert [g[0] for g in got] == refs  # every request completed, nothing lost or duplicated
    got = asyncio.run(run(storm=True))
    for i, (text, reason) in enumerate(got):
        if i % 2:
            assert reason == "dropped"
        else:
            assert text == refs[i], i
    assert httpx.get(server.url + "/health").status_code == 200
    # every dropped stream was cancelled inside the engine and its slot freed
    for _ in range(100):
        if _metric(server, "suffixspec_running_requests") == 0:
            break
        time.sleep(0.05)
    assert _metric(server, "suffixspec_running_requests") == 0 and _metric(server, "suffixspec_queue_depth") == 0
    assert _metric(server, "suffixspec_requests_finished_total", {"reason": "cancelled"}) - cancelled_before == 16
    # the freed slots serve new requests: 8 at once (the batch) come back right
    again = asyncio.run(run(storm=False))
    assert [g[0] for g in again] == refs


def test_metrics_parse(tiny):
    server = tiny[0]
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("suffixspec_http_requests", "suffixspec_requests_finished", "suffixspec_queue_depth",
                 "suffixspec_running_requests", "suffixspec_ttft_seconds", "suffixspec_tpot_seconds",
                 "suffixspec_e2e_seconds", "suffixspec_tokens_per_round", "suffixspec_acceptance_rate",
                 "suffixspec_drafted_tokens", "suffixspec_accepted_tokens", "suffixspec_speculation_share",
                 "suffixspec_proposer_seconds", "suffixspec_verifier_seconds", "suffixspec_admission_steps",
                 "suffixspec_admitted_requests"):
        assert name in families, name
    assert _metric(server, "suffixspec_http_requests_total", {"endpoint": "/v1/completions", "status": "200"}) > 0
    assert _metric(server, "suffixspec_ttft_seconds_count") > 0
    assert _metric(server, "suffixspec_verifier_seconds_total") > 0
    assert 0 <= _metric(server, "suffixspec_speculation_share") <= 1


def test_requests_still_being_read_join_the_idle_engines_first_admission(tiny):
    """Four requests reach an idle server together, but their bodies come 5 ms apart (more than the
    3 ms the engine waits behind a request, and 15 ms in all: well inside the 50 ms it waits at most,
    so a slow host's late wake-ups do not split the burst): the engine, told by the handlers that requests are on
    their way, waits for them and admits all four in one step (one prefill), as requests added
    together in-process are. Counted by the admission metrics; three such bursts."""
    server = tiny[0]
    for _ in range(200):  # idle: nothing running or waiting from earlier tests
        if _metric(server, "suffixspec_running_requests") == 0 and _metric(server, "suffixspec_queue_depth") == 0:
            break
        time.sleep(0.05)

    async def burst():
        gates = [asyncio.Event() for _ in range(4)]

        async def send(i, http):
            async def content():
                await gates[i].wait()
                yield json.dumps({"model": "tiny", "prompt": PROMPTS[i], "max_tokens": 4, "temperature": 0,
                                  "suffixspec": {"budget": 0}}).encode()

            return await http.post("/v1/completions", content=content(), headers={"content-type": "application/json"})

        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"},
                                     timeout=120) as http:
            jobs = [asyncio.create_task(send(i, http)) for i in range(4)]
            await asyncio.sleep(0.5)  # the headers are in: every handler has started, waiting for its body
            for gate in gates:
                gate.set()
                await asyncio.sleep(0.005)
            return await asyncio.gather(*jobs)

    steps = []
    for _ in range(3):
        before = (_metric(server, "suffixspec_admission_steps_total"),
                  _metric(server, "suffixspec_admitted_requests_total"))
        answers = asyncio.run(burst())
        assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
        assert _metric(server, "suffixspec_admitted_requests_total") - before[1] == 4
        steps.append(_metric(server, "suffixspec_admission_steps_total") - before[0])
    print("admission steps per burst:", steps)
    # one burst in three may split in two (seen in about one run in three on a 2-core host, with either
    # cache upkeep, cause not found: a pause of the server process past the 50 ms wait); with the
    # handlers' announcements off every burst splits (2-4 steps each)
    assert steps.count(1) >= 2 and sum(steps) <= 4, steps


# ----------------------------------------------------------------------------------- limits (one slot, queue 2)

LIMIT_PROMPT = "def g(a):\n    return a + 1\n"


def body(max_tokens, stream=True, budget=0):
    return {"model": "tiny", "prompt": LIMIT_PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "suffixspec": {"budget": budget}}


def lines_of(response):
    """One line iterator per response: leaving an `aiter_lines` loop early closes the connection."""
    if not hasattr(response, "_test_lines"):
        response._test_lines = response.aiter_lines()
    return response._test_lines


async def read_rest(response):
    """The text chunks and finish reason of an SSE response, up to [DONE]."""
    texts, reason = [], None
    async for line in lines_of(response):
        if line == "data: [DONE]":
            return "".join(texts), reason
        if line.startswith("data: "):
            chunk = json.loads(line[6:])
            texts.append(chunk["choices"][0]["text"])
            reason = chunk["choices"][0]["finish_reason"] or reason
    raise AssertionError("no [DONE]")


async def first_chunk(response):
    lines = lines_of(response)
    while True:
        line = await lines.__anext__()
        if line.startswith("data: "):
            return json.loads(line[6:])["choices"][0]["text"]


def test_429_beyond_the_queue_and_nothing_accepted_is_dropped(limited):
    async def scenario():
        async with httpx.AsyncClient(base_url=limited.url, timeout=120) as http:
            async with http.stream("POST", "/v1/completions", json=body(450)) as r1:  # takes the one slot
                first = await first_chunk(r1)
                async with http.stream("POST", "/v1/completions", json=body(20)) as r2, \
                        http.stream("POST", "/v1/completions", json=body(20)) as r3:  # fill the queue of 2
                    assert r2.status_code == r3.status_code == 200
                    r4 = await http.post("/v1/completions", json=body(5, stream=False))
                    assert r4.status_code == 429, r4.text
                    assert r4.headers["Retry-After"].isdigit()
                    assert r4.json()["error"]["type"] == "rate_limit_error"
                    rest1 = await read_rest(r1)
                    done2, done3 = await read_rest(r2), await read_rest(r3)
            whole = await http.post("/v1/completions", json=body(20, stream=False))
            return first, rest1, done2, done3, whole.json()

    first, rest1, done2, done3, whole = asyncio.run(scenario())
    assert rest1[1] == "length"
    assert done2 == done3 == (whole["choices"][0]["text"], "length")  # the queued ones ran, unchanged


def test_sigterm_drains_then_exits_zero(limited):
    async def scenario():
        async with httpx.AsyncClient(base_url=limited.url, timeout=120) as http:
            async with http.stream("POST", "/v1/completions", json=body(300)) as r1:
                first = await first_chunk(r1)
                limited.proc.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 30
                while (await http.get("/health")).status_code == 200:
                    assert time.monotonic() < deadline, "health never went 503 after SIGTERM"
                    await asyncio.sleep(0.02)
                refused = await http.post("/v1/completions", json=body(5, stream=False))
                assert limited.proc.poll() is None  # still serving the request in flight
                text, reason = await read_rest(r1)
            return first + text, reason, refused

    text, reason, refused = asyncio.run(scenario())
    assert refused.status_code == 503 and refused.json()["error"]["code"] in ("draining", "unavailable")
    assert reason == "length" and text
    assert limited.proc.wait(60) == 0, limited.log()
    assert "drained" in limited.log()
