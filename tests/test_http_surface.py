"""The OpenAI surface beyond plain text, against a real `suffixspec serve` process on a tiny random
Qwen2 model (byte-level tokenizer), with the official `openai` client and raw `httpx`: logprobs (equal
to the model's own, computed here by one forward pass), `n` and `best_of`, `echo`, prompt batches,
penalties and vLLM's sampling extensions (speculative output equal to plain decoding's through the
same server), structured output (every finished answer parses and validates), the model card, nulls
as absent, and the stream's shape invariants."""

import json

import httpx
import jsonschema
import numpy as np
import openai
import pytest
import torch

from support.http import ServerProcess, make_tiny_model_dir

PROMPTS = [f"def f{i}(x, y):\n    return x * {i} + y\n\nclass C{i}:\n" for i in range(8)]
CHAT = [{"role": "user", "content": "def g(x):\n    return x + 1\n"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from suffixspec import load_model

    from support import tiny_models  # noqa: F401  (one torch thread, as the server)

    root = tmp_path_factory.mktemp("http_surface")
    model_dir = make_tiny_model_dir(root / "tiny")
    server = ServerProcess(["--model", str(model_dir), "--max-batch", "16"], root / "server.log", wait=False)
    try:
        model, tokenizer = load_model(str(model_dir))
        server.wait_ready()
        yield server, model, tokenizer
    finally:
        code = server.stop()
    assert code == 0, server.log()


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=120)


def stream_events(server, path, body):
    """Every `data:` object of a stream, then whether it ended with [DONE]."""
    events, done = [], False
    with httpx.stream("POST", server.url + path, json=dict(body, stream=True), timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            assert not done, "data after [DONE]"
            events.append(json.loads(line[6:]))
    return events, done


def token_ids_of(tokens, tokenizer):
    """The ids of completions-logprobs token strings (text, or `bytes:\\xNN..` for part of a character)."""
    by_bytes = {}
    for i in range(tokenizer.vocab_size):
        try:
            by_bytes.setdefault(tokenizer.token_bytes(i), i)
        except ValueError:
            pass

    def raw(token):
        if token.startswith("bytes:"):
            return bytes(int(h, 16) for h in token[6:].split("\\x")[1:])
        return token.encode()

    return [by_bytes[raw(t)] for t in tokens]


def reference_logprobs(model, prompt_ids, output_ids):
    """log_softmax of one plain forward pass over prompt + output, at each output position."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt_ids + output_ids])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return [float(logp[len(prompt_ids) - 1 + i, t]) for i, t in enumerate(output_ids)]


# ----------------------------------------------------------------------------------- completions


@pytest.mark.parametrize("stream", [False, True])
def test_completions_matrix_keeps_its_shape_invariants(served, stream):
    server, _, tokenizer = served
    for echo in (False, True):
        for logprobs in (None, 3):
            for prompt in (PROMPTS[0], [PROMPTS[1], PROMPTS[2]], tokenizer.encode(PROMPTS[3]),
                           [tokenizer.encode(PROMPTS[4]), tokenizer.encode(PROMPTS[5])]):
                for n in (1, 2):
                    body = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0.8, "seed": 5,
                            "n": n, "echo": echo, "logprobs": logprobs}
                    choices = collect_completion(server, body, stream)
                    prompts = prompt if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else [prompt]
                    assert sorted(choices) == list(range(len(prompts) * n)), (body, sorted(choices))
                    for index, choice in choices.items():
                        source = prompts[index // n]
                        text = source if isinstance(source, str) else tokenizer.decode(source)
                        assert choice["text"].startswith(text) == echo or not echo
                        check_completion_logprobs(choice, logprobs, echo, len(tokenizer.encode(text)))


def collect_completion(server, body, stream):
    """{index: {"text", "logprobs" (merged), "finish_reason"}} of a whole or streamed answer."""
    if not stream:
        r = post(server, "/v1/completions", body)
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["usage"]["completion_tokens"] >= 0
        return {c["index"]: c for c in data["choices"]}
    events, done = stream_events(server, "/v1/completions", body)
    assert done
    out = {}
    for ev in events:
        if not ev["choices"]:
            continue
        (c,) = ev["choices"]  # one choice per chunk
        got = out.setdefault(c["index"], {"text": "", "logprobs": None, "finish_reason": None, "ends": 0})
        got["text"] += c["text"]
        if c["finish_reason"] is not None:
            got["ends"] += 1
            got["finish_reason"] = c["finish_reason"]
        if c["logprobs"] is not None:
            lp = got["logprobs"] or {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            for k in lp:
                lp[k] = lp[k] + c["logprobs"][k]
            got["logprobs"] = lp
    assert all(c["ends"] == 1 for c in out.values()), out  # exactly one finishing chunk per choice
    return out


def check_completion_logprobs(choice, logprobs, echo, prompt_tokens):
    lp = choice["logprobs"]
    if logprobs is None:
        assert lp is None
        return
    n = len(lp["tokens"])
    assert n == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert lp["text_offset"] == sorted(lp["text_offset"])
    if echo:
        assert n >= prompt_tokens and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for value, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        if value is None:
            continue
        assert value <= 0 and logprobs <= len(top) <= logprobs + 1
        assert max(top.values()) >= value - 1e-6


def test_logprobs_equal_the_models_own_greedy_and_sampled(served):
    server, model, tokenizer = served
    ids = tokenizer.encode(PROMPTS[6])
    for sampling in ({"temperature": 0}, {"temperature": 0.9, "seed": 11}):
        for stream in (False, True):
            body = {"model": "tiny", "prompt": ids, "max_tokens": 24, "logprobs": 2, **sampling}
            choice = collect_completion(server, body, stream)[0]
            r = post(server, "/v1/completions", dict(body, logprobs=0, echo=False, stream=False))
            lp = choice["logprobs"]
            out_ids = token_ids_of(lp["tokens"], tokenizer)
            assert tokenizer.decode(out_ids) == choice["text"]
            got = lp["token_logprobs"]
            ref = reference_logprobs(model, ids, out_ids)
            assert len(got) == len(ref) and np.max(np.abs(np.array(got) - np.array(ref))) < 1e-4, (got, ref)
            assert r.json()["choices"][0]["text"] == choice["text"]  # reproducible: the same seed, the same text


def test_echo_with_max_tokens_zero_scores_the_prompt(served):
    server, model, tokenizer = served
    ids = tokenizer.encode(PROMPTS[7])
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPTS[7], "max_tokens": 0, "echo": True,
                                         "logprobs": 1})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == PROMPTS[7] and r.json()["usage"]["completion_tokens"] == 0
    got = choice["logprobs"]["token_logprobs"]
    assert got[0] is None and len(got) == len(ids)
    ref = reference_logprobs(model, ids[:1], ids[1:])
    assert np.max(np.abs(np.array(got[1:]) - np.array(ref))) < 1e-4


def test_n_samples_are_the_seeded_requests_and_best_of_picks_the_likeliest(served):
    server, _, _ = served
    base = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 1.0, "seed": 3}
    many = post(server, "/v1/completions", dict(base, n=4, logprobs=0)).json()
    texts = [c["text"] for c in sorted(many["choices"], key=lambda c: c["index"])]
    one = post(server, "/v1/completions", base).json()["choices"][0]["text"]
    assert texts[0] == one  # sample 0 is the request with n = 1
    assert post(server, "/v1/completions", dict(base, n=4)).json()["choices"][3]["text"] == texts[3]
    assert len(set(texts)) > 1  # independent samples
    best = post(server, "/v1/completions", dict(base, n=1, best_of=4)).json()
    scores = [sum(c["logprobs"]["token_logprobs"]) for c in sorted(many["choices"], key=lambda c: c["index"])]
    assert best["choices"][0]["text"] == texts[int(np.argmax(scores))]
    assert best["usage"]["completion_tokens"] == many["usage"]["completion_tokens"]  # every sample is billed
    single = post(server, "/v1/completions", base).json()["usage"]["prompt_tokens"]
    assert many["usage"]["prompt_tokens"] == single  # the prompt counted once, however many samples


# ----------------------------------------------------------------------------------- chat


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_and_n(served, stream):
    server, model, tokenizer = served
    oai = client(server)
    kw = dict(model="tiny", messages=CHAT, max_tokens=8, temperature=0.7, seed=2, n=3, logprobs=True, top_logprobs=4)
    if not stream:
        res = oai.chat.completions.create(**kw)
        choices = {c.index: (c.message.content, c.logprobs.content, c.finish_reason) for c in res.choices}
    else:
        choices, roles, ends = {}, {}, {}
        for chunk in oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
            if not chunk.choices:
                assert chunk.usage is not None and chunk.usage.completion_tokens > 0
                continue
            (c,) = chunk.choices
            text, content, _ = choices.get(c.index, ("", [], None))
            if c.delta.role:
                roles[c.index] = c.delta.role
                assert not choices.get(c.index)  # the role comes first
            if c.finish_reason:
                ends[c.index] = ends.get(c.index, 0) + 1
            choices[c.index] = (text + (c.delta.content or ""), content + (c.logprobs.content if c.logprobs else []),
                                c.finish_reason)
        assert roles == {0: "assistant", 1: "assistant", 2: "assistant"} and ends == {0: 1, 1: 1, 2: 1}
    assert sorted(choices) == [0, 1, 2]
    for text, content, _ in choices.values():
        assert b"".join(bytes(item.bytes) for item in content).decode(errors="replace") == text
        for item in content:
            assert len(item.top_logprobs) == 4 and len({a.token for a in item.top_logprobs}) == 4
            assert item.logprob <= max(a.logprob for a in item.top_logprobs) + 1e-6


def test_nulls_count_as_absent_and_unknown_fields_are_refused(served):
    server, _, _ = served
    r = post(server, "/v1/chat/completions", {"model": "tiny", "messages": CHAT, "max_tokens": 3, "logprobs": None,
                                              "top_logprobs": None, "n": None, "response_format": None,
                                              "tools": None, "user": "u1", "metadata": {"a": "b"}})
    assert r.status_code == 200, r.text
    r = post(server, "/v1/chat/completions", {"model": "tiny", "messages": CHAT, "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


def test_model_card(served):
    server, _, _ = served
    card = client(server).models.retrieve("tiny")
    assert card.id == "tiny" and card.model_extra["max_model_len"] == 512
    r = httpx.get(server.url + "/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


# ----------------------------------------------------------------------------------- exactness


PARAMS = [{"frequency_penalty": 1.2, "presence_penalty": 0.4}, {"repetition_penalty": 1.3},
          {"min_tokens": 10, "stop_token_ids": [5]}, {"ignore_eos": True}, {"min_p": 0.2},
          {"logit_bias": {"7": 5}}]


@pytest.mark.parametrize("params", PARAMS)
def test_speculative_output_equals_plain_with_every_parameter(served, params):
    server, _, _ = served
    for sampling in ({"temperature": 0}, {"temperature": 0.9, "seed": 4}):
        body = {"model": "tiny", "prompt": PROMPTS[1] + PROMPTS[1], "max_tokens": 24, "logprobs": 1,
                **sampling, **params}
        spec = post(server, "/v1/completions", body).json()
        plain = post(server, "/v1/completions", dict(body, suffixspec={"budget": 0})).json()
        assert spec["choices"][0]["text"] == plain["choices"][0]["text"], (params, sampling)
        a = spec["choices"][0]["logprobs"]["token_logprobs"]
        b = plain["choices"][0]["logprobs"]["token_logprobs"]
        assert np.max(np.abs(np.array(a) - np.array(b))) < 1e-4
    if "min_tokens" in params:
        assert spec["usage"]["completion_tokens"] >= 10


# ----------------------------------------------------------------------------------- structured output


def random_schema(rng) -> dict:
    """A small random object schema whose answers are bounded (short strings, small integers, enums)."""
    props = {}
    for i in range(int(rng.integers(1, 4))):
        kind = rng.choice(["string", "integer", "boolean", "enum", "array"])
        if kind == "string":
            props[f"k{i}"] = {"type": "string", "maxLength": 5}
        elif kind == "integer":
            props[f"k{i}"] = {"type": "integer", "minimum": 0, "maximum": 99}
        elif kind == "boolean":
            props[f"k{i}"] = {"type": "boolean"}
        elif kind == "enum":
            props[f"k{i}"] = {"enum": ["red", "green", 3]}
        else:
            props[f"k{i}"] = {"type": "array", "items": {"type": "integer", "maximum": 9, "minimum": 0}, "maxItems": 3}
    return {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}


def test_schema_constrained_answers_always_parse_and_validate(served):
    server, _, _ = served
    rng = np.random.default_rng(0)
    finished = 0
    for trial in range(12):
        schema = random_schema(rng)
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{trial}", "schema": schema, "strict": True}}
        for budget in (0, "auto"):
            r = post(server, "/v1/chat/completions", {"model": "tiny", "messages": CHAT, "max_tokens": 80,
                                                      "temperature": 0.8 if trial % 2 else 0, "seed": trial,
                                                      "response_format": fmt, "suffixspec": {"budget": budget}})
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            if choice["finish_reason"] == "length":
                continue
            finished += 1
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    assert finished >= 12
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 40, "temperature": 0,
                                         "response_format": {"type": "json_object"}})
    text = r.json()["choices"][0]
    assert text["finish_reason"] == "length" or isinstance(json.loads(text["text"]), dict)


def test_serving_doc_lists_every_field():
    """docs/serving.md names every field the server implements, ignores or refuses."""
    from pathlib import Path

    from suffixspec.http import protocol

    doc = (Path(__file__).resolve().parent.parent / "docs" / "serving.md").read_text()
    fields = (protocol.COMMON_FIELDS | protocol.COMPLETION_FIELDS | protocol.CHAT_FIELDS | protocol.IGNORED
              | set(protocol.REFUSED)) - {"suffixspec"}
    missing = sorted(f for f in fields if f"`{f}`" not in doc)
    assert not missing, f"docs/serving.md does not name {missing}"
    assert "`suffixspec.budget`" in doc and "`suffixspec.filter`" in doc
